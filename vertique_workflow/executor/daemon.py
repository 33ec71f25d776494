"""The executor process: N worker threads, one listener, signals, counters.

``manage.py workflow_executor`` builds an :class:`Executor` and calls
:meth:`Executor.run`. Each worker thread has its own Django connection and
loops peek → claim → segment. Workers claim different instances in parallel;
the head-of-queue rule keeps each instance's commands in sequence. When
nothing is claimable a worker sleeps until the earliest future availability
(read from the database clock), capped by the poll interval, or until the
listener wakes it.

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

from django.db import DatabaseError, connections

from ..store import commands, wakeup
from ..store import probe as probe_reads
from . import segment
from .listener import CommandListener

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

    # -- wake-up -------------------------------------------------------------------

    def wake_all(self) -> None:
        for event in self._wakes:
            event.set()

    # -- workers ---------------------------------------------------------------------

    def _worker(self, index: int) -> None:
        wake = self._wakes[index]
        alias = self.options.database
        try:
            while not self.stopping.is_set():
                if self._budget_spent():
                    return
                try:
                    ran = self._work_once(index)
                    if ran:
                        continue
                    delay_ms = commands.earliest_availability_delay_ms()
                except DatabaseError as exc:
                    logger.warning(
                        "worker %s: database error %s; retrying after the poll interval",
                        index,
                        type(exc).__name__,
                    )
                    connections[alias].close()
                    self.stopping.wait(self.options.poll_interval)
                    continue
                timeout = self.options.poll_interval
                if delay_ms is not None:
                    timeout = min(timeout, delay_ms / 1000.0)
                wake.wait(timeout)
                wake.clear()
        finally:
            connections[alias].close()

    def _work_once(self, index: int) -> bool:
        """Run what is claimable now; False when nothing was."""
        self._busy[index] = True
        try:
            outcome = segment.run_next(self.options.node_id, should_stop=self.stopping.is_set)
        finally:
            self._busy[index] = False
        if outcome is not None:
            self._record(outcome)
            return True
        # the general path: ended instances, dead letters, deferrals, busy heads
        heads = commands.peek(max(2 * self.options.concurrency, 4))
        if not heads:
            return False
        offset = index % len(heads)  # workers start at different heads
        ran = False
        for head in heads[offset:] + heads[:offset]:
            if self.stopping.is_set() or self._budget_spent():
                break
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
        return ran

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
        self.listener = CommandListener(settings_dict, self.wake_all, options.poll_interval)
        self.listener.start()
        for index in range(options.concurrency):
            self._start_worker(index)
        if on_started is not None:
            on_started()
        last_stats = time.monotonic()
        try:
            while not self.stopping.is_set():
                self.stopping.wait(min(options.poll_interval, 0.5))
                self._restart_dead_workers()
                now = time.monotonic()
                if now - last_stats >= options.stats_interval:
                    self.log_stats()
                    last_stats = now
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
            finished = self._join(options.grace_seconds)
            self.log_stats()
            self.listener.stop()
            connections[options.database].close()
        if not finished:
            logger.warning(
                "segments still running after the grace period; exiting, their leases cover them"
            )
            return 1
        return 0

    def _idle(self) -> bool:
        try:
            return probe_reads.idle()[0]
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

    def log_stats(self) -> None:
        counts = self.stats.snapshot()
        try:
            lag = wakeup.lag_seconds()
            usage = wakeup.queue_usage()
        except DatabaseError:
            connections[self.options.database].close()
            lag, usage = float("nan"), float("nan")
        listening = "listening" if self.listener and self.listener.listening.is_set() else "polling"
        logger.info(
            "%s; lag %.3f s; notify queue %.4f; %s",
            " ".join(f"{name}={value}" for name, value in counts.items()),
            lag,
            usage,
            listening,
        )


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


__all__ = ["Executor", "ExecutorOptions", "Stats", "startup_report"]
