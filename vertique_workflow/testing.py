"""Helpers for users' own tests: run recorded commands in-process until idle.

``run_until_idle()`` is the test harness DBOS and Temporal users expect: start
or signal a workflow in a test, call it, and assert on the result. It runs
commands on the calling thread, on the test's own connection, and its final
idle check reads there too (the probe's ``on_caller_connection`` path), so a
test wrapped in one transaction sees its own uncommitted rows; the public
probe otherwise reads committed state on a connection of its own.

Prefer transactional tests (``@pytest.mark.django_db(transaction=True)``,
``TransactionTestCase``). In a test wrapped in one transaction (plain
``django_db`` / ``TestCase``) PostgreSQL's ``now()`` stands still, so starts
and signals run, but a retry backoff never elapses: a failing step cannot be
retried there (``run_until_idle`` then raises ``TimeoutError``).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from .conf import workflow_settings
from .executor.segment import default_node_id, run_head, run_next
from .registry import ensure_synced
from .side_effects.relay import Relay
from .store import commands as command_log
from .store import outbox
from .store import probe as reads


def flush_workflow_tables() -> None:
    """Empty every workflow table.

    Django's test flush only truncates tables it finds on the ``search_path``;
    with a ``SCHEMA`` placement the workflow tables are elsewhere, so
    transactional tests (``TransactionTestCase``, ``django_db(transaction=True)``)
    should call this after each test (see docs/testing.md).
    """
    from .store.maintenance import truncate_all

    truncate_all()


@dataclass
class RunReport:
    """What ``run_until_idle`` did: one outcome name per head it handled."""

    outcomes: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return self.outcomes.count(outcome)


def run_until_idle(
    *,
    max_commands: int = 10_000,
    wait_for_retries: bool = True,
    timeout: float = 60.0,
    services: bool = True,
) -> RunReport:
    """Run claimable commands (and, with ``services``, due service calls) until idle.

    Service calls are served by a relay on the calling thread's process
    (the handler runs in a thread of its own, bounded by its step's
    timeout); their outcomes are recorded and run like any command, and a
    call backing off is waited for like a retry. ``RunReport.outcomes``
    lists ``SERVICE_<outcome>`` for each call served.

    With ``wait_for_retries`` (the default) a command that is backing off
    after a failed attempt (available within BACKOFF_MAX_MS) is waited for,
    using the database clock's delay to it, so a test sees retries and dead
    letters play out. Deferred commands (minutes away) are not waited for.
    """
    ensure_synced()
    node_id = f"test:{default_node_id()}"
    report = RunReport()
    deadline = time.monotonic() + timeout
    horizon_ms = workflow_settings.BACKOFF_MAX_MS
    relay = Relay(node_id, concurrency=1) if services else None
    while len(report.outcomes) < max_commands:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run_until_idle did not reach idle within {timeout} s")
        outcome = run_next(node_id)
        if outcome is not None:
            report.outcomes.append(outcome.result)
            continue
        heads = command_log.peek(16)
        if heads:
            results = [run_head(head, node_id).result for head in heads]
            report.outcomes.extend(r for r in results if r != "BUSY")
            if any(r != "BUSY" for r in results):
                continue
        if relay is not None and _serve(relay, report):
            continue
        # the future delay, not the earliest: a command behind a head that backs
        # off is available (earliest 0) yet not claimable until the head's retry
        delays = command_log.availability_delays() if wait_for_retries else None
        delay = delays.next_future if delays is not None else None
        if relay is not None and wait_for_retries:
            # a service call backing off by its step's policy (not BACKOFF_MAX_MS):
            # waited for within ``timeout``
            pending = outbox.next_delay_ms()
            if pending is not None and (delay is None or delay > horizon_ms or pending < delay):
                time.sleep(pending / 1000.0 + 0.001)
                continue
        if delay is not None and delay <= horizon_ms:
            time.sleep(delay / 1000.0 + 0.001)  # a retry backing off, per the database clock
            continue
        # asked after the delay: a command that became available meanwhile is not idle
        # on the test's own connection: a plain django_db test's rows are uncommitted
        idle, _ = reads.idle(on_caller_connection=True)
        if idle:
            return report
        time.sleep(0.01)  # another worker's claim is in flight; its lease bounds this
    return report


def _serve(relay: Relay, report: RunReport) -> bool:
    """Serve one batch of due service calls; True when any was claimed."""
    before = dict(relay.stats.by_outcome)
    if not relay.run_once():
        return False
    for outcome, count in relay.stats.by_outcome.items():
        report.outcomes.extend([f"SERVICE_{outcome}"] * (count - before.get(outcome, 0)))
    return True


def advance_time(by: str | datetime.timedelta | None = None, *, instance_id: Any = None) -> int:
    """Skip time for timers: fire what ``by`` would bring due; returns how many are due now.

    Every SCHEDULED timer (of ``instance_id``, or of every instance) comes
    ``by`` closer -- ``"3d"``, ``"90m"`` or a ``timedelta`` --, so timers due
    within it are due now and later ones keep the rest of their wait
    (advancing twice by a day fires what two days would). Without ``by``
    every timer is due now. It goes through the command log: the TIMER
    commands' availability moves on the database clock and the next
    ``run_until_idle()`` (or a running executor) fires them in queue order,
    exactly as it would at their time. The database's own clock is not
    changed; ``fire_at`` of the moved timers is.
    """
    from .definitions.durations import parse_duration
    from .store import db
    from .store import timers as timer_store

    advance = None if by is None else parse_duration(by)
    with transaction.atomic(using=db.alias()):
        return timer_store.make_due(instance_id, advance=advance)
