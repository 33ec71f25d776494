"""The history's admin: every entry of every instance, read-only, labelled.

Each row says what happened (``SIGNAL_APPLIED paid``, ``DECISION_TAKEN →
ship``) and who did it (the executor for the steps it ran, on behalf of the
command's actor), to the millisecond; payloads and patches show bounded.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import WorkflowHistory
from .common import (
    ReadOnlyAdmin,
    actor_text,
    admin_url,
    choices_filter,
    command_link,
    instance_link,
    json_display,
    ms_display,
)
from .describe import entry_label, with_entry_details


@admin.register(WorkflowHistory)
class WorkflowHistoryAdmin(ReadOnlyAdmin):
    list_display = (
        "id_link",
        "workflow_link",
        "sequence",
        "created_at_ms",
        "label",
        "step_id",
        "actor",
        "command",
    )
    list_display_links = None
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    # (workflow_id, sequence) is unique: one instance's entries read in index order
    ordering = ("workflow_id", "sequence")
    sortable_by = ()
    json_fields = ("payload_json", "patch_json")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "workflow_link",
                    "sequence",
                    "label",
                    "event_type",
                    "step_id",
                    "outcome",
                    "created_at_ms",
                    "entry_version",
                )
            },
        ),
        ("Content", {"fields": ("payload_json_view", "patch_json_view")}),
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
        (
            "Attribution",
            {
                "fields": (
                    "actor",
                    "actor_kind",
                    "actor_id",
                    "actor_reason",
                    "on_behalf_of",
                    "attribution_status",
                    "executor_id",
                    "command",
                )
            },
        ),
    )
    readonly_fields = (
        "workflow_link",
        "label",
        "actor",
        "command",
        "created_at_ms",
        "payload_json_view",
        "patch_json_view",
    )
    created_at_ms = ms_display("created_at", "time")
    payload_json_view = json_display("payload_json", "payload")
    patch_json_view = json_display("patch_json", "patch (RFC 6902)")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return with_entry_details(super().get_queryset(request)).defer("payload_json", "patch_json")

    def get_list_filter(self, request: HttpRequest) -> Any:
        return (choices_filter_event(),)

    @admin.display(description="id")
    def id_link(self, obj: WorkflowHistory) -> str:
        return format_html(
            '<a class="wf-nowrap" href="{}">{}</a>',
            admin_url(WorkflowHistory, "change", obj.pk),
            obj.pk,
        )

    @admin.display(description="workflow")
    def workflow_link(self, obj: WorkflowHistory) -> str:
        return format_html('<span class="wf-nowrap">{}</span>', instance_link(obj.workflow_id))

    @admin.display(description="entry")
    def label(self, obj: WorkflowHistory) -> str:
        return entry_label(obj)

    @admin.display(description="command")
    def command(self, obj: WorkflowHistory) -> str:
        return command_link(obj.command_id)

    @admin.display(description="actor")
    def actor(self, obj: WorkflowHistory) -> str:
        return actor_text(obj)


EVENT_TYPES = (
    "WORKFLOW_STARTED",
    "STATE_BASELINE",
    "DECISION",
    "SIGNAL_APPLIED",
    "SIGNAL_PARKED",
    "TASK_COMPLETED",
    "TIMER_FIRED",
    "WORKFLOW_COMPLETED",
    "FAILED",
    "WORKFLOW_RETRIED",
    "WORKFLOW_CANCELLED",
    "COMMAND_DEAD_LETTERED",
    "COMMAND_REJECTED",
    "COMMAND_STALE",
    "COMMAND_DEFERRED",
)


def choices_filter_event() -> type[admin.SimpleListFilter]:
    """Event types as fixed values (no DISTINCT over the history table)."""

    from django.db.models import TextChoices

    events = TextChoices("EventType", [(name, name) for name in EVENT_TYPES])
    return choices_filter("event_type", events, "event type")
