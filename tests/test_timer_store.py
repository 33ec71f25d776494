"""The timer store: a timer row and its TIMER command recorded together, guarded status
changes, cancellation with the command in one statement, and time skipping."""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.db import transaction

import vertique_workflow as wf
from tests.conftest import received_until_sentinel
from vertique_workflow.models import WorkflowCommand, WorkflowTimer
from vertique_workflow.store import commands, db, timers
from vertique_workflow.store.timers import TimerConflict, TimerSpec
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

SENTINEL = "sentinel"


def waiting_instance(key: str = "t1") -> uuid.UUID:
    ref = wf.start("order", {"amount": 5}, idempotency_key=key)
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    return ref.id


def db_clock() -> datetime.datetime:
    return db.fetchone("SELECT clock_timestamp()")[0]


def spec(**kwargs) -> TimerSpec:
    values = {"timer_id": uuid.uuid4(), "step_id": "await_payment", "purpose": "STEP"}
    values.update(kwargs)
    if "fire_at" not in values and "delay_seconds" not in values:
        values["delay_seconds"] = 3600
    return TimerSpec(**values)


def claimable_ids() -> set[int]:
    return {head.id for head in commands.peek(100)}


def test_record_writes_timer_and_command_with_one_database_fire_time():
    workflow_id = waiting_instance()
    before = db_clock()
    with transaction.atomic():
        [(command_id, fire_at)] = timers.record(
            workflow_id, [spec(delay_seconds=90, metadata={"context": {"tenant": "t"}})]
        )
    after = db_clock()
    command = WorkflowCommand.objects.get(pk=command_id)
    timer = WorkflowTimer.objects.get(command_id=command_id)
    assert (command.kind, command.state, command.timer_kind) == ("TIMER", "PENDING", "FIRE")
    assert command.timer_id == timer.id
    assert command.fire_at == command.available_at == timer.fire_at == fire_at
    assert before <= command.recorded_at <= after
    assert command.fire_at - command.recorded_at == datetime.timedelta(seconds=90)
    assert (command.actor_kind, command.actor_reason, command.attribution_status) == (
        "SYSTEM",
        "timer",
        "VERIFIED",
    )
    assert command.context_json is None
    assert (timer.status, timer.purpose, timer.step_id) == ("SCHEDULED", "STEP", "await_payment")
    assert timer.metadata == {"context": {"tenant": "t"}}


def test_a_past_instant_counts_as_the_recording_time():
    workflow_id = waiting_instance()
    before = db_clock()
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    [(command_id, fire_at)] = timers.record(workflow_id, [spec(fire_at=past)])
    command = WorkflowCommand.objects.get(pk=command_id)
    assert fire_at >= before
    assert command.fire_at == command.recorded_at == fire_at
    # a future instant is kept as given
    future = db_clock() + datetime.timedelta(days=3)
    [(_, fire_at)] = timers.record(workflow_id, [spec(fire_at=future)])
    assert fire_at == future


def test_several_specs_take_consecutive_positions_in_order():
    workflow_id = waiting_instance()
    task_id = uuid.uuid4()
    specs = [
        spec(purpose="TASK_DUE", task_id=task_id, delay_seconds=300),
        spec(purpose="TASK_REMINDER", task_id=task_id, delay_seconds=100),
        spec(
            purpose="SIGNAL_TIMEOUT",
            delay_seconds=200,
            target={"stepId": "await_payment", "signalNames": ["paid"]},
        ),
    ]
    recorded = timers.record(workflow_id, specs)
    rows = [WorkflowCommand.objects.get(pk=command_id) for command_id, _ in recorded]
    assert [r.timer_id for r in rows] == [s.timer_id for s in specs]
    assert [r.timer_kind for r in rows] == ["DUE", "REMINDER", "TIMEOUT"]
    seqs = [r.seq for r in rows]
    assert seqs == list(range(seqs[0], seqs[0] + 3))
    assert rows[2].target_json == {"stepId": "await_payment", "signalNames": ["paid"]}
    assert [r.task_id for r in rows] == [task_id, task_id, None]
    # one clock read for the whole list
    assert len({r.recorded_at for r in rows}) == 1
    # and the queue moved past them: the next command takes the following position
    receipt = wf.signal(workflow_id, "paid", {"amount_paid": 5}, dedup_key="s1")
    assert WorkflowCommand.objects.get(pk=receipt.command_id).seq == seqs[0] + 3


