"""The executor's idle read, notification payloads, observers and the probe's reads.

Executors run in-process here, on a real LISTEN connection; the tests spy on
the worker's two reads (the peek and the delay read) through a queue and wait
on it, or on the executor's own "every worker waits" condition, never on a
clock.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import vertique_workflow as wf
from tests.conftest import connect
from tests.executor_process import server_query
from tests.wire import client_waits
from vertique_workflow import probe, tables
from vertique_workflow.executor import daemon, segment
from vertique_workflow.executor.daemon import SAMPLER_APPLICATION_NAME, Executor, ExecutorOptions
from vertique_workflow.executor.observers import ExecutorSnapshot
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.store import commands

pytestmark = pytest.mark.django_db(transaction=True)

T = tables.sql_names()
WAIT = 120  # seconds before a test gives up waiting (never a bound on the behaviour)


def make_command(available: str) -> WorkflowCommand:
    """A PENDING START command whose available_at is ``now() + available`` (SQL interval)."""
    instance = WorkflowInstance.objects.create(
        id=uuid.uuid4(), definition_id="d", definition_version=1, plan_hash="h", status="PENDING"
    )
    command = WorkflowCommand.objects.create(
        workflow=instance, seq=1, kind="START", state="PENDING"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['commands']} SET available_at = now() + %s::interval WHERE id = %s",
            [available, command.pk],
        )
    return command


def db_now_ms() -> int:
    return server_query("SELECT floor(extract(epoch FROM now()) * 1000)::bigint")[0][0]


# -- 5. the idle delay read ------------------------------------------------------------


def test_the_idle_read_answers_zero_when_a_command_is_already_available():
    assert commands.earliest_availability_delay_ms() is None  # nothing pending
    make_command("1 hour")
    future = commands.earliest_availability_delay_ms()
    assert future is not None and 3_000_000 < future <= 3_600_000
    make_command("-1 minute")  # overdue
    assert commands.earliest_availability_delay_ms() == 0
    delays = commands.availability_delays()
    # one clock sample answers both: available now, and the next future time
    assert delays.earliest == 0
    assert delays.next_future is not None and 3_000_000 < delays.next_future <= 3_600_000


def test_the_idle_read_answers_zero_for_an_overdue_command_alone():
    make_command("-5 seconds")
    assert commands.earliest_availability_delay_ms() == 0
    assert commands.availability_delays().next_future is None


def test_the_idle_read_measures_a_hint_on_the_database_clock():
    now_ms = db_now_ms()
    assert commands.availability_delays(now_ms - 1000).hint == 0
    later = commands.availability_delays(now_ms + 600_000).hint
    assert later is not None and 0 < later <= 600_000
    assert commands.availability_delays().hint is None


def test_the_idle_read_is_one_prepared_statement():
    """A worker reads it after every peek that found nothing: one round trip, planned once."""
    hint = db_now_ms()
    commands.availability_delays(hint)  # the first run prepares it
    assert client_waits(lambda: commands.availability_delays(hint)) == ["Sync"]


def claim_or_delays(hint_ms: int | None) -> commands.ClaimedCommand | commands.AvailabilityDelays:
    return commands.claim_next_or_delays(
        node_id="n1",
        lease_seconds=30,
        max_attempts=5,
        resident=[("default", "order", 1)],
        kinds=("START",),
        hint_ms=hint_ms,
    )


def test_a_notified_claim_claims_a_due_command_in_one_prepared_statement():
    """The notified worker's statement claims as claim_next does, in one round trip."""
    wf.start("order", {"amount": 5}, idempotency_key="warm")
    warm = claim_or_delays(db_now_ms())  # the first run prepares it
    assert isinstance(warm, commands.ClaimedCommand)
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    hint = db_now_ms()
    found: list[Any] = []
    waits = client_waits(lambda: found.append(claim_or_delays(hint)))
    assert waits == ["Sync"]
    claimed = found[0]
    assert isinstance(claimed, commands.ClaimedCommand)
    assert (claimed.workflow_id, claimed.kind, claimed.attempts) == (ref.id, "START", 1)
    assert (claimed.definition_id, claimed.definition_version) == ("order", 1)
    row = WorkflowCommand.objects.get(pk=claimed.id)
    assert (row.state, row.claimed_by, row.claim_token) == ("CLAIMED", "n1", claimed.token)
    # committed on its own: another session sees the claim
    seen = server_query(f"SELECT state FROM {T['commands']} WHERE id = %s", (claimed.id,))
    assert seen == [("CLAIMED",)]


def test_a_notified_claim_with_nothing_claimable_answers_the_delays_of_the_idle_read():
    make_command("1 hour")  # an instance of no resident plan: never claimed here
    now_ms = db_now_ms()
    for hint in (now_ms - 1000, now_ms + 600_000):
        delays = claim_or_delays(hint)
        assert isinstance(delays, commands.AvailabilityDelays)
        idle = commands.availability_delays(hint)
        assert delays.earliest is not None and 3_000_000 < delays.earliest <= 3_600_000
        assert delays.next_future is not None and 3_000_000 < delays.next_future <= 3_600_000
        assert idle.earliest is not None and idle.earliest <= delays.earliest  # read later
        assert (delays.hint == 0) == (hint < now_ms)
        assert delays.hint is not None and delays.hint <= 600_000
    assert WorkflowCommand.objects.get().state == "PENDING"  # nothing claimed or written


