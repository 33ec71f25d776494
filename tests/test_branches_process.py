"""Branches driven by real ``workflow_executor`` processes: two executors, cancel, kill -9."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connections

import vertique_workflow as wf
from tests.conftest import connect
from tests.executor_process import ExecutorProcess, server_query, wait_until
from tests.flows.models import Shipment
from tests.flows.workflows import GATE_LOCK_KEY
from vertique_workflow import tables
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowHistory,
    WorkflowJoinState,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T = tables.sql_names()
FAST = {"POLL_INTERVAL_MS": 200, "LEASE_SECONDS": 2, "SHUTDOWN_GRACE_SECONDS": 30}
# no lease expiry wanted: a 2 s lease would let a starved worker's claim be taken
# over (CI shares 2 cores), which the two-executor test does not measure
STEADY = {**FAST, "LEASE_SECONDS": 60}
WIDTH = 24


def run_to_idle(*args: str, settings: dict[str, Any] = FAST) -> None:
    with ExecutorProcess("--until-idle", *args, settings=settings) as executor:
        assert executor.wait(300) == 0, executor.log


def history(instance: Any, event: str, **filters: Any) -> list[WorkflowHistory]:
    return list(WorkflowHistory.objects.filter(workflow_id=instance, event_type=event, **filters))


def open_commands() -> list[tuple[Any, ...]]:
    return server_query(
        f"SELECT workflow_id, kind, state FROM {T['commands']} "
        "WHERE state IN ('PENDING', 'CLAIMED', 'DEFERRED', 'DEAD')"
    )


def assert_no_executor_error(log: str) -> None:
    for marker in ("Traceback", " ERROR ", " WARNING ", " CRITICAL "):
        assert marker not in log, log
    assert "deadlock" not in log.lower(), log


def test_two_executors_drive_the_branches_of_one_instance_once_even_with_a_cancel():
    items = list(range(WIDTH))
    joined = wf.start("signalled-fan", {"items": items}, idempotency_key="joined").id
    cancelled = wf.start("signalled-fan", {"items": items}, idempotency_key="cancelled").id
    run_to_idle()
    for instance in (joined, cancelled):
        assert set(
            WorkflowBranchToken.objects.filter(workflow_id=instance).values_list(
                "status", flat=True
            )
        ) == {"WAITING"}
    for item in items:
        wf.signal(joined, "go", None, dedup_key=f"go-{item}", branch=("spread", str(item)))
    # the last branch of the other instance gets no signal: it cannot complete, so
    # the cancel (sent while the executors apply its other branches) always wins
    for item in items[:-1]:
        wf.signal(cancelled, "go", None, dedup_key=f"go-{item}", branch=("spread", str(item)))
    cancel_result: list[bool] = []

    def cancel_mid_drain() -> None:
        try:
            # once the executors are applying the second instance's branches
            wait_until(
                lambda: WorkflowHistory.objects.filter(
                    workflow_id=cancelled, event_type="SIGNAL_APPLIED"
                ).exists(),
                timeout=300,
                what="a branch of the instance to cancel to be applied",
            )
            cancel_result.append(wf.cancel(cancelled, reason="withdrawn"))
        finally:
            connections.close_all()

    with (
        ExecutorProcess("--concurrency", "4", settings=STEADY) as first,
        ExecutorProcess("--concurrency", "4", settings=STEADY) as second,
    ):
        canceller = threading.Thread(target=cancel_mid_drain)
        canceller.start()
        canceller.join(600)
        assert cancel_result, "the cancel did not return"
        wait_until(
            lambda: not open_commands(),
            timeout=600,  # a hang guard only; progress is what is awaited
            what="every command settled",
            process=first,
        )
        for executor in (first, second):
            executor.wait_running()  # a late one would not have its SIGTERM handler yet
        assert first.stop() == 0, first.log
        assert second.stop() == 0, second.log
        logs = first.log + second.log
    assert_no_executor_error(logs)
    assert "completed=" in first.log and "completed=" in second.log

    # the instance nobody cancelled: every branch applied once, the join decided once
    assert wf.get(joined).status == "COMPLETED"
    assert wf.get(joined).state["joined"] == {str(i): i for i in items}
    tokens = WorkflowBranchToken.objects.filter(workflow_id=joined)
    assert sorted(t.branch_id for t in tokens) == sorted(str(i) for i in items)
    assert {t.status for t in tokens} == {"COMPLETED"}
    applied = Counter(e.payload_json["branchId"] for e in history(joined, "SIGNAL_APPLIED"))
    assert applied == {str(i): 1 for i in items}
    finished = Counter(
        e.payload_json["branchId"] for e in history(joined, "BRANCH_DECISION", step_id="finish")
    )
    assert finished == {str(i): 1 for i in items}
    assert len(history(joined, "DECISION", outcome="JOINED")) == 1
    assert len(history(joined, "WORKFLOW_COMPLETED")) == 1
    join = WorkflowJoinState.objects.get(workflow_id=joined)
    assert join.decided is True
    assert sorted(a["branchId"] for a in join.arrived_json) == sorted(str(i) for i in items)
    # each segment ran once, on its first attempt: none was rolled back by a conflict
    # with a segment of the other executor (the execution lock serialises them)
    assert set(
        WorkflowCommand.objects.filter(workflow_id=joined).values_list("state", "attempts")
    ) == {("COMPLETE", 1)}

    # the instance cancelled while the executors applied its branches
    assert cancel_result == [True]
    assert wf.get(cancelled).status == "CANCELLED"
    tokens = WorkflowBranchToken.objects.filter(workflow_id=cancelled)
    assert tokens.count() == WIDTH
    applied = Counter(e.payload_json["branchId"] for e in history(cancelled, "SIGNAL_APPLIED"))
    assert set(applied.values()) <= {1}, "no branch applied twice"
    by_status = {t.branch_id: t.status for t in tokens}
    assert by_status[str(items[-1])] == "SUPERSEDED"
    assert {b for b, s in by_status.items() if s == "COMPLETED"} == set(applied)
    assert {b for b, s in by_status.items() if s != "COMPLETED"} == {
        str(i) for i in items if str(i) not in applied
    }
    assert set(by_status.values()) <= {"COMPLETED", "SUPERSEDED"}
    states = Counter(
        WorkflowCommand.objects.filter(workflow_id=cancelled).values_list("state", flat=True)
    )
    # the START and each applied signal completed; every other signal was cancelled
    # (or, claimed before the cancel and run after it, settled without effect)
    assert states["COMPLETE"] == 1 + len(applied), states
    assert set(states) <= {"COMPLETE", "CANCELLED", "STALE"}, states
    assert set(
        WorkflowCommand.objects.filter(workflow_id=cancelled, state="COMPLETE").values_list(
            "attempts", flat=True
        )
    ) == {1}
    assert sum(states.values()) == WIDTH, states
    assert not history(cancelled, "DECISION", outcome="JOINED")
    assert not WorkflowJoinState.objects.get(workflow_id=cancelled).decided
    assert len(history(cancelled, "WORKFLOW_CANCELLED")) == 1


def gate_waiters() -> int:
    rows = server_query(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
        (GATE_LOCK_KEY,),
    )
    return rows[0][0]


def test_kill_9_mid_fan_out_loses_and_duplicates_nothing():
    width = 50
    gate = connect(connections["default"].settings_dict["NAME"], autocommit=True)
    gate.execute("SELECT pg_advisory_lock(%s)", (GATE_LOCK_KEY,))
    ref = wf.start(
        "gated-fan", {"items": list(range(width)), "gate_at": width // 2}, idempotency_key="k1"
    )
    with ExecutorProcess("--concurrency", "2", settings=FAST) as doomed:
        wait_until(
            lambda: gate_waiters() == 1,
            what="the START segment to block in the middle of its fan-out",
            process=doomed,
        )
        doomed.kill()
    # the orphaned backend finishes its lock wait, fails to answer its dead
    # client and rolls the whole segment back (branches, join, Shipments)
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_LOCK_KEY,))
    gate.close()
    wait_until(
        lambda: (
            server_query(
                f"SELECT count(*) FROM {T['commands']} WHERE state = 'CLAIMED' "
                "AND lease_until < now()"
            )[0][0]
            == 1
        ),
        what="the dead executor's lease to expire",
    )
    assert not WorkflowBranchToken.objects.filter(workflow_id=ref.id).exists()
    run_to_idle("--concurrency", "2")

    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("COMPLETE", 2)
    view = wf.get(ref.id)
    assert view.status == "COMPLETED"
    assert view.state["joined"] == {str(i): i for i in range(width)}
    tokens = WorkflowBranchToken.objects.filter(workflow_id=ref.id)
    assert tokens.count() == width
    assert sorted(t.branch_id for t in tokens) == sorted(str(i) for i in range(width))
    assert {t.status for t in tokens} == {"COMPLETED"}
    shipped = Counter(
        e.payload_json["branchId"] for e in history(ref.id, "BRANCH_DECISION", step_id="ship")
    )
    assert shipped == {str(i): 1 for i in range(width)}
    assert len(history(ref.id, "DECISION", outcome="JOINED")) == 1
    assert len(history(ref.id, "WORKFLOW_STARTED")) == 1
    assert WorkflowJoinState.objects.filter(workflow_id=ref.id).count() == 1
    rows = Counter(
        Shipment.objects.filter(order_ref__startswith=f"{ref.id}:").values_list(
            "order_ref", flat=True
        )
    )
    assert rows == {f"{ref.id}:{i}": 1 for i in range(width)}
