"""The command log's and the command queues' admin, read-only.

The list filters the states an operator looks for (DEAD, PARKED, DEFERRED)
and stuck commands (claimed under a lease that has expired, or open longer
than ``STUCK_AFTER_SECONDS``); a command's page shows its last error whole.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import CommandKind, CommandState, WorkflowCommand, WorkflowCommandQueue
from .common import (
    LAST_ERROR_PREVIEW,
    ReadOnlyAdmin,
    actor_text,
    admin_url,
    choices_filter,
    instance_link,
    json_display,
    ms_display,
)
from .facts import since, stuck_condition


class ConditionFilter(admin.SimpleListFilter):
    """What needs an operator: dead letters, parked signals, deferrals, stuck commands."""

    title = "needs attention"
    parameter_name = "condition"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("dead", "DEAD (dead letters)"),
            ("parked", "PARKED"),
            ("deferred", "DEFERRED"),
            ("lease_expired", "stuck: claimed, lease expired"),
            ("stuck", "stuck: lease expired or open too long"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value in ("dead", "parked", "deferred"):
            return queryset.filter(state=value.upper())
        if value == "lease_expired":
            from django.db.models.functions import Now

            return queryset.filter(state="CLAIMED", lease_until__lt=Now())
        if value == "stuck":
            return queryset.annotate(_since=since()).filter(stuck_condition())
        return queryset


@admin.register(WorkflowCommand)
class WorkflowCommandAdmin(ReadOnlyAdmin):
    list_display = (
        "id_link",
        "workflow_link",
        "seq",
        "kind",
        "state",
        "attempts",
        "available_at_ms",
        "lease_until_ms",
        "claimed_by",
        "last_error_preview",
    )
    list_display_links = None
    list_filter = (
        ConditionFilter,
        choices_filter("state", CommandState),
        choices_filter("kind", CommandKind),
    )
    list_select_related = ("workflow",)
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    json_fields = ("target_json", "payload_json", "context_json", "explicit_carrier_json")
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
                    "last_error_whole",
                )
            },
        ),
        ("Content", {"fields": ("target_json_view", "payload_json_view")}),
        (
            "Claim",
            {
                "fields": (
                    "attempts",
                    "transient_count",
                    "deferral_count",
                    "claimed_by",
                    "claim_token",
                    "lease_until_ms",
                )
            },
        ),
        (
            "Times",
            {"fields": ("recorded_at_ms", "fire_at_ms", "available_at_ms", "settled_at_ms")},
        ),
        (
            "Attribution",
            {"fields": ("actor", "context_json_view", "explicit_carrier_json_view")},
        ),
    )
    readonly_fields = (
        "workflow_link",
        "last_error_whole",
        "actor",
        "target_json_view",
        "payload_json_view",
        "context_json_view",
        "explicit_carrier_json_view",
        "lease_until_ms",
        "recorded_at_ms",
        "fire_at_ms",
        "available_at_ms",
        "settled_at_ms",
    )
    target_json_view = json_display("target_json", "target")
    payload_json_view = json_display("payload_json", "payload")
    context_json_view = json_display("context_json", "durable context")
    explicit_carrier_json_view = json_display("explicit_carrier_json", "explicit carrier")
    lease_until_ms = ms_display("lease_until", "lease until")
    recorded_at_ms = ms_display("recorded_at", "recorded")
    fire_at_ms = ms_display("fire_at", "fire at")
    available_at_ms = ms_display("available_at", "available")
    settled_at_ms = ms_display("settled_at", "settled")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer(*self.json_fields)

    @admin.display(description="id")
    def id_link(self, obj: WorkflowCommand) -> str:
        return format_html(
            '<a class="wf-nowrap" href="{}">{}</a>',
            admin_url(WorkflowCommand, "change", obj.pk),
            obj.pk,
        )

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowCommand) -> str:
        instance = obj.workflow  # joined by list_select_related on the list page
        return format_html(
            '<span class="wf-nowrap">{}</span>',
            instance_link(obj.workflow_id, f"{instance.definition_id} {obj.workflow_id}"),
        )

    @admin.display(description="last error", ordering="last_error")
    def last_error_preview(self, obj: WorkflowCommand) -> str:
        text = obj.last_error or ""
        if len(text) <= LAST_ERROR_PREVIEW:
            return text or "-"
        return format_html('<span title="{}">{}…</span>', text, text[:LAST_ERROR_PREVIEW])

    @admin.display(description="last error")
    def last_error_whole(self, obj: WorkflowCommand) -> str:
        if not obj.last_error:
            return "-"
        return format_html('<pre class="wf-error">{}</pre>', obj.last_error)

    @admin.display(description="actor")
    def actor(self, obj: WorkflowCommand) -> str:
        return actor_text(obj)


@admin.register(WorkflowCommandQueue)
class WorkflowCommandQueueAdmin(ReadOnlyAdmin):
    list_display = ("workflow_link", "next_seq", "open_signals")
    uuid_search_fields = ("workflow_id",)
    search_help_text = "An instance id (exact)."
    fields = readonly_fields = ("workflow_link", "next_seq", "open_signals")

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, obj: WorkflowCommandQueue) -> str:
        return instance_link(obj.workflow_id)
