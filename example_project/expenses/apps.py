from django.apps import AppConfig


class ExpensesConfig(AppConfig):
    name = "expenses"
    verbose_name = "Expenses (demo)"
    default_auto_field = "django.db.models.BigAutoField"
