"""Timers and tasks with real ``workflow_executor`` processes: crashes, races, sleeping."""

from __future__ import annotations

import datetime

import pytest
from django.db import connections

import vertique_workflow as wf
from tests.conftest import connect
from tests.executor_process import ExecutorProcess, server_query, wait_until
from vertique_workflow import tables
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.testing import advance_time

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T = tables.sql_names()
FAST = {"POLL_INTERVAL_MS": 200, "LEASE_SECONDS": 2, "SHUTDOWN_GRACE_SECONDS": 30}


def run_to_idle(*args: str) -> None:
    with ExecutorProcess("--until-idle", *args, settings=FAST) as executor:
        assert executor.wait(120) == 0, executor.log


def test_kill_9_between_the_reservation_and_the_segment_loses_nothing():
    ref = wf.start("review", {"manager": "ann"}, idempotency_key="k1")
    run_to_idle()
    task = WorkflowTask.objects.get(workflow_id=ref.id)
    wf.complete_task(task.id, "approve", idempotency_key="c1")  # reservation committed
    # the completion's segment cancels the task's timers first: hold their rows so it
    # blocks there, mid-segment, holding the execution lock
    holder = connect(connections["default"].settings_dict["NAME"])
    holder.execute(f"SELECT id FROM {T['timers']} WHERE task_id = %s FOR UPDATE", (task.id,))
    with ExecutorProcess("--concurrency", "2", settings=FAST) as doomed:
        wait_until(
            lambda: (
                server_query(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE %s",
                    (f"%{tables.TIMERS}%",),
                )[0][0]
                == 1
            ),
            what="the completion's segment to block on the timer rows",
            process=doomed,
        )
        doomed.kill()
    holder.rollback()
    holder.close()
    wait_until(
        lambda: (
            server_query(
                f"SELECT count(*) FROM {T['commands']} "
                "WHERE state = 'CLAIMED' AND lease_until < now()"
            )[0][0]
            == 1
        ),
        what="the dead executor's lease to expire",
    )
    task.refresh_from_db()
    assert task.status == "COMPLETING", "the reservation survived the crash"
    run_to_idle()
    command = WorkflowCommand.objects.get(workflow_id=ref.id, kind="COMPLETION")
    assert (command.state, command.attempts) == ("COMPLETE", 2)
    task.refresh_from_db()
    assert (task.status, task.decision) == ("COMPLETED", "approve")
    view = wf.get(ref.id)
    assert (view.status, view.state["outcome"]) == ("COMPLETED", "approved")
    assert (
        WorkflowHistory.objects.filter(workflow_id=ref.id, event_type="TASK_COMPLETED").count() == 1
    )


def test_signals_recorded_before_their_timeouts_win_whichever_executor_runs_first():
    refs = [wf.start("receipt-wait", {}, idempotency_key=f"k{i}") for i in range(20)]
    run_to_idle()
    for i, ref in enumerate(refs):
        wf.signal(ref.id, "receipt", {"url": f"r{i}"}, dedup_key=f"r{i}")
    assert advance_time("7d") == 20  # every timeout due, after its signal's recording
    with (
        ExecutorProcess("--concurrency", "4", "--until-idle", settings=FAST) as one,
        ExecutorProcess("--concurrency", "4", "--until-idle", settings=FAST) as two,
    ):
        assert one.wait(120) == 0, one.log
        assert two.wait(120) == 0, two.log
    for i, ref in enumerate(refs):
        view = wf.get(ref.id)
        assert (view.status, view.state.get("url"), view.state.get("expired")) == (
            "COMPLETED",
            f"r{i}",
            None,
        )
    assert set(WorkflowTimer.objects.values_list("status", flat=True)) == {"CANCELLED"}


def test_an_idle_executor_fires_a_timer_at_its_time_never_before():
    slow_poll = {**FAST, "POLL_INTERVAL_MS": 600_000}
    with ExecutorProcess("--concurrency", "1", settings=slow_poll) as executor:
        now = server_query("SELECT clock_timestamp()")[0][0]
        ref = wf.start(
            "alarm", {"at": (now + datetime.timedelta(seconds=2)).isoformat()}, idempotency_key="k1"
        )
        wait_until(
            lambda: WorkflowInstance.objects.get(pk=ref.id).status == "COMPLETED",
            timeout=120,
            what="the timer to fire (the poll interval is ten minutes)",
            process=executor,
        )
        assert executor.stop() == 0
    timer = WorkflowTimer.objects.get(workflow_id=ref.id)
    command = WorkflowCommand.objects.get(pk=timer.command_id)
    fired = WorkflowHistory.objects.get(workflow_id=ref.id, event_type="TIMER_FIRED")
    assert timer.status == "FIRED"
    assert command.settled_at >= timer.fire_at
    assert fired.created_at >= timer.fire_at, "never before its time (database clock)"
