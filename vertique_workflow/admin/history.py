"""The history's admin: every entry of every instance, read-only."""

from __future__ import annotations

from django.contrib import admin

from ..models import WorkflowHistory
from .common import ReadOnlyAdmin, actor_text, command_link, instance_link, pretty_json


@admin.register(WorkflowHistory)
class WorkflowHistoryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "workflow_link",
        "sequence",
        "event_type",
        "step_id",
        "outcome",
        "actor",
        "command",
        "created_at",
    )
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "workflow_link",
                    "sequence",
                    "event_type",
                    "step_id",
                    "outcome",
                    "created_at",
                    "entry_version",
                )
            },
        ),
        ("Content", {"fields": ("payload", "patch")}),
        (
            "Decision log",
            {
                "fields": (
                    "state_version_before",
                    "state_version_after",
                    "definition_scope_key",
                    "definition_id",
                    "definition_version",
                    "plan_hash",
                )
            },
        ),
        ("Attribution", {"fields": ("actor", "command", "executor_id")}),
    )
    readonly_fields = ("workflow_link", "payload", "patch", "actor", "command")

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowHistory) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="command", ordering="command_id")
    def command(self, obj: WorkflowHistory) -> str:
        return command_link(obj.command_id)

    @admin.display(description="actor")
    def actor(self, obj: WorkflowHistory) -> str:
        return actor_text(obj)

    @admin.display(description="payload")
    def payload(self, obj: WorkflowHistory) -> str:
        return pretty_json(obj.payload_json)

    @admin.display(description="patch (RFC 6902)")
    def patch(self, obj: WorkflowHistory) -> str:
        return pretty_json(obj.patch_json)
