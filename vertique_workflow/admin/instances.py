"""The instances' admin: the list (what each instance waits for) and the instance page.

The list reads one page of instances and then, for the whole page, what
they wait for and whether they need attention (:mod:`.facts`, one query per
kind); it never counts rows. Ordering is by ``updated_at`` only: with a
scope or status filter an index serves it; the unfiltered list is a top-N
sort of one index-free scan (see docs/admin.md).

The instance page is the operator's view of one instance: its state, the
diagram of its pinned plan, the history as a timeline (choosing an entry,
``?at=SEQ``, shows the state right after it and where the instance stood
then), the command log, open tasks, timers, branches and children. Every
part is a bounded read: the page costs the same queries for 50 or 100,000
history entries. ``workflow_actions`` (a context slot and a template block)
is where the actions are placed.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet, UUIDField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from ..exceptions import WorkflowError
from ..models import (
    InstanceStatus,
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowDefinition,
    WorkflowDefinitionActivation,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowServiceCall,
    WorkflowTask,
    WorkflowTimer,
)
from ..operations import state_at
from . import actions
from .actions import InstanceActions
from .common import (
    NoCountChangeList,
    ReadOnlyAdmin,
    admin_url,
    choices_filter,
    command_link,
    filtered_changelist_url,
    instance_link,
    json_display,
    json_preview,
    json_view_url,
    ms,
    ms_display,
    python_json,
    with_json_previews,
)
from .describe import entry_actor, entry_label, with_entry_details
from .diagrams import instance_svg
from .facts import LIVE_BRANCH, OPEN_TASK, Facts, exists_condition, page_facts

# Rows of each part of the instance page (the latest ones; links open the lists).
TIMELINE_ROWS = 100
COMMAND_ROWS = 100
SIDE_ROWS = 100


# -- list filters ------------------------------------------------------------------


class DefinitionFilter(admin.SimpleListFilter):
    """The definition ids of the registry (a small table), not a DISTINCT over instances."""

    title = "definition"
    parameter_name = "definition_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        ids = WorkflowDefinition.objects.order_by("definition_id").values_list(
            "definition_id", flat=True
        )
        return [(value, value) for value in ids.distinct()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(definition_id=self.value()) if self.value() else queryset


class VersionFilter(admin.SimpleListFilter):
    title = "definition version"
    parameter_name = "definition_version"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        rows = WorkflowDefinition.objects.all()
        chosen = request.GET.get("definition_id")
        if chosen:
            rows = rows.filter(definition_id=chosen)
        versions = rows.order_by("definition_version").values_list("definition_version", flat=True)
        return [(str(v), f"v{v}") for v in versions.distinct()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        try:
            return queryset.filter(definition_version=int(value))
        except ValueError:
            return queryset.none()


class ScopeFilter(admin.SimpleListFilter):
    """Scopes named by the registry and activations (small tables); any scope via the URL."""

    title = "scope"
    parameter_name = "scope_key"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        scopes = {"default"}
        scopes.update(WorkflowDefinition.objects.values_list("scope_key", flat=True).distinct())
        scopes.update(
            WorkflowDefinitionActivation.objects.values_list("scope_key", flat=True).distinct()
        )
        return [(scope, scope) for scope in sorted(scopes)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(scope_key=self.value()) if self.value() else queryset


class WaitingForFilter(admin.SimpleListFilter):
    title = "waiting for"
    parameter_name = "waiting_for"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("signal", "a signal"),
            ("task", "a task"),
            ("timer", "a timer"),
            ("branches", "branches"),
            ("parked", "has parked signals"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value not in {key for key, _ in self.lookup_choices}:
            return queryset
        return queryset.filter(exists_condition(value))


class AttentionFilter(admin.SimpleListFilter):
    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("attention", "any reason"),
            ("failed", "FAILED"),
            ("dead", "dead letters"),
            ("stuck", "stuck commands"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value not in {key for key, _ in self.lookup_choices}:
            return queryset
        return queryset.filter(exists_condition(value))


class InstanceChangeList(NoCountChangeList):
    """After reading a page, read what its instances wait for (a few queries per page)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        facts = page_facts(rows)
        for row in rows:
            row._facts = facts[row.pk]
        self.result_list = rows


def facts_of(obj: Any) -> Facts:
    return getattr(obj, "_facts", None) or Facts()


# -- the admin -----------------------------------------------------------------------


