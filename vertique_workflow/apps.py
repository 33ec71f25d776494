"""AppConfig: system checks for settings and placement."""

from __future__ import annotations

from django.apps import AppConfig


class VertiqueWorkflowConfig(AppConfig):
    name = "vertique_workflow"
    label = "vertique_workflow"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
