"""run_until_idle() in users' own tests, including the plain (one transaction) kind."""

from __future__ import annotations

import pytest

import vertique_workflow as wf
from vertique_workflow import probe
from vertique_workflow.testing import run_until_idle


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
