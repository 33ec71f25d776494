from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "tests.flows"
    label = "flows"
    default_auto_field = "django.db.models.BigAutoField"