def test_a_notified_claim_leaves_a_busy_instance_to_the_peek_path():
    """A head whose execution lock is held is not claimed: the delays say it is due."""
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    with connect(connection.settings_dict["NAME"]) as holder:
        holder.execute(
            f"SELECT pg_advisory_xact_lock({commands.EXECUTION_LOCK_NAMESPACE}, "
            "hashtext(%s::text))",
            [str(ref.id)],
        )
        delays = claim_or_delays(db_now_ms())
        holder.rollback()
    assert isinstance(delays, commands.AvailabilityDelays)
    assert (delays.earliest, delays.hint) == (0, 0)
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("PENDING", 0)


# -- 6. notification payloads ------------------------------------------------------------


class Running:
    """An in-process executor whose peeks and delay reads are reported on a queue."""

    def __init__(self, executor: Executor, log: queue.Queue[tuple[str, str, Any, Any]]) -> None:
        self.executor = executor
        self.log = log

    def notify(self, payload: str) -> None:
        with connect(connection.settings_dict["NAME"], autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (tables.NOTIFY_CHANNEL, payload))

    def settle(self) -> list[tuple[str, str, Any, Any]]:
        """Wait until every worker waits with nothing pending; what they did until then."""
        assert self.executor.wait_for_waiting_workers(WAIT), "the workers never settled"
        events = []
        while True:
            try:
                events.append(self.log.get_nowait())
            except queue.Empty:
                return events

    def next_event(self, kind: str) -> tuple[str, str, Any, Any]:
        while True:
            event = self.log.get(timeout=WAIT)
            if event[0] == kind:
                return event


@pytest.fixture
def running(monkeypatch) -> Iterator[Running]:
    log: queue.Queue[tuple[str, str, Any, Any]] = queue.Queue()
    real_delays = commands.availability_delays
    real_run_next = segment.run_next

    def delays(hint_ms: int | None = None) -> commands.AvailabilityDelays:
        result = real_delays(hint_ms)
        log.put(("read", threading.current_thread().name, hint_ms, result))
        return result

    def run_next(*args: Any, **kwargs: Any) -> Any:
        log.put(("peek", threading.current_thread().name, None, None))
        return real_run_next(*args, **kwargs)

    def claim_notified(node_id: str, hint_ms: int | None) -> Any:
        result = real_claim_notified(node_id, hint_ms)
        log.put(("read", threading.current_thread().name, hint_ms, result))
        return result

    # spies only: the reads still run on PostgreSQL
    real_claim_notified = segment.claim_notified
    monkeypatch.setattr(commands, "availability_delays", delays)
    monkeypatch.setattr(daemon.segment, "run_next", run_next)
    monkeypatch.setattr(daemon.segment, "claim_notified", claim_notified)
    one_hour = 3600.0  # only a notification can wake a worker during a test
    executor = Executor(
        ExecutorOptions(concurrency=3, poll_interval=one_hour, stats_interval=0, grace_seconds=10)
    )
    started = threading.Event()
    thread = threading.Thread(target=executor.run, kwargs={"on_started": started.set})
    thread.start()
    try:
        assert started.wait(WAIT)
        assert executor.listener is not None and executor.listener.listening.wait(WAIT)
        run = Running(executor, log)
        run.settle()  # the start-up peeks, and the wake-up after LISTEN
        yield run
    finally:
        executor.stopping.set()
        executor.wake_all()
        thread.join(WAIT)


def test_a_non_digit_payload_wakes_one_worker_to_peek_now(running):
    running.notify("wake up")
    _, woken, _, _ = running.next_event("peek")
    events = running.settle()
    assert [e for e in events if e[0] == "peek"] == []  # nobody else peeked
    # the woken worker read the delays once after its peek, without a hint
    assert [(e[1], e[2]) for e in events if e[0] == "read"] == [(woken, None)]


def test_each_notification_wakes_a_different_waiting_worker(running):
    running.notify("one")
    first = running.next_event("peek")[1]
    running.settle()
    running.notify("two")
    second = running.next_event("peek")[1]
    running.settle()
    assert first != second  # round robin over the waiting workers


def test_a_future_time_payload_reschedules_one_worker_without_a_peek(running):
    hint = db_now_ms() + 600_000
    running.notify(str(hint))
    _, _, seen_hint, result = running.next_event("read")
    assert seen_hint == hint
    assert result.hint is not None and 0 < result.hint <= 600_000  # on the database clock
    events = running.settle()
    assert [e for e in events if e[0] == "peek"] == []  # nobody peeked for a future time
    assert [e for e in events if e[0] == "read"] == []  # nor read again: it waits


