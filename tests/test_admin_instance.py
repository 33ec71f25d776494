"""The instance page: labelled timeline, executor attribution, state at an entry, diagram."""

from __future__ import annotations

import html as html_text
import re

import pytest
from django.urls import reverse

import vertique_workflow as wf
from vertique_workflow.models import WorkflowHistory, WorkflowInstance
from vertique_workflow.testing import run_until_idle

from .admin_support import add_timer_task_branch, orders, url

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["orders"]


def rows_of(html: str) -> dict[int, str]:
    """The timeline rows of a page by sequence (their HTML)."""
    return {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r'<tr id="entry-(\d+)"[^>]*>(.*?)</tr>', html, re.S)
    }


def cells(row: str) -> list[str]:
    return [html_text.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_the_timeline_names_signals_targets_and_the_executor(admin_client, orders):
    _waiting, done = orders
    html = admin_client.get(url(WorkflowInstance, "change", done)).content.decode()
    rows = rows_of(html)
    assert sorted(rows) == list(range(1, 11))
    assert "SIGNAL_APPLIED paid" in rows[6]  # the signal's name
    assert "SIGNAL_APPLIED paid" in rows[7]  # the decision that applied it
    assert "DECISION_TAKEN → await_payment" in rows[4]  # the chosen target
    assert "WAITING for" in rows[5] and "paid" in rows[5]
    executor = WorkflowHistory.objects.get(workflow_id=done, sequence=3).executor_id
    assert executor
    # a step the executor ran reads as the executor, for the user who started it
    assert f"executor {executor}" in rows[3] and "for USER ann (ASSERTED)" in rows[3]
    actor_cell = cells(rows[3])[4]
    assert actor_cell.startswith(f"executor {executor}")
    assert actor_cell.index("USER ann") > actor_cell.index("wf-muted")  # only as "for ..."
    # the caller's own entries read as the caller
    assert "USER ann (ASSERTED)" in rows[1] and f"executor {executor}" not in rows[1]
    assert "USER bob (ASSERTED)" in rows[6] and f"executor {executor}" not in rows[6]
    # a decision's patch; timestamps to the millisecond
    assert "/reserved" in rows[3]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", rows[1])
    # every row of the history list says the same
    listing = admin_client.get(
        url(WorkflowHistory, "changelist"), {"workflow_id__exact": done}
    ).content.decode()
    assert "SIGNAL_APPLIED paid" in listing and "DECISION_TAKEN → await_payment" in listing
    assert f"executor {executor} (for USER ann (ASSERTED))" in listing
    assert re.search(r"\d\d:\d\d:\d\d\.\d{3}", listing)


def test_choosing_an_entry_shows_the_state_after_it_and_where_it_stood(admin_client, orders):
    _waiting, done = orders
    now = admin_client.get(url(WorkflowInstance, "change", done))
    html = now.content.decode()
    assert 'href="?at=3#state-at"' in html  # each decision-log entry is a plain link
    assert 'class="step kind-end current' in html or "current" in html
    past = admin_client.get(url(WorkflowInstance, "change", done), {"at": 3})
    page = past.content.decode()
    assert past.context["at"] == 3
    assert "State after entry #3" in page
    state_at = html_text.unescape(past.context["state_at"])
    assert '"reserved": true' in state_at and "amount_paid" not in state_at
    assert wf.state_at(done, 3) == {"amount": 7, "reserved": True}
    assert 'id="entry-3" class="wf-selected"' in page
    # the diagram of then: at entry 3 the instance stood at reserve, ship not yet visited
    svg = past.context["diagram"]
    assert svg.startswith("<svg")
    ship = re.search(r'<g class="([^"]*)"[^>]*data-step="ship"', svg).group(1)
    assert "visited" not in ship and "current" not in ship
    ship_now = re.search(r'<g class="([^"]*)"[^>]*data-step="ship"', now.context["diagram"])
    assert "visited" in ship_now.group(1)
    # the whole state after an entry, as JSON
    whole = admin_client.get(reverse("admin:vertique_workflow_state_at", args=[done, 3]))
    assert whole["Content-Type"] == "application/json"
    assert whole.json() == {"amount": 7, "reserved": True}


def test_the_diagram_marks_the_current_step(admin_client, orders):
    waiting, _done = orders
    response = admin_client.get(url(WorkflowInstance, "change", waiting))
    svg = response.context["diagram"]
    assert "<script" not in svg
    current = re.search(r'<g class="([^"]*)"[^>]*data-step="await_payment"', svg).group(1)
    assert "current" in current.split()
    assert svg in response.content.decode()  # inline, no external reference


def test_the_page_shows_commands_tasks_timers_branches_and_children(admin_client, orders):
    waiting, _done = orders
    add_timer_task_branch(waiting)
    response = admin_client.get(url(WorkflowInstance, "change", waiting))
    html = response.content.decode()
    assert [c["kind"] for c in response.context["commands"]] == ["START"]
    assert "Review the order" in html and "SIGNAL_TIMEOUT" in html
    assert [b["step"] for b in response.context["branches"]] == ["ship"]
    assert response.context["children"] == []
    assert 'id="workflow-actions"' in html  # the slot the actions fill
    assert "workflow_actions" in response.context
    assert '"amount": 5' in html_text.unescape(html)  # the state, readable


def test_children_are_listed(admin_client):
    parent = wf.start("parent", {"n": 3}, idempotency_key="parent-1")
    run_until_idle()
    [child] = wf.children(parent.id)
    response = admin_client.get(url(WorkflowInstance, "change", parent.id))
    assert [c["status"] for c in response.context["children"]] == ["WAITING"]
    assert url(WorkflowInstance, "change", child.id) in response.content.decode()
