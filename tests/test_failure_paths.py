"""Failure paths: lock timeouts, the segment deadline, lock order, retry policies.

Real connections and threads: a second session holds locks, the database
clock (``pg_locks.waitstart``) says how long a wait has lasted, and nothing
here bounds wall-clock time.
"""

from __future__ import annotations

import datetime
import threading
import uuid
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import connect, table_counts
from tests.flows.workflows import PROBE_LOCK_KEY, Blocking, Gate, PolicyFlow, Probes
from vertique_workflow.definitions import Retry, Step
from vertique_workflow.exceptions import NonRetryable, WorkflowPersistenceError
from vertique_workflow.executor import backoff
from vertique_workflow.executor.segment import run_head
from vertique_workflow.models import WorkflowCommand, WorkflowHistory
from vertique_workflow.store import commands
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]

SHORT_LOCKS = {"LOCK_TIMEOUT_MS": 100, "BACKOFF_BASE_MS": 10, "BACKOFF_MAX_MS": 50}


def session_lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        return cursor.fetchone()[0]


def hold_execution_lock(other: Any, instance_id: Any) -> None:
    other.execute(
        f"SELECT pg_advisory_lock({commands.EXECUTION_LOCK_NAMESPACE}, hashtext(%s::text))",
        [str(instance_id)],
    )


# -- defect 1: lock_timeout applies to the lock wait alone ---------------------


def test_a_callers_own_lock_timeout_survives_record_cancel_and_retry():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '123ms'")
        wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
        assert session_lock_timeout() == "123ms"
        wf.cancel(ref.id, reason="changed my mind")
        assert session_lock_timeout() == "123ms"
    Gate.non_retryable = True
    failed = wf.start("shipment", {"ref": "A"}, idempotency_key="k2")
    run_until_idle()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '77ms'")
        wf.retry(failed.id)
        assert session_lock_timeout() == "77ms"


def test_a_segment_runs_under_the_sessions_own_lock_timeout():
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '4321ms'")
    try:
        wf.start("lock-probe", {}, idempotency_key="k1")
        assert run_until_idle().outcomes == ["COMPLETED"]
        assert Probes.lock_timeouts == ["4321ms"], "the execution lock's timeout leaked"
        assert session_lock_timeout() == "4321ms"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


def wait_until_waiting_for(other: Any, lock_key: int, at_least_ms: int) -> None:
    """Block until a session has waited ``at_least_ms`` for the advisory lock (database clock)."""
    for _ in range(6000):
        row = other.execute(
            "SELECT COALESCE(max(extract(epoch FROM now() - waitstart) * 1000), -1) "
            "FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
            [lock_key],
        ).fetchone()
        if row[0] >= at_least_ms:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the action never waited on the lock")


def test_an_action_waiting_three_lock_timeouts_on_a_lock_completes_on_its_first_attempt():
    ref = wf.start("lock-probe", {"lock": True}, idempotency_key="k1")
    with (
        override_settings(VERTIQUE_WORKFLOW={**SHORT_LOCKS}),
        connect(connection.settings_dict["NAME"], autocommit=True) as other,
    ):
        other.execute("SELECT pg_advisory_lock(%s)", [PROBE_LOCK_KEY])
        waiter = connect(connection.settings_dict["NAME"], autocommit=True)

        def release_after_three_timeouts() -> None:
            wait_until_waiting_for(waiter, PROBE_LOCK_KEY, 3 * SHORT_LOCKS["LOCK_TIMEOUT_MS"])
            other.execute("SELECT pg_advisory_unlock(%s)", [PROBE_LOCK_KEY])

        releaser = threading.Thread(target=release_after_three_timeouts)
        releaser.start()
        try:
            outcomes = run_until_idle().outcomes
        finally:
            releaser.join(60)
            waiter.close()
    assert outcomes == ["COMPLETED"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.attempts, command.transient_count) == (1, 0)
    assert wf.get(ref.id).status == "COMPLETED"


def test_recording_against_a_running_segment_times_out_retryably_and_writes_nothing():
    ref = wf.start("blocking", {}, idempotency_key="k1")
    head = commands.peek(1)[0]
    segment = threading.Thread(target=lambda: (run_head(head, "n"), connections.close_all()))
    segment.start()
    assert Blocking.entered.wait(30), "the segment never started"
    try:
        before = table_counts()
        with override_settings(VERTIQUE_WORKFLOW={**SHORT_LOCKS}):
            with pytest.raises(WorkflowPersistenceError) as refused:
                wf.signal(ref.id, "go", None, dedup_key="g1")
            assert refused.value.retryable
            with pytest.raises(WorkflowPersistenceError) as cancel_refused:
                wf.cancel(ref.id, reason="too slow")
            assert cancel_refused.value.retryable
        assert table_counts() == before
    finally:
        Blocking.release.set()
        segment.join(60)
    assert wf.get(ref.id).status == "WAITING"


