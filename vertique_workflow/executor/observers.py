"""Executor observers: what an executor reports every five seconds, and the log line.

An observer is any object with ``on_snapshot(snapshot)`` (the
:class:`ExecutorObserver` protocol), registered with
``ExecutorOptions(observers=[...])`` or :meth:`Executor.add_observer`. While at
least one observer is registered, the executor samples
``pg_notification_queue_usage()`` and the lag every
:data:`QUEUE_SAMPLE_SECONDS` on a connection of its own in autocommit (outside
any transaction, never a worker's connection), and calls every observer with
the counters and that sample, on the executor's supervisor thread; it calls
them once more at shutdown (``final=True``). An observer that raises is logged
and kept. The counters log line is one observer (:class:`StatsLogObserver`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

logger = logging.getLogger("vertique_workflow.executor")

QUEUE_SAMPLE_SECONDS = 5.0


@dataclass(frozen=True)
class QueueSnapshot:
    """One sample of the notification queue and the command log.

    ``notification_queue_usage`` is ``pg_notification_queue_usage()`` (0 to 1);
    a value near 1 means a listening session is not consuming notifications,
    and new notifications then fail at commit. ``lag_seconds``: how long the
    oldest available PENDING/DEFERRED command has been available. Both are
    None when the sample could not be read (the database was unreachable).
    """

    notification_queue_usage: float | None
    lag_seconds: float | None


@dataclass(frozen=True)
class ExecutorSnapshot:
    """What an observer receives: the counters, the queue sample, the listener state."""

    counters: dict[str, int]
    queue: QueueSnapshot
    listening: bool
    final: bool = False


@runtime_checkable
class ExecutorObserver(Protocol):
    """Receives an :class:`ExecutorSnapshot` every five seconds, and once at shutdown."""

    def on_snapshot(self, snapshot: ExecutorSnapshot) -> None: ...


class StatsLogObserver:
    """The executor's counters line, logged every ``interval`` seconds and at shutdown."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = time.monotonic()

    def on_snapshot(self, snapshot: ExecutorSnapshot) -> None:
        now = time.monotonic()
        if not snapshot.final and now - self._last < self.interval:
            return
        self._last = now
        queue = snapshot.queue
        lag = float("nan") if queue.lag_seconds is None else queue.lag_seconds
        usage = (
            float("nan")
            if queue.notification_queue_usage is None
            else queue.notification_queue_usage
        )
        logger.info(
            "%s; lag %.3f s; notify queue %.4f; %s",
            " ".join(f"{name}={value}" for name, value in snapshot.counters.items()),
            lag,
            usage,
            "listening" if snapshot.listening else "polling",
        )


__all__ = [
    "QUEUE_SAMPLE_SECONDS",
    "ExecutorObserver",
    "ExecutorSnapshot",
    "QueueSnapshot",
    "StatsLogObserver",
]
