"""AppConfig: system checks, and discovery of the workflows of installed apps."""

from __future__ import annotations

from django.apps import AppConfig


class VertiqueWorkflowConfig(AppConfig):
    name = "vertique_workflow"
    label = "vertique_workflow"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .definitions import autodiscover

        # Import every installed app's workflows.py now: a broken plan fails
        # at startup with WorkflowDefinitionError naming workflow and step.
        autodiscover()