# -- defect 8: the segment deadline bounds the whole transaction ---------------


@pytest.mark.parametrize("how", ["small", "long"])
def test_a_segment_past_its_deadline_is_ended_and_retried_transiently(how: str):
    ref = wf.start("lock-probe", {}, idempotency_key=f"k-{how}")
    Probes.slow = how
    with override_settings(VERTIQUE_WORKFLOW={"SEGMENT_DEADLINE_MS": 300, **SHORT_LOCKS}):
        outcome = run_head(commands.peek(1)[0], "n")
    assert outcome.result == "RETRIED"
    if how == "small":
        assert 0 < Probes.iterations < 400, "the statements after the deadline were refused"
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts, command.transient_count) == ("PENDING", 0, 1)
    assert command.last_error == (
        "TRANSIENT_FAILURE: the segment passed its deadline of 300 ms (SEGMENT_DEADLINE_MS)"
    )
    # nothing of the segment committed, and its locks are gone
    assert WorkflowHistory.objects.filter(workflow_id=ref.id).count() == 0
    with connect(connection.settings_dict["NAME"], autocommit=True) as other:
        locked = other.execute(
            f"SELECT pg_try_advisory_lock({commands.EXECUTION_LOCK_NAMESPACE}, hashtext(%s::text))",
            [str(ref.id)],
        ).fetchone()[0]
        assert locked
    Probes.slow = ""
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(ref.id).state == {"probed": True}


# -- defect 10: failure dispositions take the execution lock first -------------


def test_a_failure_disposition_asks_for_the_execution_lock_before_any_row_lock():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    head = commands.peek(1)[0]
    with transaction.atomic():
        claim = commands.claim(
            head.id, head.workflow_id, node_id="n", lease_seconds=30, max_attempts=5
        )
    with connect(connection.settings_dict["NAME"]) as other:
        # another transaction holds the execution lock *and* the command's row
        hold_execution_lock(other, ref.id)
        other.execute(
            "SELECT id FROM " + commands.T["commands"] + " WHERE id = %s FOR UPDATE", [head.id]
        )
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            # a row lock taken first would wait here (and time out); the lock comes first
            assert commands.fail(head.id, claim.token, "X", "X: y", None) == "BUSY"
            assert commands.dead_letter(head.id, claim.token, "X: y", None) == "BUSY"
        other.rollback()
    command = WorkflowCommand.objects.get(pk=head.id)
    assert command.state == "CLAIMED"


# -- defect 7: retry policies --------------------------------------------------


def test_the_default_retry_policy_rides_out_a_few_minute_outage():
    with override_settings(
        VERTIQUE_WORKFLOW={"MAX_ATTEMPTS": 10, "BACKOFF_BASE_MS": 1000, "BACKOFF_MAX_MS": 120000}
    ):
        policy = backoff.effective(None)
        spans = [
            sum(policy.delay_seconds(n) for n in range(1, policy.max_attempts)) for _ in range(200)
        ]
    assert policy.max_attempts == 10
    assert all(183.5 <= span <= 367.0 for span in spans), (min(spans), max(spans))
    assert len({round(span, 3) for span in spans}) > 1, "the delays are jittered"


def test_the_settings_defaults_are_the_documented_policy():
    from vertique_workflow.conf import DEFAULTS

    assert (
        DEFAULTS["MAX_ATTEMPTS"].value,
        DEFAULTS["BACKOFF_BASE_MS"].value,
        DEFAULTS["BACKOFF_MAX_MS"].value,
    ) == (10, 1000, 120000)


