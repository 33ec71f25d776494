"""Segments: transitions, history, ORM writes, parking, retries, dead letters, failures."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import history_events as events
from tests.flows.context import TENANT
from tests.flows.models import Shipment
from tests.flows.workflows import Gate
from vertique_workflow import probe, tables
from vertique_workflow.models import WorkflowCommand, WorkflowCommandQueue, WorkflowHistory
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]


def test_start_wait_signal_completes_with_the_complete_history():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    waiting = wf.get(ref.id)
    assert (waiting.status, waiting.current_step) == ("WAITING", "await_payment")
    assert waiting.state == {"amount": 5, "reserved": True}

    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1", actor=wf.Actor.user("bob"))
    report = run_until_idle()
    assert report.outcomes == ["COMPLETED"]
    done = wf.get(ref.id)
    assert (done.status, done.current_step) == ("COMPLETED", "done")
    assert done.state == {"amount": 5, "reserved": True, "amount_paid": 5, "shipped": True}
    assert done.completed_at is not None

    assert events(ref.id) == [
        "WORKFLOW_STARTED",
        "STATE_BASELINE",
        "DECISION",
        "DECISION",
        "DECISION",
        "SIGNAL_APPLIED",
        "DECISION",
        "DECISION",
        "DECISION",
        "WORKFLOW_COMPLETED",
    ]
    rows = list(WorkflowHistory.objects.filter(workflow_id=ref.id).order_by("sequence"))
    assert [r.sequence for r in rows] == list(range(1, 11))
    decisions = [r for r in rows if r.event_type == "DECISION"]
    assert [(r.step_id, r.outcome) for r in decisions] == [
        ("reserve", "ACTION_COMPLETED"),
        ("route", "DECISION_TAKEN"),
        ("await_payment", "WAITING"),
        ("await_payment", "SIGNAL_APPLIED"),
        ("ship", "ACTION_COMPLETED"),
        ("done", "COMPLETED"),
    ]
    assert decisions[0].patch_json == [{"op": "add", "path": "/reserved", "value": True}]
    assert decisions[1].patch_json == []
    assert all(r.entry_version == 2 for r in decisions)
    assert rows[1].payload_json == {"state": {"amount": 5}}
    commands = list(WorkflowCommand.objects.filter(workflow_id=ref.id).order_by("seq"))
    assert [(c.kind, c.state, c.attempts) for c in commands] == [
        ("START", "COMPLETE", 1),
        ("SIGNAL", "COMPLETE", 1),
    ]
    # attribution: entries carry the command, executor, pin and actor of their command
    start_entries = [r for r in rows if r.command_id == commands[0].id]
    signal_entries = [r for r in rows if r.command_id == commands[1].id]
    assert len(start_entries) + len(signal_entries) == len(rows)
    assert {(r.actor_kind, r.actor_id) for r in start_entries} == {("USER", "ann")}
    assert {(r.actor_kind, r.actor_id) for r in signal_entries} == {("USER", "bob")}
    assert all(r.executor_id and r.executor_id == commands[0].claimed_by for r in start_entries)
    assert {(r.definition_id, r.definition_version, r.plan_hash) for r in rows} == {
        ("order", 1, commands[0].workflow.plan_hash)
    }
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 0
    assert probe.is_idle()


def test_decision_log_replay_equals_the_live_state_after_every_entry():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    after_wait = WorkflowHistory.objects.filter(workflow_id=ref.id).order_by("-sequence")[0]
    assert wf.state_at(ref.id, after_wait.sequence) == wf.get(ref.id).state
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    run_until_idle()
    last = WorkflowHistory.objects.filter(workflow_id=ref.id).order_by("-sequence")[0]
    assert wf.state_at(ref.id, last.sequence) == wf.get(ref.id).state
    reserve = WorkflowHistory.objects.get(
        workflow_id=ref.id, step_id="reserve", event_type="DECISION"
    )
    assert wf.state_at(ref.id, reserve.sequence) == {"amount": 5, "reserved": True}


@override_settings(
    VERTIQUE_WORKFLOW={
        "REDACTED_FIELDS": ["amount_paid"],
        "BACKOFF_BASE_MS": 10,
        "BACKOFF_MAX_MS": 50,
    }
)
def test_redacted_fields_never_reach_history():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "paid", {"amount_paid": 123456}, dedup_key="s1")
    run_until_idle()
    assert wf.get(ref.id).state["amount_paid"] == 123456
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {tables.qualified(tables.HISTORY)} "
            "WHERE workflow_id = %s AND (payload_json::text LIKE '%%123456%%' "
            "OR patch_json::text LIKE '%%123456%%')",
            [ref.id],
        )
        assert cursor.fetchone()[0] == 0
    last = WorkflowHistory.objects.filter(workflow_id=ref.id).order_by("-sequence")[0]
    assert "amount_paid" not in wf.state_at(ref.id, last.sequence)


def test_orm_writes_of_an_action_commit_with_the_transition():
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    assert list(Shipment.objects.values_list("order_ref", "created_by_step")) == [("A-1", "create")]


def test_a_failing_segment_rolls_back_its_orm_writes_and_retries_with_backoff():
    Gate.fail_times = 2
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    report = run_until_idle()
    assert report.outcomes == ["RETRIED", "RETRIED", "COMPLETED"]
    assert Gate.calls == 3
    assert Shipment.objects.count() == 1, "the two failed attempts rolled back their writes"
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("COMPLETE", 3)
    assert wf.get(ref.id).status == "WAITING"


def test_last_error_names_the_step_and_reason_without_exception_text():
    Gate.fail_times = 1
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    from vertique_workflow.executor.segment import run_head
    from vertique_workflow.store import commands

    run_head(commands.peek(1)[0], "node-a")
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert command.state == "PENDING" and command.attempts == 1
    assert command.last_error == "STEP_FAILED: step 'create' raised an error (attempt 1 of 5)"
    assert "carrier unavailable" not in command.last_error
    assert "ImproperlyConfigured" not in command.last_error
    assert command.available_at > command.recorded_at


def test_dead_letter_after_max_attempts_fails_a_starts_instance():
    Gate.fail_times = 100
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    report = run_until_idle()
    # the fifth failed attempt spends the step's last attempt: dead-lettered at once
    assert report.outcomes == ["RETRIED"] * 4 + ["DEAD"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts, command.claim_token) == ("DEAD", 5, None)
    # the dead letter keeps the cause: the step and the last reason code
    assert command.last_error == (
        "ATTEMPTS_EXHAUSTED: step 'create' failed 5 of 5 attempts; last reason STEP_FAILED"
    )
    instance = wf.get(ref.id)
    assert (instance.status, instance.error_type) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    assert instance.current_step == "create"
    assert instance.state == {"ref": "A-1"}, "a START that never ran keeps its payload as state"
    assert events(ref.id) == ["COMMAND_DEAD_LETTERED", "FAILED"]
    failed = WorkflowHistory.objects.get(workflow_id=ref.id, event_type="FAILED")
    assert failed.step_id is None and failed.outcome == "FAILED"
    assert failed.payload_json["step"] == "create"
    assert (instance.dead_commands, instance.needs_attention) == (1, True)
    assert instance.last_failure.reason_code == "ATTEMPTS_EXHAUSTED"
    assert instance.last_failure.step == "create"
    assert Shipment.objects.count() == 0
    report = probe.report()
    assert [c["id"] for c in report.stuck] == [command.id]
    assert report.idle


def test_non_retryable_error_fails_the_instance_at_once():
    Gate.non_retryable = True
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["FAILED"]
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("FAILED", 1)
    # the reason code of NonRetryable and a fixed sentence; its detail stays in the log
    assert command.last_error == (
        "SHIPMENT_REFUSED: step 'create' failed and is not retried (attempt 1)"
    )
    instance = wf.get(ref.id)
    assert (instance.status, instance.error_type) == ("FAILED", "SHIPMENT_REFUSED")
    assert instance.error_message == command.last_error
    assert "carrier" not in instance.error_message
    assert (instance.current_step, instance.state) == ("create", {"ref": "A-1"})
    assert events(ref.id) == ["FAILED"]
    assert Shipment.objects.count() == 0


def test_fail_step_ends_the_instance_failed():
    ref = wf.start("expense-approval", {"amount": 500}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "reject", None, dedup_key="r1")
    run_until_idle()
    instance = wf.get(ref.id)
    assert (instance.status, instance.error_type, instance.current_step) == (
        "FAILED",
        "REJECTED",
        "rejected",
    )


def test_dataclass_state_round_trips():
    ref = wf.start("expense-approval", {"amount": 500}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "approve", {"by": "carol"}, dedup_key="a1")
    run_until_idle()
    instance = wf.get(ref.id)
    assert instance.status == "COMPLETED"
    assert instance.state == {"amount": 500, "approved": True, "approved_by": "carol"}


def test_parked_signal_is_applied_when_its_wait_arrives():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "second", None, dedup_key="s2")
    assert run_until_idle().outcomes == ["PARKED"]
    parked = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
    assert (parked.state, parked.attempts, parked.claim_token) == ("PARKED", 0, None)
    assert [c["id"] for c in probe.report().parked] == [parked.id]
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 1

    wf.signal(ref.id, "first", None, dedup_key="s1")
    assert run_until_idle().outcomes == ["COMPLETED", "COMPLETED"]
    instance = wf.get(ref.id)
    assert instance.status == "COMPLETED"
    assert instance.state["log"] == ["begin", "after_first"]
    assert events(ref.id).count("SIGNAL_PARKED") == 1
    assert events(ref.id).count("SIGNAL_APPLIED") == 2
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 0


def test_parked_signals_are_rejected_when_the_instance_ends():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "extra", None, dedup_key="x")
    wf.signal(ref.id, "first", None, dedup_key="s1")
    wf.signal(ref.id, "second", None, dedup_key="s2")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    extra = WorkflowCommand.objects.get(workflow_id=ref.id, dedup_key="x")
    assert extra.state == "REJECTED"
    assert extra.last_error.startswith("INSTANCE_ENDED: ")
    assert "COMMAND_REJECTED" in events(ref.id)
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 0


def test_cancel_settles_every_open_command():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "second", None, dedup_key="s2")
    run_until_idle()  # parked
    wf.signal(ref.id, "extra", None, dedup_key="x")  # pending
    assert wf.cancel(ref.id, reason="customer asked", actor=wf.Actor.user("ann"))
    instance = wf.get(ref.id)
    assert instance.status == "CANCELLED"
    states = dict(
        WorkflowCommand.objects.filter(workflow_id=ref.id).values_list("dedup_key", "state")
    )
    assert states == {"k1": "COMPLETE", "s2": "CANCELLED", "x": "CANCELLED"}
    cancelled = WorkflowCommand.objects.filter(workflow_id=ref.id, state="CANCELLED")
    assert all(c.last_error.startswith("INSTANCE_CANCELLED: ") for c in cancelled)
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 0
    assert events(ref.id)[-3:] == ["COMMAND_CANCELLED", "COMMAND_CANCELLED", "WORKFLOW_CANCELLED"]
    assert not wf.cancel(ref.id, reason="again")
    assert probe.is_idle()


def test_a_command_recorded_after_cancel_is_settled_cancelled_by_the_claim():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    wf.cancel(ref.id, reason="changed my mind")
    assert WorkflowCommand.objects.get(workflow_id=ref.id).state == "CANCELLED"
    assert run_until_idle().outcomes == []


def test_durable_context_reaches_the_action_and_identity_never_does():
    from vertique_workflow.context import register_durable, unregister_durable

    register_durable(TENANT)
    try:
        token = TENANT.set("acme")
        ref = wf.start("context-flow", {}, idempotency_key="k1")
        TENANT.reset(token)
        command = WorkflowCommand.objects.get(workflow_id=ref.id)
        assert command.context_json == {"context": {"tenant": "acme"}}
        run_until_idle()
        assert wf.get(ref.id).state == {"tenant": "acme"}
        assert TENANT.get() is None, "the executor unbinds the context after the segment"
    finally:
        unregister_durable("tenant")
    with pytest.raises(wf.WorkflowValidationError, match="reserved"):
        import contextvars

        register_durable(contextvars.ContextVar("identity"))


def test_statement_deadline_is_a_transient_retry_that_restores_the_attempt():
    from django.db import transaction

    from tests.conftest import connect
    from vertique_workflow.executor.segment import Claimed, run_claimed
    from vertique_workflow.pins import resident_plan
    from vertique_workflow.store import commands

    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    head = commands.peek(1)[0]
    with transaction.atomic():
        claim = commands.claim(
            head.id, head.workflow_id, node_id="n", lease_seconds=30, max_attempts=5
        )
    plan = resident_plan("order", 1)
    quick = {"SEGMENT_DEADLINE_MS": 1, "BACKOFF_BASE_MS": 10, "BACKOFF_MAX_MS": 50}
    # another session holds the execution lock: the segment's wait hits its deadline
    with (
        override_settings(VERTIQUE_WORKFLOW=quick),
        connect(connection.settings_dict["NAME"]) as other,
    ):
        other.execute(
            f"SELECT pg_advisory_xact_lock({commands.EXECUTION_LOCK_NAMESPACE}, "
            "hashtext(%s::text))",
            [str(ref.id)],
        )
        outcome = run_claimed(
            Claimed(head.id, head.workflow_id, claim.token, claim.attempts), plan, "n"
        )
    assert outcome.result == "RETRIED"
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts, command.transient_count) == ("PENDING", 0, 1)
    assert command.last_error.startswith("TRANSIENT_FAILURE: ")
    assert run_until_idle().outcomes == ["COMPLETED"]


def test_a_command_kind_this_release_cannot_run_is_deferred_not_failed():
    """MIGRATION commands wait for a release that runs them."""
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    WorkflowCommand.objects.create(
        workflow_id=ref.id, seq=2, kind="MIGRATION", target_json={"version": 2}, state="PENDING"
    )
    assert run_until_idle().outcomes == ["DEFERRED"]
    timer = WorkflowCommand.objects.get(workflow_id=ref.id, kind="MIGRATION")
    assert (timer.state, timer.deferral_count, timer.attempts) == ("DEFERRED", 1, 0)
    assert timer.last_error == "NOT_RUNNABLE: this release does not run MIGRATION commands yet"
    assert wf.get(ref.id).status == "WAITING"
    assert events(ref.id)[-1] == "COMMAND_DEFERRED"


def test_a_branch_addressed_signal_is_recorded_and_parked_until_branches_exist():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    receipt = wf.signal(ref.id, "first", None, dedup_key="b1", branch=("fork", "left"))
    command = WorkflowCommand.objects.get(pk=receipt.command_id)
    assert command.target_json == {"name": "first", "forkStepId": "fork", "branchId": "left"}
    assert run_until_idle().outcomes == ["PARKED"]
    assert wf.get(ref.id).current_step == "wait_first", "an instance-level wait ignores it"
    with pytest.raises(wf.WorkflowValidationError, match="branch"):
        wf.signal(ref.id, "first", None, dedup_key="b2", branch=("fork",))  # type: ignore[arg-type]
    wf.signal(ref.id, "first", None, dedup_key="s1")
    wf.signal(ref.id, "second", None, dedup_key="s2")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    command.refresh_from_db()
    assert command.state == "REJECTED"
