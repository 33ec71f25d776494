"""How many times a segment waits on the server, and a busy lock's way out.

Counted on the wire (``tests/wire.py``).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings

import vertique_workflow as wf
from vertique_workflow.executor.segment import Claimed, run_claimed, run_next
from vertique_workflow.models import WorkflowCommand
from vertique_workflow.pins import resident_plan
from vertique_workflow.store import commands
from vertique_workflow.tables import sql_names
from vertique_workflow.testing import run_until_idle

from .conftest import connect
from .test_stale_statistics import claim
from .test_tasks_record import wait_for_lock_waiters
from .wire import client_messages

pytestmark = pytest.mark.django_db(transaction=True)

T = sql_names()


def test_a_segment_waits_on_the_server_twice_after_its_claim():
    """claim; BEGIN + lock + fence and instance (one pipeline); persist + COMMIT (one pipeline).

    A regression guard. The lock and the fence go in one pipeline with the
    transaction's BEGIN (``segment.begin_fence_and_load``), sent on psycopg's
    libpq layer: psycopg's own pipeline was measured and dropped (0.36 vs 0.29
    ms of Python a segment for the 0.06 ms round trip it saved). The persist,
    the segment's last statement, carries the transaction's COMMIT.
    """
    wf.start("order", {"amount": 0}, idempotency_key="warm")
    run_until_idle()  # the statements are prepared on this connection from here on
    ref = wf.start("order", {"amount": 0}, idempotency_key="traced")
    messages = client_messages(lambda: run_next("n1"))
    assert wf.get(ref.id).status == "COMPLETED"
    waits = [kind for kind, _ in messages if kind in ("Sync", "Query")]
    assert waits == ["Sync", "Sync", "Sync"], messages
    last_pipeline = messages[[i for i, (kind, _) in enumerate(messages) if kind == "Sync"][-2] :]
    parsed = [text.strip() for kind, text in last_pipeline if kind == "Parse"]
    assert parsed[-1:] == ['"" "COMMIT" 0'], messages


def test_a_busy_execution_lock_fails_the_segment_retryably_and_leaves_the_session_usable():
    ref = wf.start("order", {"amount": 0}, idempotency_key="busy")
    plan = resident_plan("order", 1)
    claimed = claim()
    claim_ = Claimed(claimed.id, claimed.workflow_id, claimed.token, claimed.attempts, "START")
    with connect(connection.settings_dict["NAME"]) as holder:
        holder.execute(
            f"SELECT pg_advisory_xact_lock({commands.EXECUTION_LOCK_NAMESPACE}, "
            "hashtext(%s::text))",
            [str(ref.id)],
        )
        with override_settings(VERTIQUE_WORKFLOW={"LOCK_TIMEOUT_MS": 50}):
            outcome = run_claimed(claim_, plan, "n1")
        holder.rollback()
    assert outcome.result == "RETRIED"
    row = WorkflowCommand.objects.get(pk=claimed.id)
    assert (row.state, row.attempts, row.transient_count) == ("PENDING", 0, 1)
    assert row.last_error.startswith("TRANSIENT_FAILURE: database error 55P03")
    assert wf.get(ref.id).status == "PENDING"
    # the same session runs the retry
    WorkflowCommand.objects.filter(pk=claimed.id).update(available_at=Now())  # skip the backoff
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(ref.id).status == "COMPLETED"


def test_the_fence_in_the_lock_s_pipeline_reads_what_the_lock_s_last_holder_committed():
    """The lock and the fence share a pipeline, yet the fence reads after the lock is granted.

    A transaction holding the execution lock takes the claim away (a new
    token) and commits only once the segment waits for the lock: the fence
    must see the new token and give the command up (LOST), not run it on a
    snapshot from before the lock.
    """
    ref = wf.start("order", {"amount": 0}, idempotency_key="fence-after-lock")
    plan = resident_plan("order", 1)
    claimed = claim()
    claim_ = Claimed(claimed.id, claimed.workflow_id, claimed.token, claimed.attempts, "START")
    outcome: list = []

    def segment() -> None:
        try:
            outcome.append(run_claimed(claim_, plan, "n1"))
        finally:
            connection.close()

    with connect(connection.settings_dict["NAME"]) as holder:
        holder.execute(
            f"SELECT pg_advisory_xact_lock({commands.EXECUTION_LOCK_NAMESPACE}, "
            "hashtext(%s::text))",
            [str(ref.id)],
        )
        holder.execute(
            f"UPDATE {T['commands']} SET claim_token = gen_random_uuid() WHERE id = %s",
            [claimed.id],
        )
        worker = threading.Thread(target=segment)
        worker.start()
        wait_for_lock_waiters(1)
        holder.commit()
    worker.join()
    assert [o.result for o in outcome] == ["LOST"]
    assert wf.get(ref.id).status == "PENDING"  # nothing ran on the stale claim
