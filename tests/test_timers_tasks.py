"""Timers, signal timeouts and human tasks, end to end through the command log."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db import connection, transaction

import vertique_workflow as wf
from tests.conftest import history_events
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.testing import advance_time, run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def db_clock() -> datetime.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def start(definition: str, payload: Any = None, key: str = "k1") -> Any:
    ref = wf.start(definition, payload or {}, idempotency_key=key)
    run_until_idle()
    return ref.id


def test_a_timer_step_waits_then_fires_once_at_its_time():
    before = db_clock()
    instance = start("nap")
    assert wf.get(instance).status == "WAITING"
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    command = WorkflowCommand.objects.get(pk=timer.command_id)
    assert (timer.status, timer.purpose, command.kind, command.timer_kind) == (
        "SCHEDULED",
        "STEP",
        "TIMER",
        "FIRE",
    )
    assert timer.fire_at == command.fire_at == command.available_at
    assert timer.fire_at >= before + datetime.timedelta(hours=1)
    assert run_until_idle().outcomes == [], "not before its time"
    assert advance_time("1h") == 1
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state["woke"]) == ("COMPLETED", True)
    timer.refresh_from_db()
    assert timer.status == "FIRED"
    assert history_events(instance).count("TIMER_FIRED") == 1


def outcomes(instance: Any) -> list[str]:
    """The decision outcomes of an instance's history (TIMER_FIRED, TASK_REMINDED, ...)."""
    from vertique_workflow.models import WorkflowHistory

    return list(
        WorkflowHistory.objects.filter(workflow_id=instance, event_type="DECISION")
        .order_by("sequence")
        .values_list("outcome", flat=True)
    )


def command_of(timer: WorkflowTimer) -> WorkflowCommand:
    return WorkflowCommand.objects.get(pk=timer.command_id)


def test_a_timer_until_an_instant_in_the_past_fires_at_once():
    before = db_clock()
    instance = start("alarm", {"at": "2001-01-01T00:00:00+00:00"})
    view = wf.get(instance)
    assert (view.status, view.state["rang"]) == ("COMPLETED", True)
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    assert timer.status == "FIRED"
    assert timer.fire_at >= before, "a past instant counts as the recording time"


def test_a_timer_until_an_instant_waits_for_that_instant():
    at = db_clock() + datetime.timedelta(days=2)
    instance = start("alarm", {"at": at.isoformat()})
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    assert timer.fire_at == at
    assert advance_time("1d") == 0
    assert run_until_idle().outcomes == []
    assert advance_time("1d") == 1, "advancing twice by a day fires a two-day timer"
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(instance).status == "COMPLETED"


def test_a_wait_timeout_takes_the_on_timeout_path():
    instance = start("receipt-wait")
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    command = command_of(timer)
    assert (timer.purpose, command.timer_kind, timer.step_id) == (
        "SIGNAL_TIMEOUT",
        "TIMEOUT",
        "receipt",
    )
    assert command.target_json == {"stepId": "receipt", "signalNames": ["receipt"]}
    assert advance_time("7d") == 1
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state.get("expired")) == ("COMPLETED", True)
    timer.refresh_from_db()
    assert timer.status == "FIRED"
    assert "TIMED_OUT" in outcomes(instance)


def test_a_signal_cancels_the_waits_timeout_and_its_command():
    instance = start("receipt-wait")
    wf.signal(instance, "receipt", {"url": "r"}, dedup_key="r1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state.get("expired")) == ("COMPLETED", None)
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    command = command_of(timer)
    assert (timer.status, command.state) == ("CANCELLED", "CANCELLED")
    assert command.last_error.startswith("TIMER_CANCELLED: ")
    assert advance_time() == 0
    assert run_until_idle().outcomes == []


def test_a_signal_recorded_before_the_timeouts_fire_at_wins_although_the_timeout_is_due():
    from vertique_workflow.store import commands

    instance = start("receipt-wait")
    wf.signal(instance, "receipt", {"url": "r"}, dedup_key="r1")
    assert advance_time("7d") == 1  # the timeout is due now, after the signal's recording
    timeout = command_of(WorkflowTimer.objects.get(workflow_id=instance))
    heads = [head.id for head in commands.peek(16)]
    assert timeout.id not in heads, "held back while the signal is on its way"
    # even an executor that tries the timeout first cannot claim it
    with transaction.atomic():
        assert (
            commands.claim(timeout.id, instance, node_id="n", lease_seconds=30, max_attempts=5)
            is None
        )
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state.get("expired"), view.state.get("url")) == (
        "COMPLETED",
        None,
        "r",
    )
    timeout.refresh_from_db()
    assert timeout.state == "CANCELLED"


