"""The instances' admin: the list and an instance's page (its history and commands inline)."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from ..models import (
    InstanceStatus,
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)
from .actions import InstanceActions
from .common import (
    INLINE_ROWS,
    ReadOnlyAdmin,
    ReadOnlyInline,
    actor_text,
    choices_filter,
    filtered_changelist_url,
    latest_rows_formset,
    pretty_json,
)


class HistoryInline(ReadOnlyInline):
    model = WorkflowHistory
    formset = latest_rows_formset("sequence")
    fields = readonly_fields = (
        "sequence",
        "event_type",
        "step_id",
        "outcome",
        "patch",
        "actor",
        "created_at",
    )
    verbose_name = "history entry"
    verbose_name_plural = f"history (the latest {INLINE_ROWS} entries)"

    @admin.display(description="patch")
    def patch(self, obj: WorkflowHistory) -> str:
        return pretty_json(obj.patch_json)

    @admin.display(description="actor")
    def actor(self, obj: WorkflowHistory) -> str:
        return actor_text(obj)


class CommandInline(ReadOnlyInline):
    model = WorkflowCommand
    formset = latest_rows_formset("seq")
    fields = readonly_fields = (
        "seq",
        "kind",
        "state",
        "attempts",
        "available_at",
        "claimed_by",
        "last_error",
    )
    verbose_name = "command"
    verbose_name_plural = f"commands (the latest {INLINE_ROWS})"


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(InstanceActions, ReadOnlyAdmin):
    list_display = (
        "id",
        "definition_id",
        "definition_version",
        "status",
        "current_step_id",
        "business_key",
        "scope_key",
        "updated_at",
    )
    list_filter = (choices_filter("status", InstanceStatus), "definition_id", "scope_key")
    # (scope_key, updated_at DESC, id) is an index: a scope filter reads it in order
    ordering = ("-updated_at", "id")
    uuid_search_fields = ("id",)
    text_search_fields = ("business_key",)
    search_help_text = "An instance id (exact) or part of a business key."
    inlines = (CommandInline, HistoryInline)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "status",
                    "current_step_id",
                    "business_key",
                    "scope_key",
                    "version",
                    "related",
                )
            },
        ),
        (
            "Definition pin",
            {
                "fields": (
                    "definition_scope_key",
                    "definition_id",
                    "definition_version",
                    "plan_hash",
                )
            },
        ),
        ("State", {"fields": ("state", "subject", "durable_metadata")}),
        ("Error", {"fields": ("error_type", "error_message")}),
        (
            "Times",
            {
                "fields": (
                    "created_at",
                    "updated_at",
                    "completed_at",
                    "archived_at",
                    "baseline_logged",
                )
            },
        ),
    )
    readonly_fields = (
        "related",
        "state",
        "subject",
        "durable_metadata",
    )

    @admin.display(description="state")
    def state(self, obj: WorkflowInstance) -> str:
        return pretty_json(obj.state_json)

    @admin.display(description="subject")
    def subject(self, obj: WorkflowInstance) -> str:
        return pretty_json(obj.subject_json)

    @admin.display(description="metadata")
    def durable_metadata(self, obj: WorkflowInstance) -> str:
        return pretty_json(obj.metadata)

    @admin.display(description="related rows")
    def related(self, obj: WorkflowInstance) -> str:
        history = WorkflowHistory.objects.filter(workflow_id=obj.id).count()
        commands = WorkflowCommand.objects.filter(workflow_id=obj.id).count()
        return format_html(
            '<a href="{}">all {} history entries</a> · <a href="{}">all {} commands</a> · '
            '<a href="{}">timers</a> · <a href="{}">tasks</a> · <a href="{}">branches</a>',
            filtered_changelist_url(WorkflowHistory, workflow_id__exact=obj.id),
            history,
            filtered_changelist_url(WorkflowCommand, workflow_id__exact=obj.id),
            commands,
            filtered_changelist_url(WorkflowTimer, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowTask, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowBranchToken, workflow_id__exact=obj.id),
        )
