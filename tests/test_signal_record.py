"""``signal()`` as one read and one pipeline (``store.signal_record``).

The lock and the write travel together; in the caller's transaction they
follow a savepoint of the signal's own. These tests hold what that must not
change: a refusal or an error writes nothing and leaves the caller's
transaction usable, a lost key race answers with the replay and leaves the
open-signal count as it was, and every write happens under the execution lock.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import table_counts
from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand, WorkflowCommandQueue
from vertique_workflow.store.commands import EXECUTION_LOCK_NAMESPACE
from vertique_workflow.testing import run_until_idle

from .executor_process import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

T = tables.sql_names()


def waiting_instance() -> Any:
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    return ref


def open_signals(ref: Any) -> int:
    return WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals


def lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0]


def test_a_refusal_at_the_cap_in_the_callers_transaction_leaves_it_usable():
    ref = waiting_instance()
    with override_settings(VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "OPEN_SIGNALS_CAP": 1}):
        wf.signal(ref.id, "extra", None, dedup_key="s1")
        before = table_counts()
        with transaction.atomic():
            mine = wf.start("order", {"amount": 1}, idempotency_key="callers-own-write")
            with pytest.raises(wf.WorkflowConflict, match="OPEN_SIGNALS_CAP"):
                wf.signal(ref.id, "extra", None, dedup_key="s2")
            assert not connection.needs_rollback
            assert wf.get(mine.id).status == "PENDING"  # the caller's transaction goes on
    after = table_counts()
    assert after["commands"] == before["commands"] + 1  # the caller's start only
    assert after["dedup"] == before["dedup"] + 1
    assert open_signals(ref) == 1


def test_a_lost_key_race_in_the_callers_transaction_is_the_replay_and_raises_nothing():
    """The second signal reads before the first commits, then waits for its lock."""
    ref = waiting_instance()
    outcome = race_a_second_signal(ref, in_transaction=True)
    assert outcome["receipt"].duplicate and outcome["usable"]
    assert WorkflowCommand.objects.filter(workflow_id=ref.id, kind="SIGNAL").count() == 1
    assert open_signals(ref) == 1


def test_a_lost_key_race_outside_a_transaction_leaves_the_count_as_it_was():
    ref = waiting_instance()
    outcome = race_a_second_signal(ref, in_transaction=False)
    assert outcome["receipt"].duplicate
    assert open_signals(ref) == 1


def race_a_second_signal(ref: Any, *, in_transaction: bool) -> dict[str, Any]:
    """Signal "extra" with key "one" twice: the second from a thread, while the first commits.

    The second reads before the first has committed and then waits for the
    execution lock the first holds; the first commits once it waits. The
    second's ``receipt`` and (in a transaction) whether its caller's
    transaction was ``usable`` after it.
    """
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            with transaction.atomic() if in_transaction else contextlib.nullcontext():
                outcome["receipt"] = wf.signal(ref.id, "extra", None, dedup_key="one")
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                    outcome["usable"] = cursor.fetchone() == (1,)
        except Exception as exc:  # the assertion below names it
            outcome["error"] = exc
        finally:
            connections.close_all()

    with transaction.atomic():
        first = wf.signal(ref.id, "extra", None, dedup_key="one")
        racing = threading.Thread(target=second)
        racing.start()
        wait_until(lambda: lock_waiters() >= 1, what="the second signal waits for the lock")
    racing.join(60)
    assert not racing.is_alive()
    assert "error" not in outcome, outcome
    assert not first.duplicate
    return outcome


def test_a_lock_timeout_in_the_callers_transaction_leaves_it_usable_and_writes_nothing(holder):
    ref = waiting_instance()
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(%s::text))",
        [EXECUTION_LOCK_NAMESPACE, str(ref.id)],
    )
    before = table_counts()
    short = {**settings.VERTIQUE_WORKFLOW, "LOCK_TIMEOUT_MS": 100}
    with override_settings(VERTIQUE_WORKFLOW=short), transaction.atomic():
        with pytest.raises(wf.WorkflowPersistenceError) as failed:
            wf.signal(ref.id, "extra", None, dedup_key="s1")
        assert failed.value.retryable
        assert not connection.needs_rollback
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    assert table_counts() == before
    assert open_signals(ref) == 0


def test_the_signals_writes_wait_for_a_running_segments_lock(holder):
    """Nothing of the signal is written before the execution lock is granted."""
    ref = waiting_instance()
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(%s::text))",
        [EXECUTION_LOCK_NAMESPACE, str(ref.id)],
    )
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["receipt"] = wf.signal(ref.id, "extra", None, dedup_key="s1")
        finally:
            connections.close_all()

    sending = threading.Thread(target=send)
    sending.start()
    wait_until(lambda: lock_waiters() >= 1, what="the signal waits for the execution lock")
    # the queue row is not locked by the waiting signal: the holder can update it
    holder.execute(
        f"UPDATE {T['command_queues']} SET open_signals = open_signals WHERE workflow_id = %s",
        [ref.id],
    )
    holder.commit()
    sending.join(60)
    assert not sending.is_alive()
    assert outcome["receipt"].command_id is not None
    assert open_signals(ref) == 1