def test_a_due_time_payload_makes_the_worker_peek(running):
    hint = db_now_ms() - 1000
    running.notify(str(hint))
    _, woken, seen_hint, result = running.next_event("read")
    assert (seen_hint, result.hint) == (hint, 0)
    _, peeker, _, _ = running.next_event("peek")
    assert peeker == woken
    events = running.settle()
    assert [e for e in events if e[0] == "peek"] == []


def test_a_recorded_start_is_run_by_the_notification(running):
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    # the trigger's payload is the command's available time (already due): the
    # woken worker's one statement claims the start, with no peek or delay read first
    _, woken, seen_hint, result = running.next_event("read")
    assert seen_hint is not None
    assert isinstance(result, commands.ClaimedCommand) and result.workflow_id == ref.id
    _, peeker, _, _ = running.next_event("peek")  # after the segment, it looks for more
    assert peeker == woken
    running.settle()
    assert wf.get(ref.id).status == "WAITING"


# -- 7. observers and the queue sample ----------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.snapshots: list[tuple[ExecutorSnapshot, list[tuple[Any, ...]]]] = []
        self.completed = threading.Event()

    def on_snapshot(self, snapshot: ExecutorSnapshot) -> None:
        sampler = server_query(
            "SELECT state, xact_start FROM pg_stat_activity WHERE application_name = %s",
            (SAMPLER_APPLICATION_NAME,),
        )
        self.snapshots.append((snapshot, sampler))
        if snapshot.counters["completed"] >= 1 and not snapshot.final:
            self.completed.set()


def test_observers_receive_counters_and_the_queue_usage_sampled_outside_transactions(caplog):
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    recorder = Recorder()
    executor = Executor(
        ExecutorOptions(
            concurrency=1,
            poll_interval=0.05,
            stats_interval=3600,
            grace_seconds=10,
            observers=[recorder],
        )
    )
    thread = threading.Thread(target=executor.run)
    with caplog.at_level(logging.INFO, logger="vertique_workflow.executor"):
        thread.start()
        try:
            assert recorder.completed.wait(WAIT), "no snapshot counted the start"
        finally:
            executor.stopping.set()
            executor.wake_all()
            thread.join(WAIT)
    assert wf.get(ref.id).status == "WAITING"
    running = [snap for snap, _ in recorder.snapshots if not snap.final]
    assert len(running) >= 2  # one at start-up, one five seconds later
    for snap, sampler in recorder.snapshots:
        usage = snap.queue.notification_queue_usage
        assert usage is not None and 0.0 <= usage <= 1.0
        assert snap.queue.lag_seconds is not None and snap.queue.lag_seconds >= 0.0
        # its own connection, idle outside any transaction while observers run
        assert sampler == [("idle", None)]
    assert recorder.snapshots[-1][0].final
    assert recorder.snapshots[-1][0].counters["completed"] == 1
    # the counters line is one more observer: logged at shutdown
    lines = [r.getMessage() for r in caplog.records if "notify queue" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("claimed=1 completed=1")


def test_no_observer_no_sample(monkeypatch):
    sampled = threading.Event()
    monkeypatch.setattr(Executor, "sample_queue", lambda self: sampled.set())
    wf.start("order", {"amount": 5}, idempotency_key="k1")
    executor = Executor(
        ExecutorOptions(
            concurrency=1, poll_interval=0.05, until_idle=True, stats_interval=0, grace_seconds=10
        )
    )
    assert executor.run() == 0
    assert executor.stats.snapshot()["completed"] == 1
    assert not sampled.is_set()


# -- 8. the probe's reads ------------------------------------------------------------------


def test_the_probe_reads_committed_state_on_a_connection_of_its_own():
    with transaction.atomic():
        ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
        with CaptureQueriesContext(connection) as queries:
            assert probe.is_idle()  # the uncommitted START is not seen
            assert probe.report().claimable == []
        assert len(queries) == 0  # nothing ran on the caller's connection
        # the explicit test-helper path sees the caller's own rows
        assert not probe.is_idle(on_caller_connection=True)
        claimable = probe.report(on_caller_connection=True).claimable
        assert [c["workflow_id"] for c in claimable] == [ref.id]
    assert not probe.is_idle()
    assert [c["workflow_id"] for c in probe.report().claimable] == [ref.id]


def test_the_probe_judges_time_with_the_database_clock_not_the_callers_snapshot():
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            frozen = cursor.fetchone()[0]
        # the caller's now() stands at its transaction's start; the probe's does not
        assert probe.report().now > frozen


@pytest.mark.django_db(transaction=False)
def test_in_a_one_transaction_test_the_helper_reads_on_the_tests_connection():
    from vertique_workflow.testing import run_until_idle

    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    assert probe.is_idle()  # nothing of this test is committed
    assert not probe.is_idle(on_caller_connection=True)
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(ref.id).status == "WAITING"
    assert probe.report(on_caller_connection=True).idle


def test_digits_too_long_for_a_time_are_read_as_peek_now(running):
    running.notify("9" * 19)
    _, woken, _, _ = running.next_event("peek")
    events = running.settle()
    assert [(e[1], e[2]) for e in events if e[0] == "read"] == [(woken, None)]
