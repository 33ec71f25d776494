"""run_until_idle() in users' own tests, including the plain (one transaction) kind."""

from __future__ import annotations

import pytest

import vertique_workflow as wf
from vertique_workflow import probe
from vertique_workflow.testing import advance_time, run_until_idle


@pytest.mark.django_db
def test_starts_and_signals_run_inside_one_test_transaction():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(ref.id).status == "WAITING"
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(ref.id).status == "COMPLETED"
    assert probe.is_idle()


@pytest.mark.django_db(transaction=True)
def test_run_until_idle_reports_each_outcome_and_stops_at_idle():
    first = wf.start("order", {"amount": 0}, idempotency_key="k1")
    second = wf.start("two-waits", {}, idempotency_key="k2")
    report = run_until_idle()
    assert report.count("COMPLETED") == 2
    assert wf.get(first.id).status == "COMPLETED"
    assert wf.get(second.id).current_step == "wait_first"
    assert run_until_idle().outcomes == []


# The worked example of docs/testing.md ("Time skipping: a workflow that waits
# three days"), kept here word for word so the document cannot rot.
@pytest.mark.django_db(transaction=True)
def test_an_unanswered_review_escalates_after_three_days():
    ref = wf.start("review", {"manager": "ann"}, idempotency_key="t-review")
    run_until_idle()
    task = wf.tasks(assignee="ann", status="OPEN").items[0]
    assert run_until_idle().outcomes == []  # nothing is due: the timers wait

    assert advance_time("2d", instance_id=ref.id) == 2  # the reminders after 1d and 2d
    run_until_idle()
    assert wf.get_task(task.id).status == "OPEN"  # reminded, still open

    assert advance_time("1d", instance_id=ref.id) == 1  # the due date, 3d
    run_until_idle()
    view = wf.get(ref.id)
    assert (view.status, view.state["outcome"]) == ("COMPLETED", "escalated")
    assert wf.get_task(task.id).status == "CANCELLED"
    outcomes = [entry["outcome"] for entry in wf.history_of(ref.id)]
    assert outcomes.count("TASK_REMINDED") == 2
    assert outcomes.count("TASK_DUE") == 1


@pytest.mark.django_db(transaction=True)
def test_advancing_three_days_at_once_fires_the_reminders_then_the_due_date():
    ref = wf.start("review", {"manager": "ann"}, idempotency_key="t-review")
    run_until_idle()
    assert advance_time("3d", instance_id=ref.id) == 3
    run_until_idle()
    assert wf.get(ref.id).state["outcome"] == "escalated"
    task_outcomes = [
        entry["outcome"]
        for entry in wf.history_of(ref.id)
        if entry["outcome"] in ("TASK_REMINDED", "TASK_DUE")
    ]
    assert task_outcomes == ["TASK_REMINDED", "TASK_REMINDED", "TASK_DUE"]