def test_a_timeout_due_before_the_signal_was_recorded_runs_first_and_the_signal_is_refused():
    instance = start("receipt-wait")
    assert advance_time("7d") == 1
    wf.signal(instance, "receipt", {"url": "late"}, dedup_key="r1")  # recorded after fire_at
    assert run_until_idle().outcomes == ["COMPLETED", "SETTLED"]
    view = wf.get(instance)
    assert (view.status, view.state.get("expired")) == ("COMPLETED", True)
    assert "url" not in view.state, "the late signal did not apply"
    late = WorkflowCommand.objects.get(workflow_id=instance, kind="SIGNAL")
    assert (late.state, late.last_error.split(":")[0]) == ("REJECTED", "INSTANCE_ENDED")


def review(manager: str = "ann", key: str = "k1") -> Any:
    instance = start("review", {"manager": manager}, key=key)
    assert wf.get(instance).status == "WAITING"
    return instance


def test_a_task_step_opens_its_task_with_people_decisions_and_timers():
    instance = review()
    task = WorkflowTask.objects.get(workflow_id=instance)
    assert (task.status, task.step_id, task.name, task.assignee) == (
        "OPEN",
        "review",
        "Review the claim",
        "ann",
    )
    assert task.candidates_json == {"users": [], "groups": ["reviewers"]}
    assert task.decisions_snapshot_json["reject"]["next"] == "rejected"
    assert "payloadSchema" in task.decisions_snapshot_json["reject"]
    assert "payloadSchema" not in task.decisions_snapshot_json["approve"]
    timers = list(WorkflowTimer.objects.filter(workflow_id=instance).order_by("fire_at"))
    assert [t.purpose for t in timers] == ["TASK_REMINDER", "TASK_REMINDER", "TASK_DUE"]
    assert {t.task_id for t in timers} == {task.id}
    assert task.due_at == timers[-1].fire_at
    seqs = [command_of(t).seq for t in timers]
    assert seqs == sorted(seqs), "queue order is fire-time order"


def test_reminders_fire_one_after_another_and_keep_the_task_open():
    instance = review()
    assert advance_time("1d") == 1
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert advance_time("1d") == 1
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert outcomes(instance).count("TASK_REMINDED") == 2
    task = WorkflowTask.objects.get(workflow_id=instance)
    assert task.status == "OPEN"
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "review")
    due = WorkflowTimer.objects.get(workflow_id=instance, purpose="TASK_DUE")
    assert due.status == "SCHEDULED"


def test_the_due_date_closes_the_task_and_takes_the_on_due_path():
    instance = review()
    assert advance_time() == 3, "every timer due now"
    assert run_until_idle().outcomes == ["COMPLETED"] * 3
    assert outcomes(instance).count("TASK_REMINDED") == 2, "the reminders ran first"
    assert "TASK_DUE" in outcomes(instance)
    view = wf.get(instance)
    assert (view.status, view.state["outcome"]) == ("COMPLETED", "escalated")
    assert WorkflowTask.objects.get(workflow_id=instance).status == "CANCELLED"
    with pytest.raises(wf.WorkflowConflict):
        wf.complete_task(
            WorkflowTask.objects.get(workflow_id=instance).id, "approve", idempotency_key="late"
        )


def test_completing_the_task_moves_on_and_cancels_its_timers():
    instance = review()
    task = WorkflowTask.objects.get(workflow_id=instance)
    receipt = wf.complete_task(task.id, "approve", idempotency_key="c1", actor=wf.Actor.user("ann"))
    task.refresh_from_db()
    assert (task.status, task.reservation_command_id) == ("COMPLETING", receipt.command_id)
    assert run_until_idle().outcomes == ["COMPLETED"]
    task.refresh_from_db()
    assert (task.status, task.decision) == ("COMPLETED", "approve")
    view = wf.get(instance)
    assert (view.status, view.state["outcome"]) == ("COMPLETED", "approved")
    timers = WorkflowTimer.objects.filter(workflow_id=instance)
    assert {t.status for t in timers} == {"CANCELLED"}
    assert {command_of(t).state for t in timers} == {"CANCELLED"}
    assert "TASK_COMPLETED" in history_events(instance)
    assert advance_time() == 0


