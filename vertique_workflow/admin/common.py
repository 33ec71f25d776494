"""Shared helpers and read-only base classes of the workflow admin.

Why a module of its own: every page (instances, logs, timers, tasks, the
custom views of the composite-key tables) links to the others and shows JSON
the same way; keeping those helpers here keeps the page modules small.
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

from ..models import WorkflowCommand, WorkflowInstance

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
