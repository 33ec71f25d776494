"""Shared helpers and read-only base classes of the workflow admin.

Why a module of its own: every page (instances, logs, timers, tasks, the
custom views of the composite-key tables) links to the others, shows times
to the millisecond and JSON the same bounded way; keeping those helpers here
keeps the page modules small.

JSON values are never loaded whole for a page: a queryset made by
:func:`with_json_previews` defers the JSON columns and reads, in the same
query, the first ``JSON_PREVIEW_CHARS`` characters of their text and their
length. A value longer than that shows truncated, with links to the JSON
view (``admin:vertique_workflow_json``) that returns it whole.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import F, Model, Q, QuerySet, TextChoices, TextField
from django.db.models.functions import Cast, Left, Length
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import WorkflowCommand, WorkflowInstance

# Rows an instance's page shows in each inline (the latest ones); the links
# on the page open the full, filtered lists.
INLINE_ROWS = 100
LAST_ERROR_PREVIEW = 120
# A JSON value longer than this (characters of its text) shows truncated.
JSON_PREVIEW_CHARS = 2048


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
    return format_html('<pre class="wf-json">{}</pre>', text)


def actor_text(row: Any) -> str:
    """``USER ann (ASSERTED)``; a step the executor ran: ``executor <node> (for USER ann ...)``."""
    from .describe import actor_text as describe_actor

    return describe_actor(row)


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


def ms(value: Any) -> str:
    """A timestamp in the current time zone to the millisecond (retries differ by less)."""
    if value is None:
        return "-"
    if isinstance(value, datetime.datetime):
        if timezone.is_aware(value):
            value = timezone.localtime(value)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return str(value)


def ms_display(field: str, description: str | None = None) -> Any:
    """An admin display method showing ``field`` with :func:`ms` (sortable by the field)."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def show(self: Any, obj: Any) -> str:
        return format_html('<span class="wf-time">{}</span>', ms(getattr(obj, field)))

    show.__name__ = f"{field}_ms"
    return show


def with_json_previews(queryset: QuerySet, fields: Sequence[str]) -> QuerySet:
    """``queryset`` with ``fields`` deferred and their preview text and length annotated.

    ``_preview_<field>`` holds the first JSON_PREVIEW_CHARS characters of the
    value's text and ``_length_<field>`` its length (NULL for SQL NULL), both
    computed by PostgreSQL: a 30 MB value costs the page 2 kB.
    """
    annotations: dict[str, Any] = {}
    for field in fields:
        text = Cast(F(field), output_field=TextField())
        annotations[f"_preview_{field}"] = Left(text, JSON_PREVIEW_CHARS)
        annotations[f"_length_{field}"] = Length(text)
    return queryset.defer(*fields).annotate(**annotations)


def json_view_url(model: type[Model], field: str, pk: Any, *, download: bool = False) -> str:
    """The JSON view of one stored value (``pk`` a list/tuple for a composite key)."""
    key = json.dumps(list(pk), default=str) if isinstance(pk, (list, tuple)) else str(pk)
    params = {"pk": key}
    if download:
        params["download"] = "1"
    return (
        reverse("admin:vertique_workflow_json", args=[model._meta.model_name, field])
        + "?"
        + urlencode(params)
    )


def json_links(url: str) -> str:
    return format_html(
        '<a href="{}">view whole</a> · <a href="{}&amp;download=1">download</a>', url, url
    )


def truncated_json(text: str | None, length: int | None, url: str | None) -> str:
    """Pretty JSON when short; else the first characters, the size and the whole-value links."""
    if length is None or text is None:
        return "-"
    if length <= JSON_PREVIEW_CHARS:
        try:
            return pretty_json(json.loads(text))
        except ValueError:
            pass
    return format_html(
        '<pre class="wf-json wf-truncated">{}…</pre><div class="wf-json-more">'
        "{} characters in all{}</div>",
        text[:JSON_PREVIEW_CHARS],
        length,
        format_html(" · {}", json_links(url)) if url else "",
    )


