"""Django admin: browse instances, their history, commands, queues, timers, tasks and branches.

Everything here is read-only. The rows are the engine's state and logs:
changing them by hand would break invariants the engine relies on (dense
history sequences, command states and the open-signal counter, timer rows
linked to their commands). Changes go through the API (``start``,
``signal``, ``cancel``, ...), which takes the execution lock and records
history. Staff users need the ``view`` permission of a model to see it.

Not registered: the four models with a composite primary key
(``WorkflowDedup``, ``WorkflowJoinState``, ``WorkflowDefinition``,
``WorkflowDefinitionActivation``). Django (5.2 up to 6.1 at least) refuses
to register such a model with the admin (``AdminSite.register`` raises
``ImproperlyConfigured``); see docs/execution.md.

Query cost: list filters on status-like columns offer the fixed values of
the model's choices (no ``SELECT DISTINCT`` over a large table), a search
term that is a UUID is an equality on the indexed id columns, list pages
skip the unfiltered total count and the filter facet counts, the commands
list joins its instance in the same query, and an instance's page shows
only the latest rows of its history and commands (with links to all).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Model, Q, QuerySet, TextChoices
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from .models import (
    BranchStatus,
    CommandKind,
    CommandState,
    InstanceStatus,
    TaskStatus,
    TimerPurpose,
    TimerStatus,
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)

# Rows an instance's page shows in each inline (the latest ones); the links
# on the page open the full, filtered lists.
INLINE_ROWS = 100
LAST_ERROR_PREVIEW = 120


# -- helpers -------------------------------------------------------------------


def admin_url(model: type[Model], view: str, *args: Any) -> str:
    opts = model._meta
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[quote(str(a)) for a in args]
    )


def filtered_changelist_url(model: type[Model], **params: Any) -> str:
    return admin_url(model, "changelist") + "?" + urlencode({k: str(v) for k, v in params.items()})


def instance_link(workflow_id: Any, label: Any = None) -> str:
    if workflow_id is None:
        return "-"
    return format_html(
        '<a href="{}">{}</a>',
        admin_url(WorkflowInstance, "change", workflow_id),
        label if label is not None else workflow_id,
    )


def command_link(command_id: Any) -> str:
    if command_id is None:
        return "-"
    return format_html(
        '<a href="{}">{}</a>', admin_url(WorkflowCommand, "change", command_id), command_id
    )


def pretty_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre style="margin:0;white-space:pre-wrap">{}</pre>', text)


def actor_text(row: Any) -> str:
    """``USER ann`` (``ASSERTED``), ``SYSTEM`` ..., or ``-`` when no actor was recorded."""
    if not row.actor_kind:
        return "-"
    parts = [row.actor_kind, row.actor_id or ""]
    if row.on_behalf_of:
        parts.append(f"for {row.on_behalf_of}")
    text = " ".join(p for p in parts if p)
    if row.attribution_status:
        text += f" ({row.attribution_status})"
    return text


def choices_filter(
    field: str, choices: type[TextChoices], title: str | None = None
) -> type[admin.SimpleListFilter]:
    """A list filter offering the fixed values of ``choices`` (no query to build it)."""

    class ChoicesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
            return [(value, value) for value in choices.values]

        def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
            value = self.value()
            return queryset.filter(**{field: value}) if value else queryset

    ChoicesFilter.title = title or field.replace("_", " ")
    ChoicesFilter.__name__ = ChoicesFilter.__qualname__ = f"{choices.__name__}Filter"
    return ChoicesFilter


class LatestRowsFormSet(BaseInlineFormSet):
    """An inline formset that holds only the latest ``limit`` rows, in ``order_field`` order."""

    order_field = "pk"
    limit = INLINE_ROWS

    def get_queryset(self) -> QuerySet:
        if not getattr(self, "_latest_only", False):
            rows = super().get_queryset()
            latest = rows.order_by(f"-{self.order_field}").values("pk")[: self.limit]
            self._queryset = rows.filter(pk__in=latest).order_by(self.order_field)
            self._latest_only = True
        return self._queryset


def latest_rows_formset(order_field: str) -> type[LatestRowsFormSet]:
    return type(
        f"Latest{order_field.title()}FormSet", (LatestRowsFormSet,), {"order_field": order_field}
    )


# -- base classes --------------------------------------------------------------


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete: the rows are browsed, never edited here.

    Searching: a term that is a UUID matches ``uuid_search_fields`` exactly
    (an indexed equality, no cast to text); every term also matches
    ``text_search_fields`` case-insensitively.
    """

    actions = None
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are one count query per filter value
    uuid_search_fields: tuple[str, ...] = ()
    text_search_fields: tuple[str, ...] = ()

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        return (*self.uuid_search_fields, *self.text_search_fields)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        conditions = [Q(**{f"{field}__icontains": term}) for field in self.text_search_fields]
        try:
            value = uuid.UUID(term)
        except ValueError:
            value = None
        if value is not None:
            conditions += [Q(**{field: value}) for field in self.uuid_search_fields]
        if not conditions:
            return queryset.none(), False
        condition = conditions[0]
        for other in conditions[1:]:
            condition |= other
        return queryset.filter(condition), False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# -- instances -----------------------------------------------------------------


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
class WorkflowInstanceAdmin(ReadOnlyAdmin):
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


# -- the logs: history, commands, queues -----------------------------------------


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


# -- timers, tasks, branches -----------------------------------------------------


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
class WorkflowTaskAdmin(ReadOnlyAdmin):
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