def test_timer_is_not_claimable_before_its_time_and_is_after_make_due():
    workflow_id = waiting_instance()
    [(command_id, _)] = timers.record(workflow_id, [spec(delay_seconds=3 * 86400)])
    assert command_id not in claimable_ids()
    assert timers.make_due(workflow_id) == 1
    assert command_id in claimable_ids()
    command = WorkflowCommand.objects.get(pk=command_id)
    timer = WorkflowTimer.objects.get(command_id=command_id)
    assert command.fire_at == command.available_at == timer.fire_at
    assert timer.status == "SCHEDULED"
    # nothing left to move
    assert timers.make_due(workflow_id) == 0


def test_make_due_with_an_advance_moves_only_the_timers_within_it():
    workflow_id = waiting_instance()
    (soon, _), (later, _) = timers.record(
        workflow_id, [spec(delay_seconds=3600), spec(delay_seconds=3 * 86400)]
    )
    assert timers.make_due(workflow_id, advance=datetime.timedelta(hours=2)) == 1
    assert soon in claimable_ids()
    assert later not in claimable_ids()
    assert timers.make_due(workflow_id, advance=datetime.timedelta(days=4)) == 1
    # due now, queued behind the first (a due timer blocks the ones after it)
    assert WorkflowCommand.objects.get(pk=later).available_at <= db_clock()
    assert later not in claimable_ids()
    WorkflowCommand.objects.filter(pk=soon).update(state="COMPLETE")
    assert later in claimable_ids()


def test_make_due_inside_an_open_transaction_is_due_for_that_transaction():
    workflow_id = waiting_instance()
    with transaction.atomic():
        [(command_id, _)] = timers.record(workflow_id, [spec(delay_seconds=60)])
        timers.make_due(workflow_id)
        assert command_id in claimable_ids()


def test_mark_fired_twice_raises_a_transient_conflict():
    workflow_id = waiting_instance()
    timer = spec()
    timers.record(workflow_id, [timer])
    timers.mark_fired(timer.timer_id)
    assert timers.get(timer.timer_id).status == "FIRED"
    with pytest.raises(TimerConflict) as raised:
        timers.mark_fired(timer.timer_id)
    assert db.sqlstate(raised.value) == "40001"
    assert db.is_retryable(raised.value)
    with pytest.raises(TimerConflict):
        timers.mark_fired(uuid.uuid4())


def test_get_reads_every_column():
    workflow_id = waiting_instance()
    task_id, token = uuid.uuid4(), uuid.uuid4()
    timer = spec(
        purpose="TASK_DUE",
        task_id=task_id,
        branch_token_id=token,
        fork_step_id="fork",
        branch_id="b1",
        metadata={"k": 1},
    )
    [(command_id, fire_at)] = timers.record(workflow_id, [timer])
    row = timers.get(timer.timer_id)
    assert (row.workflow_id, row.purpose, row.status, row.task_id) == (
        workflow_id,
        "TASK_DUE",
        "SCHEDULED",
        task_id,
    )
    assert (row.branch_token_id, row.fork_step_id, row.branch_id) == (token, "fork", "b1")
    assert (row.metadata, row.command_id, row.fire_at) == ({"k": 1}, command_id, fire_at)
    assert timers.get(uuid.uuid4()) is None