def json_preview(obj: Any, field: str, url: str | None = None) -> str:
    """Show ``obj.<field>`` bounded: from the preview annotations, else from the loaded value.

    ``url`` is the JSON view of the whole value (given for stored rows).
    """
    if hasattr(obj, f"_length_{field}"):
        return truncated_json(
            getattr(obj, f"_preview_{field}"), getattr(obj, f"_length_{field}"), url
        )
    return python_json(getattr(obj, field), url)


def python_json(value: Any, url: str | None = None) -> str:
    """A value computed in Python (a replayed state), shown bounded like a stored one."""
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return truncated_json(text[:JSON_PREVIEW_CHARS], len(text), url)


def json_display(field: str, description: str | None = None) -> Any:
    """An admin display method showing the JSON ``field`` bounded, with the whole-value links."""

    @admin.display(description=description or field.removesuffix("_json").replace("_", " "))
    def show(self: Any, obj: Any) -> str:
        return json_preview(obj, field, json_view_url(type(obj), field, obj.pk))

    show.__name__ = f"{field}_view"
    return show


class NoCountPaginator(Paginator):
    """A paginator that never counts: it reads one row more than a page to know if one follows.

    ``count`` is the rows before this page plus those read, so the admin's
    page links reach one page beyond the current one, and a list of a million
    instances costs one LIMIT/OFFSET query per page instead of a COUNT(*).
    """

    def __init__(self, object_list: Any, per_page: int, page_number: Any = 1, **kwargs: Any):
        super().__init__(object_list, per_page, **kwargs)
        try:
            self.page_number = max(1, int(page_number))
        except (TypeError, ValueError):
            self.page_number = 1
        self._window: list[Any] | None = None

    def _read_window(self) -> list[Any]:
        if self._window is None:
            offset = (self.page_number - 1) * self.per_page
            self._window = list(self.object_list[offset : offset + self.per_page + 1])
        return self._window

    @property
    def count(self) -> int:  # type: ignore[override]
        return (self.page_number - 1) * self.per_page + len(self._read_window())

    @property
    def has_more(self) -> bool:
        return len(self._read_window()) > self.per_page

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if number == self.page_number:
            return self._get_page(self._read_window()[: self.per_page], number, self)
        return super().page(number)


# -- base classes --------------------------------------------------------------


class NoCountChangeList(ChangeList):
    """A changelist whose pager links the previous and next page only (see NoCountPaginator)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = self.paginator
        if isinstance(paginator, NoCountPaginator) and paginator.count:
            # the rows read to decide the paging are the page: no second query
            self.result_list = paginator.page(paginator.page_number).object_list

    @property
    def previous_url(self) -> str | None:
        return self.get_query_string({PAGE_VAR: self.page_num - 1}) if self.page_num > 1 else None

    @property
    def next_url(self) -> str | None:
        has_more = getattr(self.paginator, "has_more", False)
        return self.get_query_string({PAGE_VAR: self.page_num + 1}) if has_more else None


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete: the rows are browsed, never edited here.

    Searching: a term that is a UUID matches ``uuid_search_fields`` exactly
    (an indexed equality, no cast to text); every term also matches
    ``text_search_fields`` case-insensitively.
    """

    actions = None
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are one count query per filter value
    list_max_show_all = 0  # no "show all": a page is a bounded read
    paginator = NoCountPaginator
    uuid_search_fields: tuple[str, ...] = ()
    text_search_fields: tuple[str, ...] = ()
    # JSON columns a change page shows bounded (read as previews, never whole)
    json_fields: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return NoCountChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        return self.paginator(
            queryset,
            per_page,
            request.GET.get(PAGE_VAR, 1),
            orphans=0,
            allow_empty_first_page=allow_empty_first_page,
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The row with its JSON columns as bounded previews (a 30 MB payload stays in the DB)."""
        queryset = with_json_previews(self.get_queryset(request), self.json_fields)
        model = queryset.model
        field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        """Django's change history does not apply (nothing is edited here): go to the row."""
        return HttpResponseRedirect(admin_url(self.model, "change", object_id))

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
