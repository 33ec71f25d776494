"""The real ``workflow_executor`` command in subprocesses: many workers, crashes, signals."""

from __future__ import annotations

import signal
import threading

import pytest
from django.db import connections

import vertique_workflow as wf
from tests.conftest import connect
from tests.executor_process import ExecutorProcess, server_query, wait_until
from tests.flows.models import Shipment
from tests.flows.workflows import GATE_LOCK_KEY
from vertique_workflow import probe, tables
from vertique_workflow.models import WorkflowCommand, WorkflowHistory, WorkflowInstance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T = tables.sql_names()
FAST = {"POLL_INTERVAL_MS": 200, "LEASE_SECONDS": 2, "SHUTDOWN_GRACE_SECONDS": 30}


def statuses() -> dict[str, int]:
    return dict(server_query(f"SELECT status, count(*) FROM {T['instances']} GROUP BY 1"))


def listener_pids() -> list[int]:
    return [
        row[0]
        for row in server_query(
            "SELECT pid FROM pg_stat_activity WHERE query = %s",
            (f"LISTEN {tables.NOTIFY_CHANNEL}",),
        )
    ]


def gate_waiters() -> int:
    rows = server_query(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
        (GATE_LOCK_KEY,),
    )
    return rows[0][0]


class Gate:
    """The test's session-level hold on the advisory lock GatedFlow's action waits for."""

    def __init__(self) -> None:
        self.conn = connect(connections["default"].settings_dict["NAME"], autocommit=True)
        self.conn.execute("SELECT pg_advisory_lock(%s)", (GATE_LOCK_KEY,))

    def open(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (GATE_LOCK_KEY,))
        self.conn.close()


def test_two_processes_run_500_instances_with_concurrent_signals_exactly_once():
    count = 500
    refs = [wf.start("order", {"amount": 5}, idempotency_key=f"k{i}").id for i in range(count)]

    def send_signals() -> None:
        try:
            for index, instance_id in enumerate(refs):
                wf.signal(instance_id, "paid", {"amount_paid": 5}, dedup_key=f"s{index}")
        finally:
            connections.close_all()

    # no lease expiry is needed here: a 2 s lease would let a starved worker's
    # claim be taken over (CI shares 2 cores), which this test does not measure
    steady = {**FAST, "LEASE_SECONDS": 60}
    with (
        ExecutorProcess("--concurrency", "4", settings=steady) as first,
        ExecutorProcess("--concurrency", "4", settings=steady) as second,
    ):
        sender = threading.Thread(target=send_signals)
        sender.start()
        sender.join(600)
        wait_until(
            lambda: statuses().get("COMPLETED") == count,
            timeout=600,  # a hang guard only; progress is what is awaited
            what="every instance COMPLETED",
            process=first,
        )
        for executor in (first, second):
            executor.wait_running()  # a late one would not have its SIGTERM handler yet
        assert first.stop() == 0, first.log
        assert second.stop() == 0, second.log
        logs = first.log + second.log

    assert statuses() == {"COMPLETED": count}
    commands = list(WorkflowCommand.objects.values_list("workflow_id", "seq", "kind", "state"))
    assert len(commands) == 2 * count
    assert {state for *_, state in commands} == {"COMPLETE"}
    # each start and each signal applied once
    for event in ("WORKFLOW_STARTED", "SIGNAL_APPLIED", "WORKFLOW_COMPLETED"):
        per_instance = set(
            WorkflowHistory.objects.filter(event_type=event).values_list("workflow_id", flat=True)
        )
        assert len(per_instance) == count, event
        assert WorkflowHistory.objects.filter(event_type=event).count() == count, event
    # per-instance order: the START completed before the signal was applied
    for instance_id in refs[:50]:
        ordered = list(
            WorkflowCommand.objects.filter(workflow_id=instance_id)
            .order_by("settled_at")
            .values_list("seq", flat=True)
        )
        assert ordered == [1, 2]
    # both processes worked, nothing deadlocked, nothing is left to claim
    assert "completed=" in first.log and "completed=" in second.log
    assert "deadlock" not in logs.lower()
    report = probe.report()
    assert report.idle and not report.claimable and not report.in_flight and not report.stuck


def test_kill_9_mid_segment_loses_nothing_and_applies_once():
    gate = Gate()
    ref = wf.start("gated", {}, idempotency_key="k1")
    with ExecutorProcess("--concurrency", "2", settings=FAST) as doomed:
        wait_until(
            lambda: gate_waiters() == 1, what="the segment to block in its action", process=doomed
        )
        doomed.kill()
    # the orphaned backend finishes its lock wait, fails to answer its dead client
    # and rolls the segment back
    gate.open()
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
    with ExecutorProcess("--concurrency", "2", "--until-idle", settings=FAST) as survivor:
        assert survivor.wait(120) == 0, survivor.log
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("COMPLETE", 2)
    assert wf.get(ref.id).status == "COMPLETED"
    assert Shipment.objects.filter(order_ref=str(ref.id)).count() == 1
    assert (
        WorkflowHistory.objects.filter(
            workflow_id=ref.id, step_id="pass_gate", event_type="DECISION"
        ).count()
        == 1
    )


