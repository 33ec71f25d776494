"""Admin views of their own: whole JSON values, and the tables Django's admin refuses.

Django's admin refuses models with a composite primary key
(``AdminSite.register`` raises ``ImproperlyConfigured``): definitions,
activations, dedup keys and join states. They get read-only views here,
added to the admin site by :func:`install` (its ``get_urls``) and listed on
the admin index with the app's models (its ``get_app_list``). A user sees
a view with the model's ``view`` (or ``change``) permission, like any
admin page.

Every list is a bounded read: a page of rows (one LIMIT/OFFSET query, never
a count), filters on indexed columns.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.admin import AdminSite
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, ValidationError
from django.db.models import JSONField, Model, QuerySet, TextField
from django.db.models.functions import Cast
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from .. import operations
from ..exceptions import WorkflowError
from ..models import (
    WorkflowDedup,
    WorkflowDefinition,
    WorkflowDefinitionActivation,
    WorkflowJoinState,
)
from ..pins import resident_plan
from ..store import definitions as definitions_store
from .common import (
    NoCountPaginator,
    admin_url,
    instance_link,
    json_preview,
    json_view_url,
    ms,
    with_json_previews,
)
from .diagrams import plan_svg

APP_LABEL = "vertique_workflow"
PAGE_ROWS = 100


def can_view(request: HttpRequest, model: type[Model]) -> bool:
    name = model._meta.model_name
    user = request.user
    return user.has_perm(f"{APP_LABEL}.view_{name}") or user.has_perm(f"{APP_LABEL}.change_{name}")


def require_view(request: HttpRequest, model: type[Model]) -> None:
    if not can_view(request, model):
        raise PermissionDenied


def page_context(site: AdminSite, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
    return {
        **site.each_context(request),
        "title": title,
        "subtitle": None,
        "app_label": APP_LABEL,
        "app_url": reverse("admin:app_list", args=[APP_LABEL]),
        **extra,
    }


def uuid_param(request: HttpRequest, name: str) -> uuid.UUID | None:
    value = (request.GET.get(name) or "").strip()
    if not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


# -- whole JSON values ---------------------------------------------------------


def _json_model(model_name: str, field: str) -> type[Model]:
    try:
        model = apps.get_model(APP_LABEL, model_name)
        column = model._meta.get_field(field)
    except (LookupError, FieldDoesNotExist):
        raise Http404("no such stored value") from None
    if not isinstance(column, (JSONField, TextField)):
        raise Http404("no such stored value")
    return model


def _pk_value(model: type[Model], raw: str) -> Any:
    if model._meta.is_composite_pk:
        try:
            parts = json.loads(raw)
        except ValueError:
            raise Http404("bad key") from None
        if not isinstance(parts, list) or len(parts) != len(model._meta.pk_fields):
            raise Http404("bad key")
        return tuple(parts)
    try:
        return model._meta.pk.to_python(raw)
    except ValidationError:
        raise Http404("bad key") from None


def json_value(request: HttpRequest, model_name: str, field: str) -> HttpResponse:
    """One stored JSON (or text) value, whole: ``application/json``; ``?download=1`` saves it.

    The value is read as text by PostgreSQL and sent as is (no parse and
    re-encode in Python).
    """
    model = _json_model(model_name, field)
    require_view(request, model)
    pk = _pk_value(model, request.GET.get("pk", ""))
    rows = list(
        model._default_manager.filter(pk=pk)
        .annotate(_whole=Cast(field, output_field=TextField()))
        .values_list("_whole", flat=True)[:1]
    )
    if not rows:
        raise Http404("no such row")
    is_json = isinstance(model._meta.get_field(field), JSONField)
    text = rows[0] if rows[0] is not None else ("null" if is_json else "")
    response = HttpResponse(
        text, content_type="application/json" if is_json else "text/plain; charset=utf-8"
    )
    if request.GET.get("download"):
        name = f"{model_name}-{field}.{'json' if is_json else 'txt'}"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def state_at_value(request: HttpRequest, instance_id: str, sequence: int) -> HttpResponse:
    """The state right after a history entry (``wf.state_at``), whole, as JSON."""
    from ..models import WorkflowHistory, WorkflowInstance

    require_view(request, WorkflowInstance)
    require_view(request, WorkflowHistory)
    try:
        state = operations.state_at(instance_id, sequence)
    except WorkflowError as exc:
        raise Http404(str(exc)) from None
    response = HttpResponse(
        json.dumps(state, ensure_ascii=False, default=str), content_type="application/json"
    )
    if request.GET.get("download"):
        response["Content-Disposition"] = f'attachment; filename="state-{sequence}.json"'
    return response


# -- bounded tables ----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[Any], Any]


def table_page(
    request: HttpRequest, queryset: QuerySet, columns: Sequence[Column]
) -> dict[str, Any]:
    """One page of rows as rendered cells, with previous/next links (no count)."""
    paginator = NoCountPaginator(queryset, PAGE_ROWS, request.GET.get("p", 1))
    page = paginator.page(paginator.page_number) if paginator.count else None
    rows = [[column.cell(row) for column in columns] for row in (page or [])]
    params = request.GET.copy()

    def link(number: int) -> str:
        params["p"] = str(number)
        return "?" + params.urlencode()

    return {
        "headers": [column.title for column in columns],
        "rows": rows,
        "page_number": paginator.page_number,
        "previous_url": link(paginator.page_number - 1) if paginator.page_number > 1 else None,
        "next_url": link(paginator.page_number + 1) if paginator.has_more else None,
    }


def table_view(
    site: AdminSite,
    request: HttpRequest,
    *,
    title: str,
    queryset: QuerySet,
    columns: Sequence[Column],
    filters: Iterable[tuple[str, str, str]] = (),
    intro: str = "",
) -> TemplateResponse:
    """Render a read-only table page; ``filters`` are (parameter, label, help) text inputs."""
    context = page_context(
        site,
        request,
        title,
        intro=intro,
        filters=[(name, label, hint, request.GET.get(name, "")) for name, label, hint in filters],
        **table_page(request, queryset, columns),
    )
    return TemplateResponse(request, "admin/vertique_workflow/table.html", context)


def key_json(obj: Any, field: str) -> str:
    return json_preview(obj, field, json_view_url(type(obj), field, list(obj.pk)))


# -- definitions -----------------------------------------------------------------


def definition_url(scope_key: str, definition_id: str, version: int) -> str:
    return reverse(
        "admin:vertique_workflow_definition", args=[scope_key, definition_id, int(version)]
    )


def definitions(site: AdminSite, request: HttpRequest) -> TemplateResponse:
    """Every registry version: status, kind, contract, plan hash, active scopes, live counts."""
    require_view(request, WorkflowDefinition)
    queryset = WorkflowDefinition.objects.defer(
        "document_text", "name_binding", "signal_names_json", "start_schema_json"
    ).order_by("definition_id", "scope_key", "-definition_version")
    wanted = (request.GET.get("definition_id") or "").strip()
    if wanted:
        queryset = queryset.filter(definition_id=wanted)
    status = (request.GET.get("status") or "").strip().upper()
    if status:
        queryset = queryset.filter(status=status)
    counts = definitions_store.instance_counts(definition_id=wanted or None)
    active: dict[tuple[str, str, int], list[str]] = {}
    for activation in WorkflowDefinitionActivation.objects.order_by("scope_key"):
        key = (activation.target_scope_key, activation.definition_id, activation.definition_version)
        active.setdefault(key, []).append(activation.scope_key)

    def key(row: Any) -> tuple[str, str, int]:
        return (row.scope_key, row.definition_id, row.definition_version)

    def live(row: Any) -> str:
        live_count, failed = counts.get(key(row), (0, 0))
        if not (live_count or failed):
            return "0"
        link = (
            admin_url(apps.get_model(APP_LABEL, "WorkflowInstance"), "changelist")
            + "?"
            + urlencode(
                {
                    "definition_id": row.definition_id,
                    "definition_version": row.definition_version,
                }
            )
        )
        return format_html('<a href="{}">{} live, {} failed</a>', link, live_count, failed)

    columns = [
        Column(
            "definition",
            lambda r: format_html(
                '<a href="{}">{} v{}</a>',
                definition_url(*key(r)),
                r.definition_id,
                r.definition_version,
            ),
        ),
        Column("scope", lambda r: r.scope_key),
        Column("status", lambda r: r.status),
        Column("kind", lambda r: r.kind),
        Column("contract", lambda r: r.contract_name),
        Column("plan hash", lambda r: format_html("<code>{}</code>", r.plan_hash[:16])),
        Column("active in scopes", lambda r: ", ".join(active.get(key(r), [])) or "-"),
        Column("instances", live),
        Column("failure", lambda r: r.failure_reason or "-"),
        Column("updated", lambda r: ms(r.updated_at)),
        Column(
            "diagram",
            lambda r: format_html('<a href="{}#diagram">diagram</a>', definition_url(*key(r))),
        ),
    ]
    return table_view(
        site,
        request,
        title="Workflow definitions",
        queryset=queryset,
        columns=columns,
        filters=[
            ("definition_id", "definition id", "exact"),
            ("status", "status", "CANDIDATE, PUBLISHING, AVAILABLE, DEPRECATED or RETIRED"),
        ],
        intro="Every version in the registry. Change them with manage.py workflow_definitions.",
    )


def definition(
    site: AdminSite, request: HttpRequest, scope_key: str, definition_id: str, version: int
) -> TemplateResponse:
    """One version: its metadata, active scopes, instance counts and diagram."""
    require_view(request, WorkflowDefinition)
    queryset = with_json_previews(
        WorkflowDefinition.objects.filter(
            scope_key=scope_key, definition_id=definition_id, definition_version=version
        ),
        ("name_binding", "signal_names_json", "start_schema_json", "document_text"),
    )
    row = queryset.first()
    if row is None:
        raise Http404("no such definition version")
    pk = [scope_key, definition_id, version]
    plan = None
    try:
        plan = resident_plan(definition_id, version, scope=scope_key)
    except WorkflowError:
        plan = None
    if plan is not None and plan.plan_hash != row.plan_hash:
        note = (
            f"This node's plan has hash {plan.plan_hash[:16]}, the registry row "
            f"{row.plan_hash[:16]}: the diagram shows this node's plan."
        )
    else:
        note = ""
    svg, why = plan_svg(plan, title=f"{definition_id} v{version}")
    live, failed = definitions_store.instance_counts(scope_key, definition_id).get(
        (scope_key, definition_id, version), (0, 0)
    )
    activations = WorkflowDefinitionActivation.objects.filter(
        definition_id=definition_id, target_scope_key=scope_key, definition_version=version
    ).order_by("scope_key")
    versions = (
        WorkflowDefinition.objects.filter(scope_key=scope_key, definition_id=definition_id)
        .only("scope_key", "definition_id", "definition_version", "status")
        .order_by("-definition_version")
    )
    fields = [
        ("definition", f"{definition_id} v{version}"),
        ("scope", scope_key),
        ("status", row.status),
        ("kind", row.kind),
        ("contract", row.contract_name),
        ("state type", row.state_type_name),
        ("plan hash", format_html("<code>{}</code>", row.plan_hash)),
        ("active in scopes", ", ".join(a.scope_key for a in activations) or "-"),
        ("live instances", live),
        ("failed instances", failed),
        ("failure reason", row.failure_reason or "-"),
        ("source", row.source_location or "-"),
        ("document", f"{row.document_format or '-'} {row.document_digest or ''}"),
        ("created", ms(row.created_at)),
        ("updated", ms(row.updated_at)),
        ("declared signals", json_preview(row, "signal_names_json", _dj(pk, "signal_names_json"))),
        ("start schema", json_preview(row, "start_schema_json", _dj(pk, "start_schema_json"))),
        ("name binding", json_preview(row, "name_binding", _dj(pk, "name_binding"))),
    ]
    if row.kind == "DOCUMENT":
        fields.append(("document text", _text_preview(row, pk)))
    context = page_context(
        site,
        request,
        f"Definition {definition_id} v{version} ({scope_key})",
        fields=fields,
        svg=svg,
        svg_missing=why,
        note=note,
        versions=[(v.definition_version, v.status, definition_url(*v.pk)) for v in versions],
        definitions_url=reverse("admin:vertique_workflow_definitions"),
    )
    return TemplateResponse(request, "admin/vertique_workflow/definition.html", context)


def _dj(pk: list[Any], field: str) -> str:
    return json_view_url(WorkflowDefinition, field, pk)


def _text_preview(row: Any, pk: list[Any]) -> str:
    from .common import JSON_PREVIEW_CHARS, json_links

    text = row._preview_document_text or ""
    length = row._length_document_text or 0
    if length <= JSON_PREVIEW_CHARS:
        return format_html('<pre class="wf-json">{}</pre>', text)
    return format_html(
        '<pre class="wf-json wf-truncated">{}…</pre><div>{} characters in all · {}</div>',
        text,
        length,
        json_links(_dj(pk, "document_text")),
    )


# -- activations, dedup keys, join states ------------------------------------------


def activations(site: AdminSite, request: HttpRequest) -> TemplateResponse:
    require_view(request, WorkflowDefinitionActivation)
    queryset = WorkflowDefinitionActivation.objects.order_by("definition_id", "scope_key")
    wanted = (request.GET.get("definition_id") or "").strip()
    if wanted:
        queryset = queryset.filter(definition_id=wanted)
    columns = [
        Column("definition", lambda r: r.definition_id),
        Column("scope", lambda r: r.scope_key),
        Column(
            "current version",
            lambda r: format_html(
                '<a href="{}">{} v{} ({})</a>',
                definition_url(r.target_scope_key, r.definition_id, r.definition_version),
                r.definition_id,
                r.definition_version,
                r.target_scope_key,
            ),
        ),
        Column("activated", lambda r: ms(r.activated_at)),
    ]
    return table_view(
        site,
        request,
        title="Workflow definition activations",
        queryset=queryset,
        columns=columns,
        filters=[("definition_id", "definition id", "exact")],
        intro="The version each scope starts; a scope without a row follows the default scope.",
    )


def dedup(site: AdminSite, request: HttpRequest) -> TemplateResponse:
    require_view(request, WorkflowDedup)
    queryset = with_json_previews(WorkflowDedup.objects.all(), ("result_json",))
    workflow_id = uuid_param(request, "workflow_id")
    if workflow_id is not None:
        queryset = queryset.filter(workflow_id=workflow_id)  # indexed
    elif request.GET.get("workflow_id"):
        queryset = queryset.none()
    kind = (request.GET.get("kind") or "").strip().upper()
    if kind:
        queryset = queryset.filter(kind=kind)
    key = (request.GET.get("key") or "").strip()
    if key:
        queryset = queryset.filter(key=key)
    # the primary key's order: the index serves it (no sort of the table)
    queryset = queryset.order_by("kind", "scope_key", "dedup_namespace", "key")
    columns = [
        Column("kind", lambda r: r.kind),
        Column("scope", lambda r: r.scope_key),
        Column("namespace", lambda r: r.dedup_namespace),
        Column("key", lambda r: r.key),
        Column("instance", lambda r: instance_link(r.workflow_id)),
        Column("fingerprint", lambda r: format_html("<code>{}</code>", r.fingerprint[:16])),
        Column("result", lambda r: key_json(r, "result_json")),
        Column("created", lambda r: ms(r.created_at)),
    ]
    return table_view(
        site,
        request,
        title="Workflow dedup keys",
        queryset=queryset,
        columns=columns,
        filters=[
            ("workflow_id", "instance id", "exact UUID"),
            ("kind", "kind", "START, SIGNAL, ..."),
            ("key", "key", "exact"),
        ],
        intro="Idempotency keys of starts and dedup keys of signals, and what a repeat returns.",
    )


def join_states(site: AdminSite, request: HttpRequest) -> TemplateResponse:
    require_view(request, WorkflowJoinState)
    queryset = with_json_previews(WorkflowJoinState.objects.all(), ("arrived_json",))
    workflow_id = uuid_param(request, "workflow_id")
    if workflow_id is not None:
        queryset = queryset.filter(workflow_id=workflow_id)
    elif request.GET.get("workflow_id"):
        queryset = queryset.none()
    queryset = queryset.order_by("workflow_id", "join_step_id")
    columns = [
        Column("instance", lambda r: instance_link(r.workflow_id)),
        Column("join step", lambda r: r.join_step_id),
        Column("fork step", lambda r: r.fork_step_id),
        Column("expected", lambda r: r.expected),
        Column("arrived", lambda r: key_json(r, "arrived_json")),
        Column("decided", lambda r: "yes" if r.decided else "no"),
        Column("updated", lambda r: ms(r.updated_at)),
    ]
    return table_view(
        site,
        request,
        title="Workflow join states",
        queryset=queryset,
        columns=columns,
        filters=[("workflow_id", "instance id", "exact UUID")],
        intro="The fan-in of each join: the branches expected and those that have arrived.",
    )


# -- the site extension -------------------------------------------------------------

# (url name, title, model) of the views listed on the admin index
INDEX_ENTRIES = (
    ("definitions", "Workflow definitions", WorkflowDefinition),
    ("activations", "Workflow definition activations", WorkflowDefinitionActivation),
    ("dedup", "Workflow dedup keys", WorkflowDedup),
    ("join_states", "Workflow join states", WorkflowJoinState),
)


def urls(site: AdminSite) -> list[URLPattern]:
    def wrap(view: Callable[..., HttpResponse], with_site: bool = True) -> Callable[..., Any]:
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return (
                view(site, request, *args, **kwargs)
                if with_site
                else view(request, *args, **kwargs)
            )

        return site.admin_view(inner)

    prefix = f"{APP_LABEL}/"
    return [
        path(
            f"{prefix}json/<str:model_name>/<str:field>/",
            wrap(json_value, False),
            name=f"{APP_LABEL}_json",
        ),
        path(
            f"{prefix}state-at/<uuid:instance_id>/<int:sequence>/",
            wrap(state_at_value, False),
            name=f"{APP_LABEL}_state_at",
        ),
        path(f"{prefix}definitions/", wrap(definitions), name=f"{APP_LABEL}_definitions"),
        path(
            f"{prefix}definitions/<str:scope_key>/<str:definition_id>/<int:version>/",
            wrap(definition),
            name=f"{APP_LABEL}_definition",
        ),
        path(f"{prefix}activations/", wrap(activations), name=f"{APP_LABEL}_activations"),
        path(f"{prefix}dedup/", wrap(dedup), name=f"{APP_LABEL}_dedup"),
        path(f"{prefix}join-states/", wrap(join_states), name=f"{APP_LABEL}_join_states"),
    ]


def index_entries(request: HttpRequest) -> list[dict[str, Any]]:
    entries = []
    for name, title, model in INDEX_ENTRIES:
        if not can_view(request, model):
            continue
        try:
            url = reverse(f"admin:{APP_LABEL}_{name}")
        except NoReverseMatch:
            continue
        entries.append(
            {
                "model": None,
                "name": title,
                "object_name": model._meta.object_name,
                "perms": {"add": False, "change": False, "delete": False, "view": True},
                "admin_url": url,
                "add_url": None,
                "view_only": True,
            }
        )
    return entries


def install(site: AdminSite) -> None:
    """Add the workflow views to ``site``: their URLs, and their entries on its index.

    Runs for Django's default site when the admin package is imported; call
    it for a custom ``AdminSite`` of your own (after registering the workflow
    models on it). Installing twice is harmless.
    """
    if getattr(site, "_vertique_workflow_views", False):
        return
    original_urls = site.get_urls
    original_app_list = site.get_app_list

    def get_urls() -> list[Any]:
        return urls(site) + original_urls()

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        app_list = original_app_list(request, app_label)
        if app_label not in (None, APP_LABEL):
            return app_list
        entries = index_entries(request)
        if not entries:
            return app_list
        for app in app_list:
            if app["app_label"] == APP_LABEL:
                app["models"] = sorted([*app["models"], *entries], key=lambda m: m["name"])
                return app_list
        app = {
            "name": apps.get_app_config(APP_LABEL).verbose_name,
            "app_label": APP_LABEL,
            "app_url": reverse("admin:app_list", kwargs={"app_label": APP_LABEL}),
            "has_module_perms": True,
            "models": entries,
        }
        return sorted([*app_list, app], key=lambda a: a["name"].lower())

    site.get_urls = get_urls  # type: ignore[method-assign]
    site.get_app_list = get_app_list  # type: ignore[method-assign]
    site._vertique_workflow_views = True  # type: ignore[attr-defined]


__all__ = ["install"]
