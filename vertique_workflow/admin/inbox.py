"""The task inbox of the logged-in admin user: assigned to me, offered to me, my groups, overdue.

Why in the admin: an operator who is also a reviewer should not need the
application's own pages to find and decide a task. Each list is one
``wf.tasks(...)`` keyset page (no ``COUNT(*)``, a bounded number of queries
whatever the number of tasks); "Decide" opens the task's decision forms,
built from each decision's payload schema (see ``schema_form``).

Who sees what: every staff user sees the tasks the task rule lets them act
on -- assigned to them, naming them as a candidate, or offered to one of
their groups. Users holding ``vertique_workflow.change_workflowtask``
(supervisors; superusers) also get "All open tasks".
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.http import urlencode

from .. import operations as ops
from ..exceptions import WorkflowValidationError
from ..models import WorkflowInstance, WorkflowTask
from .common import admin_url

ACTIVE = ("OPEN", "COMPLETING")  # COMPLETING: decided, the executor has not run it yet
PAGE = 50
OVERDUE_PER_SOURCE = 100


@dataclass(frozen=True)
class Tab:
    key: str
    label: str
    url: str
    current: bool


@dataclass(frozen=True)
class Row:
    task: ops.TaskView
    overdue: bool
    decide_url: str | None
    instance_url: str


def _groups(request: HttpRequest) -> list[str]:
    groups = getattr(request.user, "groups", None)
    return [] if groups is None else sorted(groups.values_list("name", flat=True))


def _queries(name: str, groups: list[str]) -> dict[str, dict[str, Any]]:
    queries: dict[str, dict[str, Any]] = {
        "assigned": {"assignee": name},
        "offered": {"candidate_user": name},
    }
    if groups:
        queries["groups"] = {"candidate_groups": groups}
    return queries


def _inbox_url(**params: str) -> str:
    query = urlencode({k: v for k, v in params.items() if v})
    return admin_url(WorkflowTask, "inbox") + (f"?{query}" if query else "")


def inbox_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> TemplateResponse:
    """The inbox page: one tab at a time (``?show=``), keyset-paged (``?cursor=``)."""
    name = request.user.get_username()
    groups = _groups(request)
    supervisor = request.user.has_perm(ops.TASK_PERMISSION)
    labels = {
        "assigned": "Assigned to me",
        "offered": "Offered to me",
        "groups": "My groups",
        "overdue": "Overdue",
    }
    if supervisor:
        labels["all"] = "All open tasks"
    show = request.GET.get("show") or "assigned"
    if show not in labels:
        show = "assigned"
    queries = _queries(name, groups)
    now = timezone.now()
    next_cursor: str | None = None
    items: list[ops.TaskView] = []
    if show == "overdue":
        # every source of mine, due before now; merged, earliest due first (no paging:
        # at most OVERDUE_PER_SOURCE of each source)
        found: dict[Any, ops.TaskView] = {}
        for query in queries.values():
            page = ops.tasks(status=ACTIVE, due_before=now, limit=OVERDUE_PER_SOURCE, **query)
            for item in page.items:
                found.setdefault(item.id, item)
        items = sorted(found.values(), key=lambda t: t.due_at)
    elif show == "all" or show in queries:
        query = {} if show == "all" else queries[show]
        cursor = request.GET.get("cursor") or None
        try:
            page = ops.tasks(status=ACTIVE, limit=PAGE, cursor=cursor, **query)
        except WorkflowValidationError:
            messages.error(request, "That page link is no longer valid: the first page is shown.")
            page = ops.tasks(status=ACTIVE, limit=PAGE, **query)
        items, next_cursor = page.items, page.next_cursor
    rows = [_row(task, now) for task in items]
    tabs = [Tab(key, label, _inbox_url(show=key), key == show) for key, label in labels.items()]
    opts = model_admin.model._meta
    return TemplateResponse(
        request,
        "admin/vertique_workflow/actions/inbox.html",
        {
            **model_admin.admin_site.each_context(request),
            "opts": opts,
            "app_label": opts.app_label,
            "title": "My task inbox",
            "tabs": tabs,
            "show": show,
            "rows": rows,
            "groups": groups,
            "no_groups": show == "groups" and not groups,
            "next_url": _inbox_url(show=show, cursor=next_cursor) if next_cursor else None,
            "first_url": _inbox_url(show=show) if request.GET.get("cursor") else None,
        },
    )


def _row(task: ops.TaskView, now: datetime.datetime) -> Row:
    # every row is one the user may act on (the tab's filter is the task rule), so no
    # per-row can_complete (a group query each)
    return Row(
        task=task,
        overdue=task.due_at is not None and task.due_at < now,
        decide_url=(
            admin_url(WorkflowTask, "complete", task.id) + "?from=inbox"
            if task.status == "OPEN"
            else None
        ),
        instance_url=admin_url(WorkflowInstance, "change", task.instance_id),
    )