def test_an_idle_executor_is_woken_by_the_notification_not_the_poll():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    one_hour = str(3_600_000)
    with ExecutorProcess(
        "--concurrency", "2", "--poll-interval", one_hour, settings=FAST
    ) as executor:
        wait_until(
            lambda: statuses().get("WAITING") == 1, what="the start to run", process=executor
        )
        wait_until(listener_pids, what="the listener", process=executor)
        wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
        # far less than the one-hour poll interval: only the notification can do
        # it (the bound leaves room for a loaded machine, not for a poll)
        wait_until(
            lambda: statuses().get("COMPLETED") == 1,
            timeout=300,
            what="the signal to be applied",
            process=executor,
        )
        assert executor.stop() == 0, executor.log


def test_listener_loss_degrades_to_polling_with_one_warning_and_recovers():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    with ExecutorProcess("--concurrency", "2", settings=FAST) as executor:
        pid = wait_until(listener_pids, what="the listener", process=executor)[0]
        server_query("SELECT pg_terminate_backend(%s)", (pid,))
        wf.signal(ref.id, "first", None, dedup_key="s1")
        wait_until(
            lambda: WorkflowInstance.objects.get(pk=ref.id).current_step_id == "wait_second",
            what="work to go on by polling",
            process=executor,
        )
        new_pid = wait_until(
            lambda: [p for p in listener_pids() if p != pid],
            what="the listener to come back",
            process=executor,
        )[0]
        assert new_pid != pid
        wf.signal(ref.id, "second", None, dedup_key="s2")
        wait_until(lambda: statuses().get("COMPLETED") == 1, what="completion", process=executor)
        assert executor.stop() == 0
        log = executor.log
    assert log.count("command listener lost") == 1, log
    assert "OperationalError" in log or "AdminShutdown" in log
    assert "127.0.0.1" not in log.split("command listener lost")[1].splitlines()[0]
    assert "command listener recovered" in log


def test_sigterm_lets_the_running_segment_commit_and_exits_0():
    gate = Gate()
    ref = wf.start("gated", {}, idempotency_key="k1")
    with ExecutorProcess("--concurrency", "2", settings=FAST) as executor:
        wait_until(lambda: gate_waiters() == 1, what="the segment to block", process=executor)
        executor.send(signal.SIGTERM)
        gate.open()
        assert executor.wait(60) == 0, executor.log
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("COMPLETE", 1)
    assert wf.get(ref.id).status == "COMPLETED"
    assert Shipment.objects.filter(order_ref=str(ref.id)).count() == 1


def test_a_node_without_the_definition_defers_and_a_node_with_it_runs():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    with ExecutorProcess(
        "--until-idle", settings=FAST, env={"VERTIQUE_TEST_HIDE_WORKFLOWS": "order:1"}
    ) as old_node:
        assert old_node.wait(60) == 0, old_node.log
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.deferral_count, command.attempts) == ("DEFERRED", 1, 0)
    assert command.last_error.startswith("NOT_RUNNABLE: ")
    assert wf.get(ref.id).status == "PENDING"
    assert list(
        WorkflowHistory.objects.filter(workflow_id=ref.id).values_list("event_type", flat=True)
    ) == ["COMMAND_DEFERRED"]
    # the deferral is min(5 s * 2^0, 5 min) from the deferring transaction's now().
    # That instant lies between the command's recording and the statement that
    # wrote the COMMAND_DEFERRED entry in the same transaction (created_at is
    # statement_timestamp()), so both bounds are database-clock facts; the gap
    # from recorded_at alone would include the executor's start-up.
    bounds = server_query(
        f"SELECT c.recorded_at + interval '5 seconds' <= c.available_at, "
        f"c.available_at <= h.created_at + interval '5 seconds', "
        f"c.recorded_at, c.available_at, h.created_at FROM {T['commands']} c "
        f"JOIN {T['history']} h ON h.command_id = c.id AND h.event_type = 'COMMAND_DEFERRED' "
        "WHERE c.id = %s",
        (command.id,),
    )
    assert [row[:2] for row in bounds] == [(True, True)], bounds
    # let that time pass
    WorkflowCommand.objects.filter(pk=command.pk).update(available_at=command.recorded_at)
    with ExecutorProcess("--until-idle", settings=FAST) as new_node:
        assert new_node.wait(60) == 0, new_node.log
    assert wf.get(ref.id).status == "WAITING"


def test_a_second_signal_exits_at_once_and_the_lease_covers_the_segment():
    gate = Gate()
    ref = wf.start("gated", {}, idempotency_key="k1")
    with ExecutorProcess("--concurrency", "1", settings=FAST) as executor:
        wait_until(lambda: gate_waiters() == 1, what="the segment to block", process=executor)
        executor.send(signal.SIGTERM)
        wait_until(
            lambda: "a second signal exits at once" in executor.log,
            what="the first signal to be handled",
            process=executor,
        )
        executor.send(signal.SIGTERM)
        assert executor.wait(30) == 1, executor.log
        assert "second signal: exiting now" in executor.log
    gate.open()
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert command.state == "CLAIMED", "the interrupted segment never committed"
    # the lease (2 s) then lets another executor finish it, once
    wait_until(
        lambda: (
            server_query(f"SELECT count(*) FROM {T['commands']} WHERE lease_until < now()")[0][0]
            == 1
        ),
        what="the lease to expire",
    )
    with ExecutorProcess("--until-idle", settings=FAST) as survivor:
        assert survivor.wait(60) == 0, survivor.log
    assert wf.get(ref.id).status == "COMPLETED"
    assert Shipment.objects.filter(order_ref=str(ref.id)).count() == 1