def test_a_decision_payload_is_merged_into_the_state():
    instance = review()
    task = WorkflowTask.objects.get(workflow_id=instance)
    wf.complete_task(task.id, "reject", {"reason": "no receipt"}, idempotency_key="c1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.state["outcome"], view.state["reason"]) == ("rejected", "no receipt")
    task.refresh_from_db()
    assert task.result_json == {"reason": "no receipt"}


def test_due_and_reminder_timers_are_held_back_while_the_task_is_completing():
    from vertique_workflow.store import commands

    instance = review()
    task = WorkflowTask.objects.get(workflow_id=instance)
    wf.complete_task(task.id, "approve", idempotency_key="c1")
    assert advance_time() == 3
    heads = {head.kind for head in commands.peek(16)}
    assert heads == {"COMPLETION"}, "the due date and reminders wait for the completion"
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(instance).state["outcome"] == "approved"


def test_a_completion_against_a_stale_subject_version_is_rejected_and_reopens_the_task():
    instance = start("stable-review", {"rev": 2})
    task = WorkflowTask.objects.get(workflow_id=instance)
    assert task.require_version_stability is True
    wf.complete_task(task.id, "approve", idempotency_key="c1", subject_version=1)
    assert run_until_idle().outcomes == ["REJECTED"]
    task.refresh_from_db()
    assert (task.status, task.reservation_command_id) == ("OPEN", None)
    command = WorkflowCommand.objects.get(workflow_id=instance, kind="COMPLETION")
    assert command.state == "REJECTED"
    assert command.last_error.startswith("SUBJECT_VERSION_STALE: ")
    assert "COMMAND_REJECTED" in history_events(instance)
    assert wf.get(instance).status == "WAITING"
    wf.complete_task(task.id, "approve", idempotency_key="c2", subject_version=2)
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(instance).status == "COMPLETED"


def test_cancel_cancels_the_open_task_and_every_timer():
    instance = review()
    assert wf.cancel(instance, reason="withdrawn")
    task = WorkflowTask.objects.get(workflow_id=instance)
    assert task.status == "CANCELLED"
    timers = WorkflowTimer.objects.filter(workflow_id=instance)
    assert {t.status for t in timers} == {"CANCELLED"}
    assert {command_of(t).state for t in timers} == {"CANCELLED"}
    assert advance_time() == 0
    assert run_until_idle().outcomes == []


def test_a_timer_of_an_ended_instance_settles_stale():
    instance = start("nap")
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    # the instance ended behind the timer's back (an operator, a bug): the timer applies nowhere
    WorkflowInstance.objects.filter(pk=instance).update(status="COMPLETED")
    advance_time()
    assert run_until_idle().outcomes == ["SETTLED"]
    assert command_of(timer).state == "STALE"
    assert "COMMAND_STALE" in history_events(instance)


def test_a_timer_for_a_step_already_left_settles_stale():
    instance = start("receipt-wait")
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    # a wait left without cancelling its timeout (a row written before this release)
    WorkflowInstance.objects.filter(pk=instance).update(current_step_id="done")
    advance_time()
    assert run_until_idle().outcomes == ["SETTLED"]
    assert command_of(timer).state == "STALE"
    assert command_of(timer).last_error.startswith("TIMER_STALE: ")
    assert wf.get(instance).status == "WAITING"


def test_a_timer_of_a_failed_instance_is_parked_and_runs_after_the_retry():
    instance = start("receipt-wait")
    WorkflowInstance.objects.filter(pk=instance).update(
        status="FAILED", error_type="X", error_message="X: test"
    )
    advance_time()
    assert run_until_idle().outcomes == ["PARKED"]
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    assert (command_of(timer).state, timer.status) == ("PARKED", "SCHEDULED")
    wf.retry(instance)
    assert run_until_idle().outcomes[0] == "COMPLETED"
    view = wf.get(instance)
    assert (view.status, view.state.get("expired")) == ("COMPLETED", True)
    assert command_of(timer).state == "COMPLETE"
    assert set(
        WorkflowTimer.objects.filter(workflow_id=instance).values_list("status", flat=True)
    ) <= {"FIRED", "CANCELLED"}, "an ended instance leaves no timer scheduled"


def test_a_timer_stores_the_drives_durable_context_and_binds_it_when_it_fires():
    from tests.flows.context import TENANT
    from vertique_workflow.context import register_durable, unregister_durable

    register_durable(TENANT)
    try:
        token = TENANT.set("acme")
        try:
            ref = wf.start("timed-context", {}, idempotency_key="k1")
        finally:
            TENANT.reset(token)
        run_until_idle()
        timer = WorkflowTimer.objects.get(workflow_id=ref.id)
        assert timer.metadata == {"context": {"tenant": "acme"}}
        assert command_of(timer).context_json is None, "the TIMER command stores no context"
        advance_time()
        assert run_until_idle().outcomes == ["COMPLETED"]
        assert wf.get(ref.id).state["tenant"] == "acme"
    finally:
        unregister_durable("tenant")


def test_advancing_time_moves_the_tasks_due_date_with_its_due_timer():
    instance = review()
    task = WorkflowTask.objects.get(workflow_id=instance)
    due = WorkflowTimer.objects.get(workflow_id=instance, purpose="TASK_DUE")
    assert task.due_at == due.fire_at
    advance_time("1d")
    task.refresh_from_db()
    due.refresh_from_db()
    assert task.due_at == due.fire_at == command_of(due).fire_at