def test_a_step_policy_is_part_of_the_plan_hash():
    plan = PolicyFlow.plan()
    step = plan.steps["flaky"]
    assert step.retry is not None and step.retry.max_attempts == 2
    assert plan.canonical()["steps"]["flaky"]["retry"] == {
        "initial_backoff_ms": 5,
        "max_attempts": 2,
        "never": ["builtins.KeyError"],
    }
    from dataclasses import replace

    other = replace(step, retry=Retry(max_attempts=3))
    changed = type(plan).from_steps(
        [other if s.id == "flaky" else s for s in plan.steps.values()],
        id=plan.id,
        version=plan.version,
        contract=plan.contract,
        start=plan.start,
    )
    assert changed.plan_hash != plan.plan_hash
    with pytest.raises(wf.WorkflowDefinitionError):
        Retry(max_attempts=0)
    with pytest.raises(wf.WorkflowDefinitionError):
        Retry(never=(int,))  # type: ignore[arg-type]
    with pytest.raises(wf.WorkflowDefinitionError, match="end steps take no retry"):
        type(plan).from_steps(
            [Step("s", "end", retry=Retry(max_attempts=2))],
            id="x",
            version=1,
            contract="x",
            start="s",
        )


def test_a_steps_max_attempts_dead_letters_it_early():
    Gate.fail_times = 100
    ref = wf.start("policy", {}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["RETRIED", "DEAD"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("DEAD", 2)
    assert command.last_error == (
        "ATTEMPTS_EXHAUSTED: step 'flaky' failed 2 of 2 attempts; last reason STEP_FAILED"
    )


def test_an_exception_class_the_policy_never_retries_fails_at_once():
    ref = wf.start("policy", {"raise": "key"}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["FAILED"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("FAILED", 1)
    assert command.last_error == "NON_RETRYABLE: step 'flaky' failed and is not retried (attempt 1)"
    assert "KeyError" not in command.last_error and "missing" not in command.last_error


def test_the_transient_backoff_grows_with_the_transient_count():
    wf.start("order", {"amount": 5}, idempotency_key="k1")
    head = commands.peek(1)[0]
    delays = []
    for count in range(4):
        WorkflowCommand.objects.filter(pk=head.id).update(
            transient_count=count, available_at=datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
        )
        with transaction.atomic():
            claim = commands.claim(
                head.id, head.workflow_id, node_id="n", lease_seconds=30, max_attempts=5
            )
            assert claim is not None and claim.outcome == "CLAIMED"
            commands.retry_transient(
                head.id, claim.token, "TRANSIENT_FAILURE: x", base_ms=1000, max_ms=120000
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT extract(epoch FROM available_at - now()) FROM "
                    + commands.T["commands"]
                    + " WHERE id = %s",
                    [head.id],
                )
                delays.append(float(cursor.fetchone()[0]))
    # available_at and now() above are both the claim transaction's own clock
    # (one transaction, one now()): the delay is the code's own arithmetic,
    # never the machine's speed.
    # jitter in [0.5, 1] of 1 s, 2 s, 4 s, 8 s: each band above the one before
    for count, delay in enumerate(delays):
        assert 0.5 * 2**count - 1e-3 <= delay <= 2**count + 1e-3, (count, delays)
    assert delays == sorted(delays)


def test_non_retryable_takes_a_validated_reason_code():
    assert NonRetryable("OUT_OF_STOCK").reason_code == "OUT_OF_STOCK"
    for bad in ("out of stock", "", "X" * 65, "1ABC", "card 4111 declined"):
        with pytest.raises(ValueError):
            NonRetryable(bad)
    assert str(NonRetryable("A_B", "detail")) == "A_B: detail"


def test_the_transient_retry_and_the_failure_texts_never_hold_exception_text():
    from tests.flows.workflows import Billing

    Billing.fail_times = 1
    ref = wf.start("billing", {}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "charge", None, dedup_key=str(uuid.uuid4()))
    run_head(commands.peek(1)[0], "n")
    command = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
    assert command.last_error == "STEP_FAILED: step 'charge' raised an error (attempt 1 of 5)"
    assert "secret-token" not in command.last_error


def test_what_the_code_raised_goes_to_the_log_with_instance_command_and_step(caplog):
    from tests.flows.workflows import Billing

    Billing.non_retryable = True
    ref = wf.start("billing", {}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "charge", None, dedup_key="c1")
    with caplog.at_level("ERROR", logger="vertique_workflow.executor"):
        assert run_until_idle().outcomes == ["FAILED"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    message = record.getMessage()
    assert str(ref.id) in message and f"command {command.id}" in message
    assert "step charge" in message and "CARD_DECLINED" in message
    assert "card 4111 1111 1111 1111 declined" in str(record.exc_info[1])
    assert "4111" not in command.last_error and "4111" not in wf.get(ref.id).error_message
