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
from .common import ReadOnlyAdmin, choices_filter, command_link, instance_link, pretty_json


@admin.register(WorkflowTimer)
class WorkflowTimerAdmin(ReadOnlyAdmin):
    list_display = ("id", "workflow_link", "step_id", "purpose", "status", "fire_at", "command")
    list_filter = (choices_filter("status", TimerStatus), choices_filter("purpose", TimerPurpose))
    uuid_search_fields = ("id", "workflow_id", "task_id")
    search_help_text = "A timer, instance or task id (exact)."
    readonly_fields = ("workflow_link", "command", "durable_metadata")
    fields = (
        "id",
        "workflow_link",
        "step_id",
        "purpose",
        "status",
        "fire_at",
        "command",
        "task_id",
        "branch_token_id",
        "fork_step_id",
        "branch_id",
        "delayed_job_execution_id",
        "durable_metadata",
        "created_at",
        "updated_at",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowTimer) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="command", ordering="command_id")
    def command(self, obj: WorkflowTimer) -> str:
        return command_link(obj.command_id)

    @admin.display(description="metadata")
    def durable_metadata(self, obj: WorkflowTimer) -> str:
        return pretty_json(obj.metadata)


@admin.register(WorkflowTask)
class WorkflowTaskAdmin(TaskActions, ReadOnlyAdmin):
    list_display = (
        "id",
        "workflow_link",
        "step_id",
        "name",
        "status",
        "assignee",
        "due_at",
        "scope_key",
        "updated_at",
    )
    list_filter = (choices_filter("status", TaskStatus), "scope_key")
    ordering = ("-updated_at", "id")
    uuid_search_fields = ("id", "workflow_id")
    text_search_fields = ("name", "assignee")
    search_help_text = "A task or instance id (exact), or part of a task name or assignee."
    readonly_fields = ("workflow_link", "candidates", "decisions_snapshot", "result", "reservation")
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
        "due_at",
        "require_version_stability",
        "reservation",
        "branch_token_id",
        "fork_step_id",
        "branch_id",
        "scope_key",
        "version",
        "created_at",
        "updated_at",
        "completed_at",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowTask) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="candidates")
    def candidates(self, obj: WorkflowTask) -> str:
        return pretty_json(obj.candidates_json)

    @admin.display(description="decisions")
    def decisions_snapshot(self, obj: WorkflowTask) -> str:
        return pretty_json(obj.decisions_snapshot_json)

    @admin.display(description="result")
    def result(self, obj: WorkflowTask) -> str:
        return pretty_json(obj.result_json)

    @admin.display(description="reservation command")
    def reservation(self, obj: WorkflowTask) -> str:
        return command_link(obj.reservation_command_id)


@admin.register(WorkflowBranchToken)
class WorkflowBranchTokenAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "workflow_link",
        "fork_step_id",
        "branch_id",
        "status",
        "current_step_id",
        "attempts",
        "updated_at",
    )
    list_filter = (choices_filter("status", BranchStatus),)
    uuid_search_fields = ("id", "workflow_id")
    search_help_text = "A branch token or instance id (exact)."
    readonly_fields = ("workflow_link", "state", "durable_metadata")
    fields = (
        "id",
        "workflow_link",
        "fork_step_id",
        "branch_id",
        "status",
        "current_step_id",
        "state",
        "retry_at",
        "attempts",
        "durable_metadata",
        "created_at",
        "updated_at",
    )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowBranchToken) -> str:
        return instance_link(obj.workflow_id)

    @admin.display(description="state")
    def state(self, obj: WorkflowBranchToken) -> str:
        return pretty_json(obj.state_json)

    @admin.display(description="metadata")
    def durable_metadata(self, obj: WorkflowBranchToken) -> str:
        return pretty_json(obj.metadata)
