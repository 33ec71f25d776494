"""The deadline watchdog (PostgreSQL 15/16): woken only when it would wake too late.

Real sessions and the watchdog's own thread. The thread sleeps until the
earliest deadline it holds; a segment whose deadline is later (every segment
of a process has the same SEGMENT_DEADLINE_MS) must not wake it, yet its
session is still ended when it is overdue.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.db import connection

from tests.conftest import connect
from vertique_workflow.executor import deadline
from vertique_workflow.executor.deadline import _Watchdog

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 30.0  # seconds a condition may take on a busy machine; none is timed


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll a state of the watchdog or the server until it holds (bounded, never timed)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT} s"
        time.sleep(0.01)


def watchdog() -> _Watchdog:
    thread = _Watchdog(connection.settings_dict)
    thread.start()
    return thread


def sleeping_until(thread: _Watchdog, expires: float) -> Callable[[], bool]:
    def check() -> bool:
        with thread.lock:
            return thread._sleeping_until == expires

    return check


def test_a_later_deadline_does_not_wake_the_watchdog_and_an_earlier_one_does():
    thread = watchdog()
    first = time.monotonic() + 3600
    thread.register(first, 0)
    wait_for(sleeping_until(thread, first), "sleeping until the first deadline")
    woken = thread.wakeups
    for index in range(100):  # segments after the first: later deadlines, finished in time
        ticket = thread.register(first + 1 + index, 0)
        thread.unregister(ticket)
    earlier = first - 1800
    thread.register(earlier, 0)
    wait_for(sleeping_until(thread, earlier), "sleeping until the earlier deadline")
    assert thread.wakeups == woken + 1  # the earlier deadline only


def test_finished_segments_do_not_pile_up_in_the_watchdog():
    thread = watchdog()
    start = time.monotonic() + 3600
    for index in range(100):  # one worker: each segment finishes before the next begins
        thread.unregister(thread.register(start + index, 0))
    assert len(thread._heap) == 1  # the last one; the earlier ones were dropped as it came


def test_every_overdue_session_is_ended_though_only_the_first_deadline_woke_the_watchdog():
    thread = watchdog()
    name = connection.settings_dict["NAME"]
    with connect(name, autocommit=True) as first, connect(name, autocommit=True) as second:
        pids = [c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (first, second)]
        now = time.monotonic()
        thread.register(now + 0.2, pids[0])
        thread.register(now + 0.4, pids[1])  # later: the thread is not notified for it

        def both_ended() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
                return cursor.fetchone()[0] == 0

        wait_for(both_ended, "both sessions ended")
        # the watchdog counts a termination once its own connection has closed,
        # which may be after the ended session left pg_stat_activity
        wait_for(lambda: thread.terminated == 2, "both terminations counted")
    assert thread.terminated == 2


def test_a_session_ended_after_its_segment_rolled_back_is_not_used_again(monkeypatch):
    """The race of a segment that met its deadline in Python while the watchdog woke.

    The segment's transaction has ended (its statement was refused at the
    deadline and it rolled back), but the watchdog took the ticket first and
    ends the session before the worker unregisters. The worker's next
    statement (the transient settlement) must run on a new session, not on
    the ended one ("terminating connection due to administrator command").
    """
    monkeypatch.setattr(deadline, "server_has_transaction_timeout", lambda: False)
    thread = deadline._get_watchdog()  # the process's watchdog, as the executor's segments use it
    ended = thread.terminated
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        first_pid = cursor.fetchone()[0]
    with deadline.bounded(200):  # no statement inside: the transaction ended in time
        wait_for(lambda: thread.terminated > ended, "the watchdog ending the session")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != first_pid
