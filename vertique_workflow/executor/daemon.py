"""The executor process: N worker threads, one listener, signals, counters.

``manage.py workflow_executor`` builds an :class:`Executor` and calls
:meth:`Executor.run`. Each worker thread has its own Django connection and
loops peek → claim → segment; a segment that commits with its last write also
claims the worker's next command behind that commit, in the same round trip,
and the worker runs it next (released when the worker stops first). Workers
claim different instances in parallel; the head-of-queue rule keeps each
instance's commands in sequence. When nothing is claimable a worker sleeps
until the earliest future availability (read from the database clock), capped
by the poll interval, or until the listener wakes it. Each notification wakes
one waiting worker: a digits-only payload (the command's available time in
epoch ms) is compared with the database clock in that worker's delay read, and
the worker peeks only once it is due, otherwise it re-schedules its wait from
the delay read; any other payload makes it peek at once. See docs/executor.md,
"Wake-up".

Shutdown: the first SIGTERM/SIGINT stops claiming, lets running segments
finish within SHUTDOWN_GRACE_SECONDS, releases claims that did not start,
closes the listener and returns 0; a second signal exits at once (the leases
of what was running cover it). A worker that dies is logged and restarted.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from ..store import commands, db, wakeup
from ..store import probe as probe_reads
from . import segment
from .listener import CommandListener
from .observers import (
    QUEUE_SAMPLE_SECONDS,
    ExecutorObserver,
    ExecutorSnapshot,
    QueueSnapshot,
    StatsLogObserver,
)

logger = logging.getLogger("vertique_workflow.executor")

COUNTED = (
    "claimed",
    "completed",
    "parked",
    "deferred",
    "retried",
    "dead",
    "failed",
    "settled",
    "released",
    "lost",
)
OUTCOME_COUNTERS = {
    "COMPLETED": ("claimed", "completed"),
    "PARKED": ("claimed", "parked"),
    "DEFERRED": ("deferred",),
    "RETRIED": ("claimed", "retried"),
    "DEAD": ("dead",),
    "FAILED": ("claimed", "failed"),
    "SETTLED": ("settled",),
    "RELEASED": ("claimed", "released"),
    "LOST": ("claimed", "lost"),
    "REJECTED": ("claimed", "settled"),
}


@dataclass
class ExecutorOptions:
    concurrency: int = 4
    poll_interval: float = 1.0  # seconds
    until_idle: bool = False
    max_commands: int | None = None
    database: str = "default"
    stats_interval: float = 10.0
    grace_seconds: float = 30.0
    node_id: str = field(default_factory=segment.default_node_id)
    log_commands: bool = False  # -v 2: one line per command
    # serve the service outbox in a thread of this process (--no-relay: a
    # separate ``manage.py workflow_relay`` does it)
    relay: bool = True
    # called every QUEUE_SAMPLE_SECONDS (see executor/observers.py); the counters
    # log line is added as one more observer when stats_interval > 0
    observers: list[ExecutorObserver] = field(default_factory=list)


# The claim walks the queue oldest first past the heads it leaves to the
# general path (ended instances, commands out of attempts, plans this node
# lacks), and the general path otherwise runs only when the claim finds
# nothing: under steady work such heads would pile up in front, never cleared,
# each claim walking past all of them (12,000 of them made every claim take
# 56 ms). So one worker of each process takes the general path first once
# every GENERAL_PATH_EVERY seconds, batch after batch while it finds them (the
# outcomes of LEFT_TO_GENERAL_PATH), and while it does, every worker that
# comes to its claim joins it.
GENERAL_PATH_EVERY = 1.0  # seconds
LEFT_TO_GENERAL_PATH = frozenset({"DEFERRED", "SETTLED", "DEAD"})


# what a worker was woken for: PEEK (look for claimable work now), or the
# epoch-millisecond available time a notification carried
PEEK = "PEEK"


class Stats:
    """Thread-safe counters of what the workers did."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._handled = 0

    def record(self, outcome: str) -> None:
        with self._lock:
            self._handled += 1
            for name in OUTCOME_COUNTERS.get(outcome, ()):
                self._counts[name] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {name: self._counts[name] for name in COUNTED}

    @property
    def handled(self) -> int:
        """Commands handled (claimed, deferred, settled or dead-lettered), each once."""
        with self._lock:
            return self._handled