@admin.register(WorkflowInstance)
class WorkflowInstanceAdmin(InstanceActions, ReadOnlyAdmin):
    list_display = (
        "id_link",
        "status_text",
        "definition",
        "scope_key",
        "business_key",
        "current_steps",
        "waiting_for",
        "created_at_ms",
        "updated_at_ms",
        "last_failure",
        "attention",
    )
    list_display_links = None
    list_filter = (
        choices_filter("status", InstanceStatus),
        AttentionFilter,
        WaitingForFilter,
        DefinitionFilter,
        VersionFilter,
        ScopeFilter,
        ("created_at", admin.DateFieldListFilter),
        ("updated_at", admin.DateFieldListFilter),
    )
    # (scope_key, updated_at DESC, id) and (status, updated_at) are indexes:
    # a scope or status filter reads the page in index order
    ordering = ("-updated_at", "id")
    sortable_by = ("updated_at_ms",)
    uuid_search_fields = ("id",)
    search_help_text = "An instance id or a business key (exact); end the key with * for a prefix."
    json_fields = ("state_json", "subject_json", "metadata")
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
                    "definition_link",
                    "plan_hash",
                )
            },
        ),
        ("Error", {"fields": ("error_type", "error_text")}),
        (
            "Times",
            {
                "fields": (
                    "created_at_ms",
                    "updated_at_ms",
                    "completed_at_ms",
                    "archived_at_ms",
                    "baseline_logged",
                )
            },
        ),
    )
    readonly_fields = (
        "related",
        "definition_link",
        "error_text",
        "created_at_ms",
        "updated_at_ms",
        "completed_at_ms",
        "archived_at_ms",
        "state_json_view",
        "subject_json_view",
        "metadata_view",
    )
    change_form_template = "admin/vertique_workflow/workflowinstance/change_form.html"
    change_list_template = "admin/vertique_workflow/workflowinstance/change_list.html"

    created_at_ms = ms_display("created_at", "created")
    updated_at_ms = ms_display("updated_at", "updated")
    completed_at_ms = ms_display("completed_at", "completed")
    archived_at_ms = ms_display("archived_at", "archived")
    state_json_view = json_display("state_json", "state")
    subject_json_view = json_display("subject_json", "subject")
    metadata_view = json_display("metadata", "metadata")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return InstanceChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """An id, or a business key: exact (indexed), or a prefix when it ends with ``*``."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(id=uuid.UUID(term)), False
        except ValueError:
            pass
        if term.endswith("*") and term.rstrip("*"):
            return queryset.filter(business_key__startswith=term.rstrip("*")), False
        return queryset.filter(business_key=term), False

    # -- list columns ---------------------------------------------------------------

    @admin.display(description="id")
    def id_link(self, obj: WorkflowInstance) -> str:
        return format_html(
            '<a class="wf-nowrap" href="{}">{}</a>',
            admin_url(WorkflowInstance, "change", obj.pk),
            obj.pk,
        )

    @admin.display(description="status")
    def status_text(self, obj: WorkflowInstance) -> str:
        return obj.status

    @admin.display(description="definition")
    def definition(self, obj: WorkflowInstance) -> str:
        return f"{obj.definition_id} v{obj.definition_version}"

    @admin.display(description="current step(s)")
    def current_steps(self, obj: WorkflowInstance) -> str:
        steps = [obj.current_step_id] if obj.current_step_id else []
        steps += sorted(facts_of(obj).branch_steps - set(steps))
        return ", ".join(steps) or "-"

    @admin.display(description="waiting for")
    def waiting_for(self, obj: WorkflowInstance) -> str:
        found = facts_of(obj).waiting_for()
        return format_html_join("", "<div>{}</div>", ((item,) for item in found)) or "-"

    @admin.display(description="last failure")
    def last_failure(self, obj: WorkflowInstance) -> str:
        facts = facts_of(obj)
        if obj.status == "FAILED" and (obj.error_type or obj.error_message):
            text = f"{obj.error_type or ''}: {(obj.error_message or '')[:300]}"
        elif facts.dead_error:
            text = facts.dead_error
        else:
            return "-"
        return format_html('<span class="wf-error">{}</span>', text)

    @admin.display(description="needs attention")
    def attention(self, obj: WorkflowInstance) -> str:
        reasons = facts_of(obj).attention(obj.status)
        if not reasons:
            return "-"
        return format_html('<span class="wf-attention">{}</span>', ", ".join(reasons))

    # -- page fields ----------------------------------------------------------------

    @admin.display(description="definition")
    def definition_link(self, obj: WorkflowInstance) -> str:
        url = reverse(
            "admin:vertique_workflow_definition",
            args=[obj.definition_scope_key, obj.definition_id, obj.definition_version],
        )
        return format_html(
            '<a href="{}">{} v{}</a>', url, obj.definition_id, obj.definition_version
        )

    @admin.display(description="error message")
    def error_text(self, obj: WorkflowInstance) -> str:
        if not obj.error_message:
            return "-"
        return format_html('<pre class="wf-error">{}</pre>', obj.error_message)

    @admin.display(description="all rows")
    def related(self, obj: WorkflowInstance) -> str:
        return format_html(
            '<a href="{}">history</a> · <a href="{}">commands</a> · <a href="{}">timers</a> · '
            '<a href="{}">tasks</a> · <a href="{}">branches</a> · <a href="{}">dedup keys</a> · '
            '<a href="{}">join states</a>',
            filtered_changelist_url(WorkflowHistory, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowCommand, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowTimer, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowTask, workflow_id__exact=obj.id),
            filtered_changelist_url(WorkflowBranchToken, workflow_id__exact=obj.id),
            reverse("admin:vertique_workflow_dedup") + "?" + urlencode({"workflow_id": obj.id}),
            reverse("admin:vertique_workflow_join_states")
            + "?"
            + urlencode({"workflow_id": obj.id}),
        )

    # -- the page ---------------------------------------------------------------------

    def workflow_actions(self, request: HttpRequest, obj: WorkflowInstance | None) -> str:
        """HTML of the actions on an instance's page or the list (``obj`` None): see .actions."""
        return actions.workflow_actions(request, obj)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        context = {
            "workflow_actions": self.workflow_actions(request, None),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            context.update(instance_page(request, obj))
            context["workflow_actions"] = self.workflow_actions(request, obj)
            context["state_view"] = self.state_json_view(obj)
            context["subject_view"] = self.subject_json_view(obj)
            context["metadata_view"] = self.metadata_view(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)


def _int_param(request: HttpRequest, name: str) -> int | None:
    try:
        value = int(request.GET.get(name, ""))
    except ValueError:
        return None
    return value if value >= 1 else None


def timeline(obj: WorkflowInstance, start: int | None, at: int | None) -> dict[str, Any]:
    """A page of history entries (one query): the latest, or from ``start``, or around ``at``."""
    rows = with_entry_details(
        with_json_previews(
            WorkflowHistory.objects.filter(workflow_id=obj.pk), ("payload_json", "patch_json")
        )
    )
    if start is None and at is not None:
        start = max(1, at - TIMELINE_ROWS // 2)
    if start is None:
        page = list(rows.order_by("-sequence")[: TIMELINE_ROWS + 1])
        has_earlier = len(page) > TIMELINE_ROWS
        page = page[:TIMELINE_ROWS][::-1]
        has_later = False
    else:
        page = list(rows.filter(sequence__gte=start).order_by("sequence")[: TIMELINE_ROWS + 1])
        has_later = len(page) > TIMELINE_ROWS
        page = page[:TIMELINE_ROWS]
        has_earlier = start > 1
    entries = []
    for entry in page:
        who, behalf = entry_actor(entry)
        entries.append(
            {
                "sequence": entry.sequence,
                "time": ms(entry.created_at),
                "label": entry_label(entry),
                "event_type": entry.event_type,
                "step": entry.step_id or "",
                "actor": who,
                "on_behalf": behalf if behalf not in ("", "-") else "",
                "command": command_link(entry.command_id) if entry.command_id else "",
                "patch": json_preview(
                    entry, "patch_json", json_view_url(WorkflowHistory, "patch_json", entry.pk)
                )
                if entry._length_patch_json is not None
                else "",
                "payload": json_preview(
                    entry, "payload_json", json_view_url(WorkflowHistory, "payload_json", entry.pk)
                ),
                "selected": entry.sequence == at,
                "decision_log": entry.entry_version == 2,
            }
        )
    first = page[0].sequence if page else 1
    last = page[-1].sequence if page else 0
    return {
        "entries": entries,
        "earlier": max(1, first - TIMELINE_ROWS) if has_earlier and page else None,
        "later": last + 1 if has_later else None,
        "paged": start is not None,
    }


def instance_page(request: HttpRequest, obj: WorkflowInstance) -> dict[str, Any]:
    """The parts of the instance page below its fields (each a bounded read)."""
    at = _int_param(request, "at")
    start = _int_param(request, "from")
    context: dict[str, Any] = {"timeline": timeline(obj, start, at), "at": at}
    svg, why = instance_svg(obj.pk, upto_sequence=at)
    context.update(diagram=svg, diagram_missing=why)
    if at is not None:
        try:
            past = state_at(obj.pk, at)
            context["state_at"] = python_json(
                past, reverse("admin:vertique_workflow_state_at", args=[obj.pk, at])
            )
        except WorkflowError as exc:
            context["state_at_missing"] = str(exc)
    commands = list(
        with_json_previews(WorkflowCommand.objects.filter(workflow_id=obj.pk), ("payload_json",))
        .defer("target_json", "context_json", "explicit_carrier_json")
        .order_by("-seq")[:COMMAND_ROWS]
    )[::-1]
    context["commands"] = [
        {
            "link": command_link(c.pk),
            "seq": c.seq,
            "kind": c.kind,
            "state": c.state,
            "attempts": c.attempts,
            "available": ms(c.available_at),
            "lease": f"{c.claimed_by or ''} until {ms(c.lease_until)}" if c.lease_until else "",
            "settled": ms(c.settled_at) if c.settled_at else "",
            "payload": json_preview(
                c, "payload_json", json_view_url(WorkflowCommand, "payload_json", c.pk)
            ),
            "last_error": c.last_error or "",
        }
        for c in commands
    ]
    context["tasks"] = [
        {
            "link": format_html(
                '<a href="{}">{}</a>', admin_url(WorkflowTask, "change", t.pk), t.name
            ),
            "step": t.step_id,
            "status": t.status,
            "assignee": t.assignee or "-",
            "due": ms(t.due_at) if t.due_at else "-",
            "branch": t.branch_id or "",
            "created": ms(t.created_at),
        }
        for t in WorkflowTask.objects.filter(workflow_id=obj.pk, status__in=OPEN_TASK)
        .only("id", "name", "step_id", "status", "assignee", "due_at", "branch_id", "created_at")
        .order_by("created_at")[:SIDE_ROWS]
    ]
    context["timers"] = [
        {
            "link": format_html(
                '<a href="{}">{}</a>', admin_url(WorkflowTimer, "change", t.pk), t.purpose
            ),
            "step": t.step_id,
            "fire_at": ms(t.fire_at),
            "branch": t.branch_id or "",
            "command": command_link(t.command_id) if t.command_id else "-",
        }
        for t in WorkflowTimer.objects.filter(workflow_id=obj.pk, status="SCHEDULED")
        .only("id", "step_id", "purpose", "fire_at", "status", "branch_id", "command_id")
        .order_by("fire_at")[:SIDE_ROWS]
    ]
    branches = list(
        with_json_previews(WorkflowBranchToken.objects.filter(workflow_id=obj.pk), ("state_json",))
        .defer("metadata")
        .order_by("fork_step_id", "created_at")[:SIDE_ROWS]
    )
    context["branches"] = [
        {
            "link": format_html(
                '<a href="{}">{}</a>', admin_url(WorkflowBranchToken, "change", b.pk), b.branch_id
            ),
            "fork": b.fork_step_id.split("@")[0],
            "status": b.status,
            "live": b.status in LIVE_BRANCH,
            "step": b.current_step_id or "-",
            "attempts": b.attempts,
            "state": json_preview(
                b, "state_json", json_view_url(WorkflowBranchToken, "state_json", b.pk)
            ),
            "updated": ms(b.updated_at),
        }
        for b in branches
    ]
    child_ids = (
        WorkflowHistory.objects.filter(workflow_id=obj.pk, event_type="CHILD_STARTED")
        .annotate(child=Cast(KT("payload_json__childId"), output_field=UUIDField()))
        .values("child")
    )
    context["children"] = [
        {
            "link": instance_link(child.pk),
            "definition": f"{child.definition_id} v{child.definition_version}",
            "status": child.status,
            "step": child.current_step_id or "-",
            "updated": ms(child.updated_at),
        }
        for child in WorkflowInstance.objects.filter(id__in=child_ids)
        .only(
            "id", "definition_id", "definition_version", "status", "current_step_id", "updated_at"
        )
        .order_by("created_at", "id")[:SIDE_ROWS]
    ]
    context["service_calls"] = [
        {
            "link": format_html(
                '<a href="{}">{}</a>', admin_url(WorkflowServiceCall, "change", c.pk), c.handler
            ),
            "step": c.step_id if c.branch_id is None else f"{c.step_id} [{c.branch_id}]",
            "state": c.state,
            "attempts": c.attempts,
            "outcome": c.outcome or "-",
            "available": ms(c.available_at),
            "error": c.last_error or "",
        }
        for c in WorkflowServiceCall.objects.filter(workflow_id=obj.pk)
        .only(
            "id",
            "handler",
            "step_id",
            "branch_id",
            "state",
            "attempts",
            "outcome",
            "available_at",
            "last_error",
        )
        .order_by("-id")[:SIDE_ROWS]
    ]
    context["all_service_calls_url"] = filtered_changelist_url(
        WorkflowServiceCall, workflow_id__exact=obj.pk
    )
    context["all_tasks_url"] = filtered_changelist_url(WorkflowTask, workflow_id__exact=obj.pk)
    context["all_timers_url"] = filtered_changelist_url(WorkflowTimer, workflow_id__exact=obj.pk)
    context["all_branches_url"] = filtered_changelist_url(
        WorkflowBranchToken, workflow_id__exact=obj.pk
    )
    context["all_commands_url"] = filtered_changelist_url(
        WorkflowCommand, workflow_id__exact=obj.pk
    )
    context["all_history_url"] = filtered_changelist_url(WorkflowHistory, workflow_id__exact=obj.pk)
    context["page_url"] = admin_url(WorkflowInstance, "change", obj.pk)
    return context
