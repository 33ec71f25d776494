"""A real bound on one segment transaction: ``SEGMENT_DEADLINE_MS``.

A segment holds the instance's execution lock and the row locks of its
writes, so one that never ends stalls its instance and everyone waiting on
it. Three pieces bound it, whatever the workflow code does:

- every statement of the segment (the store's and the ORM writes of actions)
  is refused once the deadline has passed (:class:`SegmentDeadlineExceeded`,
  a retryable error), so code that works in many small statements stops at
  the first statement after the deadline;
- the server ends the segment's session at the deadline: on PostgreSQL 17+
  through ``transaction_timeout`` (set for this transaction by the segment's
  first statement), on 15 and 16 through this module's watchdog thread,
  which calls ``pg_terminate_backend`` on the segment's backend. That also
  covers one long statement and code that sleeps without a statement: the
  locks are released at the deadline, and the segment's next statement fails;
- the executor treats both as a transient failure: the command returns to
  PENDING with its attempt restored and ``TRANSIENT_FAILURE`` in ``last_error``.

The watchdog takes its lock while it decides to terminate and while a
worker unregisters a finished segment, so it never ends a session that has
moved on to other work. It can end one whose segment has just rolled back
(the deadline refused a statement in Python while the thread woke); the
unregistering worker learns it from :meth:`_Watchdog.unregister` and closes
the connection, so its next statement runs on a new session.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from ..store import db, sessions
from .listener import connect_kwargs

logger = logging.getLogger("vertique_workflow.executor")

# transaction_timeout exists from PostgreSQL 17 on
TRANSACTION_TIMEOUT_VERSION = 170000


# one error for a statement refused after the deadline, ORM or store
SegmentDeadlineExceeded = db.DeadlinePassed


def server_has_transaction_timeout() -> bool:
    return int(getattr(db.connection(), "pg_version", 0) or 0) >= TRANSACTION_TIMEOUT_VERSION


class _Watchdog(threading.Thread):
    """One thread per process (PostgreSQL 15/16): ends sessions of overdue segments."""

    def __init__(self, settings_dict: dict[str, Any]) -> None:
        super().__init__(name="vertique-workflow-deadline-watchdog", daemon=True)
        self._kwargs = connect_kwargs(settings_dict)
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._heap: list[tuple[float, int, int]] = []  # (expires, ticket, backend pid)
        self._active: dict[int, int] = {}  # ticket -> backend pid
        self._tickets = itertools.count(1)
        self.terminated = 0
        self.wakeups = 0  # times the thread woke (a notification or its own timeout)
        # when the sleeping thread wakes by itself: None, only when notified
        self._sleeping_until: float | None = None

    def register(self, expires: float, backend_pid: int) -> int:
        """Watch a segment's backend until ``expires``; the ticket unregisters it.

        The thread is notified only when it would otherwise wake too late for
        this deadline. Every segment of a process has the same
        ``SEGMENT_DEADLINE_MS``, so a sleeping thread already wakes before
        each new deadline: notified per segment, it cost every segment a
        thread wake-up and a hand-off of the GIL. Finished segments at the top
        of the heap are dropped here, so it holds about the running ones.
        """
        with self.lock:
            while self._heap and self._heap[0][1] not in self._active:
                heapq.heappop(self._heap)  # finished in time
            ticket = next(self._tickets)
            self._active[ticket] = backend_pid
            heapq.heappush(self._heap, (expires, ticket, backend_pid))
            if self._sleeping_until is None or expires < self._sleeping_until:
                self._wake.notify()
            return ticket

    def unregister(self, ticket: int) -> bool:
        """Stop watching a segment; False when the watchdog took it first.

        False means the thread has ended that session: it terminates under
        the lock this waits for, so by the time False returns the session
        is gone, though its client may not know yet.
        """
        with self.lock:
            return self._active.pop(ticket, None) is not None

    def run(self) -> None:
        with self.lock:
            while True:
                while self._heap and self._heap[0][1] not in self._active:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._sleeping_until = None
                    self._wake.wait()
                    self.wakeups += 1
                    continue
                expires, ticket, pid = self._heap[0]
                delay = expires - time.monotonic()
                if delay > 0:
                    self._sleeping_until = expires
                    self._wake.wait(delay)
                    self._sleeping_until = None
                    self.wakeups += 1
                    continue
                heapq.heappop(self._heap)
                self._active.pop(ticket, None)
                self._terminate(pid)  # under the lock: the worker cannot move on meanwhile

    def _terminate(self, pid: int) -> None:
        # a connection per termination: overdue segments are rare, and an idle
        # connection held for them would keep a session open on every node
        try:
            with psycopg.connect(autocommit=True, connect_timeout=5, **self._kwargs) as connection:
                sessions.terminate_backend(connection, pid)
            self.terminated += 1
            logger.warning("segment on backend %s passed SEGMENT_DEADLINE_MS; session ended", pid)
        except psycopg.Error as exc:
            logger.warning(
                "deadline watchdog could not end backend %s (%s)", pid, type(exc).__name__
            )


_watchdog: _Watchdog | None = None
_watchdog_lock = threading.Lock()


def _get_watchdog() -> _Watchdog:
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = _Watchdog(db.connection().settings_dict)
            _watchdog.start()
        return _watchdog


class Deadline:
    """The deadline of one segment, on the monotonic clock of this process."""

    def __init__(self, deadline_ms: int) -> None:
        self.ms = int(deadline_ms)
        self.expires = time.monotonic() + self.ms / 1000.0

    def expired(self) -> bool:
        return time.monotonic() >= self.expires


@contextmanager
def bounded(deadline_ms: int) -> Iterator[Deadline]:
    """Run the body (one segment transaction) under the deadline (see the module docstring).

    Enter it before the segment's first statement and leave it after the
    transaction ended (committed or rolled back).
    """
    wrapper = db.connection()
    wrapper.ensure_connection()
    deadline = Deadline(deadline_ms)
    expires = deadline.expires

    def guard(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if time.monotonic() >= expires:
            raise SegmentDeadlineExceeded("the segment passed SEGMENT_DEADLINE_MS")
        return execute(sql, params, many, context)

    watchdog, ticket = None, 0
    if not server_has_transaction_timeout():
        watchdog = _get_watchdog()
        ticket = watchdog.register(expires, wrapper.connection.info.backend_pid)
    db.set_deadline(expires)
    try:
        with wrapper.execute_wrapper(guard):
            yield deadline
    finally:
        db.set_deadline(None)
        if watchdog is not None and not watchdog.unregister(ticket):
            # Ended by the watchdog, possibly after the transaction had already
            # rolled back (the deadline refused a statement here while the
            # thread woke): the client has not read the termination yet, so the
            # next statement (the settlement) would fail on it. Reconnect.
            wrapper.close()


__all__ = ["Deadline", "SegmentDeadlineExceeded", "bounded", "server_has_transaction_timeout"]