class Executor:
    """One executor process (see the module docstring)."""

    def __init__(self, options: ExecutorOptions) -> None:
        self.options = options
        self.stats = Stats()
        self.stopping = threading.Event()
        self._wakes: list[threading.Event] = []
        self._busy = [False] * options.concurrency
        self._threads: list[threading.Thread | None] = [None] * options.concurrency
        self._signals = 0
        self.listener: CommandListener | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting = [False] * options.concurrency
        self._asleep = [False] * options.concurrency  # inside wake.wait()
        self._pending: list[str | int | None] = [None] * options.concurrency
        # the command each worker's last segment claimed behind its commit, run next
        self._chained: list[commands.ClaimedCommand | None] = [None] * options.concurrency
        self._next_wake = 0
        self._general_path_at = 0.0  # monotonic: the next periodic turn of the general path
        self._observers: list[ExecutorObserver] = list(options.observers)
        if options.stats_interval > 0:
            self._observers.append(StatsLogObserver(options.stats_interval))
        self._sample_connection: Any = None

    # -- wake-up -------------------------------------------------------------------

    def wake_all(self) -> None:
        """Every worker peeks now (shutdown, and after the listener (re)connects)."""
        with self._lock:
            for index, event in enumerate(self._wakes):
                self._pending[index] = PEEK
                self._waiting[index] = False
                event.set()

    def on_notification(self, payload: str) -> None:
        """One notification wakes one waiting worker (round robin).

        A notification stands for one command, which one worker can claim, so
        waking every worker only makes the others peek for nothing. When no
        worker is waiting, nobody is woken: every worker is then running a
        segment or about to peek and read the delays, and the command was
        committed before its notification arrived, so that peek or read sees
        it. A digits-only payload (at most 18 digits, so it fits a bigint) is
        handed over as the available time; any other payload as PEEK.
        """
        digits = payload.isascii() and payload.isdigit() and len(payload) <= 18  # fits bigint
        hint: str | int = int(payload) if digits else PEEK
        with self._lock:
            count = len(self._wakes)
            for step in range(count):
                index = (self._next_wake + step) % count
                if self._waiting[index]:
                    self._next_wake = index + 1
                    self._waiting[index] = False
                    self._pending[index] = _merge(self._pending[index], hint)
                    self._wakes[index].set()
                    return

    def _mark_waiting(self, index: int) -> None:
        with self._lock:
            self._waiting[index] = True

    def _sleep(self, index: int, timeout: float) -> None:
        with self._lock:
            self._asleep[index] = True
            self._changed.notify_all()
        self._wakes[index].wait(timeout)
        with self._lock:
            self._asleep[index] = False

    def _take_wake(self, index: int) -> str | int | None:
        """What woke the worker (None: its wait timed out); it is no longer waiting."""
        with self._lock:
            pending = self._pending[index]
            self._pending[index] = None
            self._waiting[index] = False
            self._wakes[index].clear()
            return pending

    def wait_for_waiting_workers(self, timeout: float) -> bool:
        """Wait until every worker sleeps with no wake pending (for tests and embedders)."""

        def settled() -> bool:
            return all(self._asleep) and not any(e.is_set() for e in self._wakes)

        with self._changed:
            return self._changed.wait_for(settled, timeout)

    # -- workers ---------------------------------------------------------------------

    def _worker(self, index: int) -> None:
        """Peek, then wait for the delay read's schedule, the poll interval or a wake-up.

        ``deadline`` (monotonic) is the poll timeout, restarted by every peek
        that found nothing; a wake-up for a future available time keeps it and
        waits until min(deadline, the delay read's next availability). When the
        delay read says something is available (0) right after a peek found
        nothing, the worker peeks once more (a timer may have come due between
        the two statements); if that finds nothing either, what is available is
        behind a head in flight or held back, and the worker waits for the next
        future availability instead of spinning.

        A notification that carries an available time is answered with one
        statement (:meth:`_claim_notified`): it claims a due command at once,
        or reads the delays that schedule the worker, all on the database clock.
        """
        alias = self.options.database
        peek = True
        hint: int | None = None
        repeeked = False
        deadline = 0.0
        try:
            while not self.stopping.is_set():
                if self._budget_spent():
                    return
                try:
                    if peek:
                        if self._work_once(index):
                            repeeked = False
                            continue
                        deadline = time.monotonic() + self.options.poll_interval
                    # from here a notification may pick this worker; its wake is kept
                    self._mark_waiting(index)
                    if hint is None:
                        delays = commands.availability_delays()
                    else:
                        found = self._claim_notified(index, hint)
                        if found is None:
                            peek, hint, repeeked = True, None, False
                            continue
                        delays = found
                except DatabaseError as exc:
                    logger.warning(
                        "worker %s: database error %s; retrying after the poll interval",
                        index,
                        type(exc).__name__,
                    )
                    connections[alias].close()
                    self._take_wake(index)
                    self.stopping.wait(self.options.poll_interval)
                    peek, hint = True, None
                    continue
                if hint is not None and delays.hint == 0:
                    self._take_wake(index)
                    peek, hint, repeeked = True, None, False  # the hinted command is due
                    continue
                hint = None
                if delays.earliest == 0 and not repeeked:
                    self._take_wake(index)
                    peek, repeeked = True, True
                    continue
                until = deadline
                if delays.next_future is not None:
                    until = min(until, time.monotonic() + delays.next_future / 1000.0)
                self._sleep(index, max(0.0, until - time.monotonic()))
                woken = self._take_wake(index)
                if isinstance(woken, int):
                    peek, hint = False, woken  # an available time: claim, else the delays
                else:
                    peek, repeeked = True, False
        finally:
            self._release_chained(index)
            connections[alias].close()

    def _chain(self) -> bool:
        """Whether a segment claims the next command behind its commit (see ``_work_once``).

        Not under ``--max-commands`` (a claim past the budget would wait for
        its lease) and not once the process is stopping.
        """
        return self.options.max_commands is None and not self.stopping.is_set()

    def _release_chained(self, index: int) -> None:
        """A worker that stops returns the claim its last segment made and it did not run."""
        claimed, self._chained[index] = self._chained[index], None
        if claimed is None:
            return
        try:
            commands.release(claimed.id, claimed.token)
        except DatabaseError as exc:  # its lease covers it
            logger.warning(
                "worker %s: releasing command %s failed (%s); its lease expires",
                index,
                claimed.id,
                type(exc).__name__,
            )
            return
        self._record(segment.Outcome("RELEASED", claimed.id, claimed.workflow_id, claimed.kind))

    def _claim_notified(self, index: int, hint: int) -> commands.AvailabilityDelays | None:
        """Claim and run what a notification woke the worker for; else the delays.

        One statement claims a due command or, when the common path has
        nothing to claim, reads the delays (the hint's among them) on the
        database clock. None: a command ran, so the worker peeks again.
        """
        self._busy[index] = True
        try:
            found = segment.claim_notified(self.options.node_id, hint)
            if isinstance(found, commands.AvailabilityDelays):
                return found
            self._take_wake(index)  # it runs a segment now: not waiting any more
            outcome = segment.run_next_claimed(
                found, self.options.node_id, should_stop=self.stopping.is_set, chain=self._chain()
            )
        finally:
            self._busy[index] = False
        self._chained[index] = outcome.chained
        self._record(outcome)
        return None

    def _work_once(self, index: int) -> bool:
        """Run what is claimable now; False when nothing was.

        The common path's claim first; the general path when it claimed
        nothing, and once every ``GENERAL_PATH_EVERY`` seconds (one worker of
        the process, joined by the others while it finds heads the claim
        leaves) before it, whatever the claim would find.

        A segment that commits with its persist also claims the next command
        behind that ``COMMIT``, in the same round trip (``segment.run_claimed``,
        ``chain``); the worker runs that command next, before any turn of the
        general path, so a busy queue costs two waits on the server a
        command instead of three.
        """
        chained, self._chained[index] = self._chained[index], None
        if chained is None and self._general_path_due() and self._general_path(index, sweep=True):
            return True
        node_id, should_stop, chain = self.options.node_id, self.stopping.is_set, self._chain()
        self._busy[index] = True
        try:
            if chained is not None:
                outcome = segment.run_next_claimed(chained, node_id, should_stop, chain=chain)
            else:
                outcome = segment.run_next(node_id, should_stop, chain=chain)
        finally:
            self._busy[index] = False
        if outcome is not None:
            self._chained[index] = outcome.chained
            self._record(outcome)
            return True
        return self._general_path(index)

    def _general_path_due(self) -> bool:
        """Whether this worker takes the process's periodic turn of the general path now."""
        now = time.monotonic()
        with self._lock:
            if now < self._general_path_at:
                return False
            self._general_path_at = now + GENERAL_PATH_EVERY
            return True

    def _general_path(self, index: int, *, sweep: bool = False) -> bool:
        """Peek the oldest heads and run each from peek to settlement; False: none ran.

        This path takes what the common path's claim walks past: heads of
        ended instances (settled), heads out of attempts (dead-lettered),
        heads whose plan this node lacks (deferred), busy heads. ``sweep``
        (the periodic turn): batch after batch while a batch held such a
        head, and meanwhile every worker that comes to its claim joins the
        turn (each running its share of a batch), so a pile of them in front
        of the queue is cleared by all the workers even while the claim keeps
        finding work behind it.
        """
        ran = False
        while True:
            heads = commands.peek(max(2 * self.options.concurrency, 4))
            if not heads:
                return ran
            # workers start at different heads, spread over the batch; in a turn
            # each runs its share only and peeks again, so the workers that
            # joined it do not walk into each other's heads (each one a wasted
            # transaction)
            concurrency = self.options.concurrency
            offset = index * len(heads) // concurrency % len(heads)
            batch = heads[offset:] + heads[:offset]
            if sweep:
                batch = batch[: -(-len(heads) // concurrency)]
            left_behind = False
            for head in batch:
                if self.stopping.is_set() or self._budget_spent():
                    return ran
                self._busy[index] = True
                try:
                    outcome = segment.run_head(
                        head, self.options.node_id, should_stop=self.stopping.is_set
                    )
                finally:
                    self._busy[index] = False
                if outcome.result != "BUSY":
                    self._record(outcome)
                    ran = True
                left_behind = left_behind or outcome.result in LEFT_TO_GENERAL_PATH
            if not (sweep and left_behind):
                return ran
            with self._lock:
                self._general_path_at = 0.0  # the next worker at its claim joins the turn

    def _record(self, outcome: segment.Outcome) -> None:
        self.stats.record(outcome.result)
        if self.options.log_commands:
            elapsed = "-" if outcome.elapsed_ms is None else f"{outcome.elapsed_ms:.1f} ms"
            logger.info(
                "command %s %s of %s: %s, step %s, %s",
                outcome.command_id,
                outcome.kind or "?",
                outcome.workflow_id,
                outcome.result,
                outcome.step or "-",
                elapsed,
            )

    def _budget_spent(self) -> bool:
        limit = self.options.max_commands
        return limit is not None and self.stats.handled >= limit

    def _start_worker(self, index: int) -> None:
        thread = threading.Thread(
            target=self._guarded,
            args=(index,),
            name=f"vertique-workflow-worker-{index}",
            daemon=True,
        )
        self._threads[index] = thread
        thread.start()

    def _guarded(self, index: int) -> None:
        # logged here with its traceback; the supervisor loop restarts the worker
        try:
            self._worker(index)
        except Exception:
            logger.exception("worker %s died; it will be restarted", index)

    # -- lifecycle ---------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: Any) -> None:
            self._signals += 1
            if self._signals > 1:
                logger.warning("second signal: exiting now; leases cover running segments")
                os._exit(1)
            logger.info(
                "signal %s: stopping (grace %.0f s); a second signal exits at once",
                signal.Signals(signum).name,
                self.options.grace_seconds,
            )
            self.stopping.set()
            self.wake_all()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self, on_started: Callable[[], None] | None = None) -> int:
        """Run until stopped, idle (``until_idle``) or out of budget; returns the exit code."""
        options = self.options
        self._wakes = [threading.Event() for _ in range(options.concurrency)]
        settings_dict = connections[options.database].settings_dict
        self.listener = CommandListener(
            settings_dict, self.wake_all, options.poll_interval, on_notify=self.on_notification
        )
        self.listener.start()
        for index in range(options.concurrency):
            self._start_worker(index)
        relay_thread = self._start_relay() if options.relay else None
        if on_started is not None:
            on_started()
        last_sample: float | None = None
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if self._observers and (
                    last_sample is None or now - last_sample >= QUEUE_SAMPLE_SECONDS
                ):
                    self.report_to_observers()
                    last_sample = now
                self.stopping.wait(min(options.poll_interval, 0.5))
                self._restart_dead_workers()
                if self._budget_spent() and not any(self._busy):
                    logger.info(
                        "handled %s commands (--max-commands); stopping", self.stats.handled
                    )
                    break
                if options.until_idle and not any(self._busy) and self._idle():
                    logger.info("the probe says idle; stopping (--until-idle)")
                    break
        finally:
            self.stopping.set()
            self.wake_all()
            if relay_thread is not None:
                self.relay.wake()
            finished = self._join(options.grace_seconds)
            if relay_thread is not None:
                relay_thread.join(options.grace_seconds)
            if self._observers:
                self.report_to_observers(final=True)
            self._close_sample_connection()
            self.listener.stop()
            connections[options.database].close()
        if not finished:
            logger.warning(
                "segments still running after the grace period; exiting, their leases cover them"
            )
            return 1
        return 0

    def _start_relay(self) -> threading.Thread:
        """The service relay of this process: a thread of its own, stopped with the workers."""
        from ..side_effects.relay import Relay

        self.relay = Relay(self.options.node_id)

        def serve() -> None:
            try:
                self.relay.run(self.stopping, poll_interval=self.options.poll_interval)
            except Exception:
                logger.exception("the service relay stopped")

        thread = threading.Thread(target=serve, name="vertique-relay", daemon=True)
        thread.start()
        return thread

    def _idle(self) -> bool:
        try:
            idle = probe_reads.idle()[0]
            if idle and self.options.relay:
                from ..store import outbox

                idle = outbox.next_delay_ms() is None
            return idle
        except DatabaseError:
            connections[self.options.database].close()
            return False

    def _restart_dead_workers(self) -> None:
        for index, thread in enumerate(self._threads):
            if (
                thread is not None
                and not thread.is_alive()
                and not self.stopping.is_set()
                and not self._budget_spent()
            ):
                logger.error("worker %s is not running; restarting it", index)
                self._start_worker(index)

    def _join(self, grace: float) -> bool:
        deadline = time.monotonic() + grace
        for thread in self._threads:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t is not None and t.is_alive() for t in self._threads)

    # -- observers -------------------------------------------------------------------

    def add_observer(self, observer: ExecutorObserver) -> None:
        """Register an observer (before :meth:`run`, or from the supervisor thread)."""
        self._observers.append(observer)

    def sample_queue(self) -> QueueSnapshot:
        """Read the queue usage and lag on the executor's own autocommit connection."""
        try:
            if self._sample_connection is None or self._sample_connection.closed:
                settings_dict = connections[self.options.database].settings_dict
                self._sample_connection = psycopg.connect(
                    autocommit=True,
                    connect_timeout=5,
                    application_name=SAMPLER_APPLICATION_NAME,
                    **db.connect_kwargs(settings_dict),
                )
            usage, lag = wakeup.sample(self._sample_connection)
            return QueueSnapshot(notification_queue_usage=usage, lag_seconds=lag)
        except psycopg.Error as exc:
            logger.warning("queue sample failed (%s)", type(exc).__name__)
            self._close_sample_connection()
            return QueueSnapshot(notification_queue_usage=None, lag_seconds=None)

    def _close_sample_connection(self) -> None:
        if self._sample_connection is not None:
            self._sample_connection.close()
            self._sample_connection = None

    def report_to_observers(self, final: bool = False) -> None:
        snapshot = ExecutorSnapshot(
            counters=self.stats.snapshot(),
            queue=self.sample_queue(),
            listening=bool(self.listener and self.listener.listening.is_set()),
            final=final,
        )
        for observer in list(self._observers):
            try:
                observer.on_snapshot(snapshot)
            except Exception:
                logger.exception("executor observer %s failed", type(observer).__name__)


SAMPLER_APPLICATION_NAME = "vertique-workflow-sampler"


def _merge(pending: str | int | None, hint: str | int) -> str | int:
    """Two wakes of one worker: PEEK wins; of two available times, the earlier."""
    if pending is None:
        return hint
    if pending == PEEK or hint == PEEK:
        return PEEK
    assert isinstance(pending, int) and isinstance(hint, int)
    return min(pending, hint)


def startup_report(options: ExecutorOptions, plans: list[Any], schema: str | None) -> str:
    lines = [
        f"workflow executor {options.node_id}: concurrency {options.concurrency}, "
        f"poll {options.poll_interval * 1000:.0f} ms, placement "
        f"{schema or '(unqualified)'}, database {options.database!r}"
    ]
    for plan in plans:
        lines.append(f"  resident {plan.id} v{plan.version} {plan.plan_hash[:12]}")
    if not plans:
        lines.append("  no resident definitions: every command will be deferred")
    return "\n".join(lines)


__all__ = ["PEEK", "Executor", "ExecutorOptions", "Stats", "startup_report"]
