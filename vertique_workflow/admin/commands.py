"""The command log's and the command queues' admin, read-only."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from ..models import CommandKind, CommandState, WorkflowCommand, WorkflowCommandQueue
from .common import (
    LAST_ERROR_PREVIEW,
    ReadOnlyAdmin,
    actor_text,
    choices_filter,
    instance_link,
    pretty_json,
)


@admin.register(WorkflowCommand)
class WorkflowCommandAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "workflow_link",
        "seq",
        "kind",
        "state",
        "attempts",
        "available_at",
        "claimed_by",
        "last_error_preview",
    )
    list_filter = (choices_filter("state", CommandState), choices_filter("kind", CommandKind))
    list_select_related = ("workflow",)
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "workflow_link",
                    "seq",
                    "kind",
                    "state",
                    "timer_kind",
                    "timer_id",
                    "task_id",
                    "dedup_key",
                    "last_error",
                )
            },
        ),
        ("Content", {"fields": ("target", "payload")}),
        (
            "Claim",
            {
                "fields": (
                    "attempts",
                    "transient_count",
                    "deferral_count",
                    "claimed_by",
                    "claim_token",
                    "lease_until",
                )
            },
        ),
        ("Times", {"fields": ("recorded_at", "fire_at", "available_at", "settled_at")}),
        ("Attribution", {"fields": ("actor", "durable_context", "explicit_carrier")}),
    )
    readonly_fields = (
        "workflow_link",
        "target",
        "payload",
        "actor",
        "durable_context",
        "explicit_carrier",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowCommand) -> str:
        instance = obj.workflow  # joined by list_select_related on the list page
        return instance_link(obj.workflow_id, f"{instance.definition_id} {obj.workflow_id}")

    @admin.display(description="last error", ordering="last_error")
    def last_error_preview(self, obj: WorkflowCommand) -> str:
        text = obj.last_error or ""
        if len(text) <= LAST_ERROR_PREVIEW:
            return text or "-"
        return format_html('<span title="{}">{}…</span>', text, text[:LAST_ERROR_PREVIEW])

    @admin.display(description="target")
    def target(self, obj: WorkflowCommand) -> str:
        return pretty_json(obj.target_json)

    @admin.display(description="payload")
    def payload(self, obj: WorkflowCommand) -> str:
        return pretty_json(obj.payload_json)

    @admin.display(description="actor")
    def actor(self, obj: WorkflowCommand) -> str:
        return actor_text(obj)

    @admin.display(description="durable context")
    def durable_context(self, obj: WorkflowCommand) -> str:
        return pretty_json(obj.context_json)

    @admin.display(description="explicit carrier")
    def explicit_carrier(self, obj: WorkflowCommand) -> str:
        return pretty_json(obj.explicit_carrier_json)


@admin.register(WorkflowCommandQueue)
class WorkflowCommandQueueAdmin(ReadOnlyAdmin):
    list_display = ("workflow_link", "next_seq", "open_signals")
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    fields = readonly_fields = ("workflow_link", "next_seq", "open_signals")

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowCommandQueue) -> str:
        return instance_link(obj.workflow_id)
