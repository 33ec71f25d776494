"""The admin's reads are bounded: query counts do not grow with the history, and a large
JSON value never makes a large page."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import vertique_workflow as wf
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowHistory,
    WorkflowInstance,
)
from vertique_workflow.testing import run_until_idle

from .admin_support import add_timer_task_branch, grow_history, orders, url

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["orders"]

BIG = 3 * 1024 * 1024  # characters of a large stored value
PAGE_LIMIT = 400 * 1024  # bytes a page may have with such values on it


def queries(client, address: str, **params) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(address, params)
    assert response.status_code == 200
    return len(captured)


def test_instance_page_queries_do_not_grow_with_the_history(
    admin_client, orders, django_assert_max_num_queries
):
    waiting, _done = orders
    add_timer_task_branch(waiting)
    grow_history(waiting, 50)
    page = url(WorkflowInstance, "change", waiting)
    admin_client.get(page)  # warm the process's caches (plans, content types)
    small = queries(admin_client, page)
    small_at = queries(admin_client, page, at=3)
    grow_history(waiting, 450)
    assert WorkflowHistory.objects.filter(workflow_id=waiting).count() > 500
    assert queries(admin_client, page) == small
    assert queries(admin_client, page, at=3) == small_at
    assert queries(admin_client, page, **{"from": 200}) == small
    with django_assert_max_num_queries(30):
        admin_client.get(page, {"at": 3})
    response = admin_client.get(page)
    assert len(response.context["timeline"]["entries"]) == 100  # the latest page only
    assert response.context["timeline"]["earlier"] is not None


def test_list_pages_run_a_fixed_number_of_queries(admin_client, orders):
    """No query per row: a page with more rows runs as many queries as one with fewer."""
    from django.contrib import admin

    models = [m for m in admin.site._registry if m._meta.app_label == "vertique_workflow"]
    waiting, _ = orders
    add_timer_task_branch(waiting)
    for model in models:  # warm the process's caches
        admin_client.get(url(model, "changelist"))
    before = {model: queries(admin_client, url(model, "changelist")) for model in models}
    for n in range(3):
        ref = wf.start("order", {"amount": 1}, idempotency_key=f"more-{n}")
        add_timer_task_branch(ref.id)
    run_until_idle()
    grow_history(waiting, 300)
    after = {model: queries(admin_client, url(model, "changelist")) for model in models}
    assert after == before
    for name in ("definitions", "activations", "dedup", "join_states"):
        assert queries(admin_client, reverse(f"admin:vertique_workflow_{name}")) <= 8, name


def test_large_json_values_show_truncated_with_a_link_to_the_whole(admin_client, orders):
    waiting, _done = orders
    big_state = {"amount": 5, "blob": "x" * BIG}
    WorkflowInstance.objects.filter(pk=waiting).update(state_json=big_state)
    entry = WorkflowHistory.objects.filter(workflow_id=waiting).order_by("sequence").last()
    WorkflowHistory.objects.filter(pk=entry.pk).update(payload_json={"blob": "y" * BIG})
    command = WorkflowCommand.objects.filter(workflow_id=waiting).first()
    WorkflowCommand.objects.filter(pk=command.pk).update(payload_json=["z" * BIG])

    for address in (
        url(WorkflowInstance, "change", waiting),
        url(WorkflowHistory, "change", entry.pk),
        url(WorkflowCommand, "change", command.pk),
        url(WorkflowInstance, "changelist"),
        url(WorkflowHistory, "changelist"),
        url(WorkflowCommand, "changelist"),
    ):
        response = admin_client.get(address)
        assert response.status_code == 200, address
        assert len(response.content) < PAGE_LIMIT, (address, len(response.content))
    page = admin_client.get(url(WorkflowInstance, "change", waiting)).content.decode()
    assert "characters in all" in page and "view whole" in page
    whole_url = reverse("admin:vertique_workflow_json", args=["workflowinstance", "state_json"])
    assert whole_url in page
    whole = admin_client.get(whole_url, {"pk": str(waiting)})
    assert whole["Content-Type"] == "application/json"
    assert whole.json() == big_state
    download = admin_client.get(whole_url, {"pk": str(waiting), "download": "1"})
    assert download["Content-Disposition"].startswith("attachment;")
    payload = admin_client.get(
        reverse("admin:vertique_workflow_json", args=["workflowhistory", "payload_json"]),
        {"pk": entry.pk},
    )
    assert payload.json() == {"blob": "y" * BIG}


def test_the_json_view_refuses_unknown_values_and_missing_permissions(admin_client, orders):
    from .admin_support import staff_client

    waiting, _ = orders
    view = "admin:vertique_workflow_json"
    assert (
        admin_client.get(
            reverse(view, args=["workflowinstance", "status"]), {"pk": waiting}
        ).status_code
        == 404
    )
    assert admin_client.get(reverse(view, args=["nosuchmodel", "x"]), {"pk": 1}).status_code == 404
    assert (
        admin_client.get(
            reverse(view, args=["workflowinstance", "state_json"]), {"pk": "bad"}
        ).status_code
        == 404
    )
    dedup = reverse(view, args=["workflowdedup", "result_json"])
    assert admin_client.get(dedup, {"pk": '["START"]'}).status_code == 404
    client = staff_client("view_workflowcommand")
    assert (
        client.get(
            reverse(view, args=["workflowinstance", "state_json"]), {"pk": waiting}
        ).status_code
        == 403
    )
