"""The segment's persist: which statement each command kind runs, and what it writes.

A settled SIGNAL leaves the open states, so its persist also lowers the
instance's open-signal count; every other kind runs the same statement
without that update (``store.segment.PERSIST``), since PostgreSQL would set
up the queue table's update on every execution even when it writes nothing.
The statement text is read off the wire: each prepared statement is parsed
once per connection, so a fresh connection shows which one a segment ran.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import vertique_workflow as wf
from vertique_workflow.executor.segment import run_next
from vertique_workflow.models import WorkflowCommand, WorkflowCommandQueue
from vertique_workflow.tables import sql_names

from .wire import client_trace

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = sql_names()["command_queues"]


def open_signals(workflow_id: Any) -> int:
    return WorkflowCommandQueue.objects.get(workflow_id=workflow_id).open_signals


def persist_statements(trace: str) -> list[str]:
    """The texts of the persist statements parsed in ``trace`` (one per line of the trace)."""
    flat = " ".join(trace.split())
    return flat.split("WITH inst AS (")[1:]


def test_a_start_runs_the_persist_without_the_queue_update_and_a_signal_lowers_its_count():
    ref = wf.start("billing", {}, idempotency_key="p1")
    connection.close()  # a fresh connection parses each prepared statement it runs
    start_trace = client_trace(lambda: run_next("n1"))
    assert wf.get(ref.id).status == "WAITING"
    (start_persist,) = persist_statements(start_trace)
    assert QUEUES not in start_persist

    wf.signal(ref.id, "charge", None, dedup_key="c1")
    assert open_signals(ref.id) == 1
    signal_trace = client_trace(lambda: run_next("n1"))
    signal = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
    assert signal.state == "COMPLETE"
    assert open_signals(ref.id) == 0  # the applied signal released its slot
    (signal_persist,) = persist_statements(signal_trace)
    assert QUEUES in signal_persist and "open_signals" in signal_persist