def test_cancel_scheduled_cancels_timer_and_command_and_leaves_a_fired_timer_alone():
    workflow_id = waiting_instance()
    task_id = uuid.uuid4()
    fired, due, reminder = (
        spec(purpose="TASK_REMINDER", task_id=task_id),
        spec(purpose="TASK_DUE", task_id=task_id),
        spec(purpose="TASK_REMINDER", task_id=task_id),
    )
    other = spec(purpose="STEP")
    recorded = timers.record(workflow_id, [fired, due, reminder, other])
    timers.mark_fired(fired.timer_id)
    cancelled: list[dict] = []
    assert timers.cancel_scheduled(workflow_id, task_id=task_id, cancelled_commands=cancelled) == 2
    assert sorted(c["timer_id"] for c in cancelled) == sorted(
        [str(due.timer_id), str(reminder.timer_id)]
    )
    states = {
        c.timer_id: c for c in WorkflowCommand.objects.filter(id__in=[r[0] for r in recorded])
    }
    for cancelled_timer in (due, reminder):
        assert timers.get(cancelled_timer.timer_id).status == "CANCELLED"
        command = states[cancelled_timer.timer_id]
        assert command.state == "CANCELLED"
        assert command.claim_token is None and command.settled_at is not None
        assert command.last_error.startswith("TIMER_CANCELLED: ")
    assert timers.get(fired.timer_id).status == "FIRED"
    assert states[fired.timer_id].state == "PENDING"  # its own segment settles it
    assert timers.get(other.timer_id).status == "SCHEDULED"
    assert states[other.timer_id].state == "PENDING"
    # no history: the segment logs
    assert not [e for e in wf.history_of(workflow_id) if "TIMER" in e["event_type"]]


def test_cancel_scheduled_filters_and_keeps_the_callers_own_command():
    workflow_id = waiting_instance()
    timeout = spec(purpose="SIGNAL_TIMEOUT", step_id="await_payment")
    elsewhere = spec(purpose="SIGNAL_TIMEOUT", step_id="other")
    step_timer = spec(purpose="STEP", step_id="await_payment")
    (timeout_cmd, _), _, _ = timers.record(workflow_id, [timeout, elsewhere, step_timer])
    WorkflowCommand.objects.filter(pk=timeout_cmd).update(state="CLAIMED", claim_token=uuid.uuid4())
    assert (
        timers.cancel_scheduled(
            workflow_id,
            step_id="await_payment",
            purposes=["SIGNAL_TIMEOUT"],
            keep_command_id=timeout_cmd,
        )
        == 1
    )
    assert timers.get(timeout.timer_id).status == "CANCELLED"
    assert WorkflowCommand.objects.get(pk=timeout_cmd).state == "CLAIMED"
    assert timers.get(elsewhere.timer_id).status == "SCHEDULED"
    assert timers.get(step_timer.timer_id).status == "SCHEDULED"
    assert timers.cancel_scheduled(workflow_id, timer_ids=[step_timer.timer_id]) == 1
    assert timers.get(step_timer.timer_id).status == "CANCELLED"
    assert timers.get(elsewhere.timer_id).status == "SCHEDULED"


def test_timer_spec_needs_exactly_one_time():
    with pytest.raises(ValueError):
        TimerSpec(uuid.uuid4(), "s", "STEP", None, None)
    with pytest.raises(ValueError):
        TimerSpec(uuid.uuid4(), "s", "STEP", 5, datetime.datetime.now(datetime.UTC))
    with pytest.raises(ValueError):
        TimerSpec(uuid.uuid4(), "s", "NOPE", 5)


def test_record_and_make_due_notify_executors(listener):
    workflow_id = waiting_instance()
    received_until_sentinel(listener)
    [(command_id, fire_at)] = timers.record(workflow_id, [spec(delay_seconds=86400)])
    assert received_until_sentinel(listener) == [str(int(fire_at.timestamp() * 1000))]
    timers.make_due(workflow_id)
    command = WorkflowCommand.objects.get(pk=command_id)
    assert received_until_sentinel(listener) == [str(int(command.available_at.timestamp() * 1000))]
