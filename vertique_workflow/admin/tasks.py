"""Timers, tasks and branch tokens in the admin, read-only."""

from __future__ import annotations

from django.contrib import admin

from ..models import (
    BranchStatus,
    TaskStatus,
    TimerPurpose,
    TimerStatus,
    WorkflowBranchToken,
    WorkflowTask,
    WorkflowTimer,
)
from .actions import TaskActions
from .common import (
    ReadOnlyAdmin,
    choices_filter,
    command_link,
    instance_link,
    json_preview,
    json_view_url,
    ms_display,
)
from .instances import ScopeFilter


@admin.register(WorkflowTimer)
class WorkflowTimerAdmin(ReadOnlyAdmin):
    json_fields = ("metadata",)
    fire_at_ms = ms_display("fire_at", "fire at")
    created_at_ms = ms_display("created_at", "created")
    updated_at_ms = ms_display("updated_at", "updated")
    list_display = ("id", "workflow_link", "step_id", "purpose", "status", "fire_at_ms", "command")
    list_filter = (choices_filter("status", TimerStatus), choices_filter("purpose", TimerPurpose))
    uuid_search_fields = ("id", "workflow_id", "task_id")
    search_help_text = "A timer, instance or task id (exact)."
    readonly_fields = (
        "workflow_link",
        "command",
        "durable_metadata",
        "fire_at_ms",
        "created_at_ms",
        "updated_at_ms",
    )
    fields = (
        "id",
        "workflow_link",
        "step_id",
        "purpose",
        "status",
        "fire_at_ms",
        "command",
        "task_id",
        "branch_token_id",
        "fork_step_id",
        "branch_id",
        "delayed_job_execution_id",
        "durable_metadata",
        "created_at_ms",
        "updated_at_ms",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowTimer) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="command", ordering="command_id")
    def command(self, obj: WorkflowTimer) -> str:
        return command_link(obj.command_id)

    @admin.display(description="metadata")
    def durable_metadata(self, obj: WorkflowTimer) -> str:
        return json_preview(obj, "metadata", json_view_url(type(obj), "metadata", obj.pk))


@admin.register(WorkflowTask)
class WorkflowTaskAdmin(TaskActions, ReadOnlyAdmin):
    json_fields = ("candidates_json", "decisions_snapshot_json", "result_json")
    due_at_ms = ms_display("due_at", "due")
    created_at_ms = ms_display("created_at", "created")
    updated_at_ms = ms_display("updated_at", "updated")
    completed_at_ms = ms_display("completed_at", "completed")
    list_display = (
        "id",
        "workflow_link",
        "step_id",
        "name",
        "status",
        "assignee",
        "due_at_ms",
        "scope_key",
        "updated_at_ms",
    )
    list_filter = (choices_filter("status", TaskStatus), ScopeFilter)
    ordering = ("-updated_at", "id")
    uuid_search_fields = ("id", "workflow_id")
    text_search_fields = ("name", "assignee")
    search_help_text = "A task or instance id (exact), or part of a task name or assignee."
    readonly_fields = (
        "workflow_link",
        "candidates",
        "decisions_snapshot",
        "result",
        "reservation",
        "due_at_ms",
        "created_at_ms",
        "updated_at_ms",
        "completed_at_ms",
    )
    fields = (
        "id",
        "workflow_link",
        "step_id",
        "name",
        "status",
        "assignee",
        "candidates",
        "decisions_snapshot",
        "decision",
        "result",
        "due_at_ms",
        "require_version_stability",
        "reservation",
        "branch_token_id",
        "fork_step_id",
        "branch_id",
        "scope_key",
        "version",
        "created_at_ms",
        "updated_at_ms",
        "completed_at_ms",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowTask) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="candidates")
    def candidates(self, obj: WorkflowTask) -> str:
        return json_preview(
            obj, "candidates_json", json_view_url(type(obj), "candidates_json", obj.pk)
        )

    @admin.display(description="decisions")
    def decisions_snapshot(self, obj: WorkflowTask) -> str:
        return json_preview(
            obj,
            "decisions_snapshot_json",
            json_view_url(type(obj), "decisions_snapshot_json", obj.pk),
        )

    @admin.display(description="result")
    def result(self, obj: WorkflowTask) -> str:
        return json_preview(obj, "result_json", json_view_url(type(obj), "result_json", obj.pk))

    @admin.display(description="reservation command")
    def reservation(self, obj: WorkflowTask) -> str:
        return command_link(obj.reservation_command_id)


@admin.register(WorkflowBranchToken)
class WorkflowBranchTokenAdmin(ReadOnlyAdmin):
    json_fields = ("state_json", "metadata")
    retry_at_ms = ms_display("retry_at", "retry at")
    created_at_ms = ms_display("created_at", "created")
    updated_at_ms = ms_display("updated_at", "updated")
    list_display = (
        "id",
        "workflow_link",
        "fork_step_id",
        "branch_id",
        "status",
        "current_step_id",
        "attempts",
        "updated_at_ms",
    )
    list_filter = (choices_filter("status", BranchStatus),)
    uuid_search_fields = ("id", "workflow_id")
    search_help_text = "A branch token or instance id (exact)."
    readonly_fields = (
        "workflow_link",
        "state",
        "durable_metadata",
        "retry_at_ms",
        "created_at_ms",
        "updated_at_ms",
    )
    fields = (
        "id",
        "workflow_link",
        "fork_step_id",
        "branch_id",
        "status",
        "current_step_id",
        "state",
        "retry_at_ms",
        "attempts",
        "durable_metadata",
        "created_at_ms",
        "updated_at_ms",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowBranchToken) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="state")
    def state(self, obj: WorkflowBranchToken) -> str:
        return json_preview(obj, "state_json", json_view_url(type(obj), "state_json", obj.pk))

    @admin.display(description="metadata")
    def durable_metadata(self, obj: WorkflowBranchToken) -> str:
        return json_preview(obj, "metadata", json_view_url(type(obj), "metadata", obj.pk))
