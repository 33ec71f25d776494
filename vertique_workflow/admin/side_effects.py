"""Service calls (the service outbox) and workflow events in the admin, read-only.

A service call shows where its dispatch stands (PENDING with its backoff,
CLAIMED by which relay until when, DELIVERED with its outcome, CANCELLED),
how many attempts it spent and its last error -- the first place to look
when an instance waits at a service step.
"""

from __future__ import annotations

from django.contrib import admin

from ..models import ServiceCallState, WorkflowEvent, WorkflowServiceCall
from .common import ReadOnlyAdmin, choices_filter, instance_link, ms_display


@admin.register(WorkflowServiceCall)
class WorkflowServiceCallAdmin(ReadOnlyAdmin):
    json_fields = ("request_json", "policy_json", "context_json")
    available_at_ms = ms_display("available_at", "available")
    lease_until_ms = ms_display("lease_until", "lease until")
    created_at_ms = ms_display("created_at", "created")
    delivered_at_ms = ms_display("delivered_at", "delivered")
    list_display = (
        "id",
        "workflow_link",
        "step_id",
        "handler",
        "state",
        "attempts",
        "outcome",
        "available_at_ms",
        "last_error",
    )
    list_filter = (choices_filter("state", ServiceCallState),)
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    readonly_fields = (
        "workflow_link",
        "available_at_ms",
        "lease_until_ms",
        "created_at_ms",
        "delivered_at_ms",
    )
    fields = (
        "id",
        "workflow_link",
        "step_id",
        "branch_id",
        "fork_step_id",
        "handler",
        "dispatch_key",
        "state",
        "attempts",
        "outcome",
        "last_error",
        "claimed_by",
        "lease_until_ms",
        "available_at_ms",
        "request_json",
        "policy_json",
        "created_at_ms",
        "delivered_at_ms",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowServiceCall) -> str:
        return instance_link(obj.workflow_id)


@admin.register(WorkflowEvent)
class WorkflowEventAdmin(ReadOnlyAdmin):
    json_fields = ("data_json",)
    recorded_at_ms = ms_display("recorded_at", "recorded")
    list_display = ("id", "workflow_link", "event_type", "step_id", "branch_id", "recorded_at_ms")
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    readonly_fields = ("workflow_link", "recorded_at_ms")
    fields = (
        "id",
        "txid",
        "workflow_link",
        "event_type",
        "step_id",
        "fork_step_id",
        "branch_id",
        "command_id",
        "definition_id",
        "definition_version",
        "data_json",
        "recorded_at_ms",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowEvent) -> str:
        return instance_link(obj.workflow_id)
