"""Retention: archive ended instances, later purge the archived ones.

``archive(status, older_than)`` stamps ``archived_at`` on instances of that
status last changed before the age (the database clock). Archived instances
are hidden from ``wf.instances`` and ``wf.tasks`` unless asked for, keep
every row, and come back with ``wf.retry`` (a FAILED instance). ``purge_archived
(older_than)`` deletes instances archived before the cutoff with everything
that belongs to them. ``sweep`` runs batches of both until nothing is left or
a time budget is spent; ``manage.py workflow_retention`` runs a sweep from
cron, on several nodes at once if you like (candidates are taken ``FOR UPDATE
SKIP LOCKED``: two runs never share an instance).

Running work is never disturbed: an instance whose execution lock is held
(a segment, a recording) is skipped and counted as busy, and one with a
PENDING, DEFERRED or CLAIMED command is left alone, whatever its status.

Archive and purge do not share a clock (the reference): ``archived_at`` comes
from the database clock, while the purge cutoff is computed from this
process's clock (``older_than``) or given (``before``). A purge right after an
archive with a cutoff from a clock behind the database's may skip rows it just
archived; retention horizons of hours or days make this invisible.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from .conf import workflow_settings
from .exceptions import WorkflowValidationError
from .models import InstanceStatus
from .store import db
from .store import retention as store

# FAILED is a status like the others (the reference): archiving FAILED archives
# failed instances, a PENDING one whose START was dead-lettered included, when
# no command of theirs is active.
STATUSES = frozenset(InstanceStatus.values)


@dataclass(frozen=True)
class BatchResult:
    """One batch: ``processed`` archived (or purged), ``busy`` skipped (execution lock
    held), ``left_alone`` (no longer eligible, or holding an active command), of
    ``candidates`` picked."""

    action: str
    status: str | None
    candidates: int
    processed: int
    busy: int
    left_alone: int
    after: Any = None


@dataclass
class SweepSummary:
    """What a sweep did, per action; ``complete`` is False when the time budget ran out."""

    archived: dict[str, int] = field(default_factory=dict)
    purged: int = 0
    busy: int = 0
    left_alone: int = 0
    batches: int = 0
    seconds: float = 0.0
    complete: bool = True


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise WorkflowValidationError(f"{name} must be a timedelta or a number of seconds")
    if seconds < 0:
        raise WorkflowValidationError(f"{name} must not be negative")
    return seconds


def _batch(batch: int | None) -> int:
    value = workflow_settings.RETENTION_BATCH if batch is None else batch
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkflowValidationError("batch must be a positive integer")
    return value


def _status(status: str) -> str:
    if status not in STATUSES:
        raise WorkflowValidationError(
            f"status must be one of {', '.join(sorted(STATUSES))}, not {status!r}"
        )
    return status


def _in_transaction(run: Callable[[], store.Batch], what: str) -> store.Batch:
    try:
        with transaction.atomic(using=db.alias()):
            return run()
    except DatabaseError as exc:
        raise db.translate(exc, what) from None


def archive(
    status: str,
    older_than: datetime.timedelta | float,
    *,
    batch: int | None = None,
    after: Any = None,
) -> BatchResult:
    """Archive one batch of ``status`` instances last changed more than ``older_than`` ago.

    One transaction. ``batch`` defaults to ``RETENTION_BATCH``; ``after`` is the
    previous batch's ``after`` (a sweep's position). See the module docstring
    for what is skipped and left alone.
    """
    wanted, age, size = _status(status), _seconds(older_than, "older_than"), _batch(batch)
    result = _in_transaction(lambda: store.archive_batch(wanted, age, size, after), "archive")
    return BatchResult(
        "archive",
        wanted,
        result.candidates,
        result.processed,
        result.busy,
        result.left_alone,
        result.after,
    )


def purge_archived(
    older_than: datetime.timedelta | float | None = None,
    *,
    before: datetime.datetime | None = None,
    batch: int | None = None,
    after: Any = None,
) -> BatchResult:
    """Purge one batch of instances archived before ``before`` (or ``older_than`` ago).

    Deletes each instance with its history, commands, queue row, timers,
    tasks, branch tokens, join states, service calls, events and dedup keys
    (its START key is kept: see ``store.retention``). One transaction.
    ``older_than`` computes the cutoff from this process's clock.
    """
    if (older_than is None) == (before is None):
        raise WorkflowValidationError("give exactly one of older_than and before")
    if before is None:
        cutoff = timezone.now() - datetime.timedelta(seconds=_seconds(older_than, "older_than"))
    elif isinstance(before, datetime.datetime) and before.tzinfo is not None:
        cutoff = before
    else:
        raise WorkflowValidationError("before must be an aware datetime")
    size = _batch(batch)
    result = _in_transaction(lambda: store.purge_batch(cutoff, size, after), "purge")
    return BatchResult(
        "purge",
        None,
        result.candidates,
        result.processed,
        result.busy,
        result.left_alone,
        result.after,
    )


def sweep(
    *,
    archive_ages: Mapping[str, datetime.timedelta | float] | None = None,
    purge_archived_age: datetime.timedelta | float | None = None,
    batch: int | None = None,
    max_seconds: float | None = None,
    progress: Callable[[BatchResult], None] | None = None,
) -> SweepSummary:
    """Archive each status by its age, then purge, in batches, until done or out of time.

    ``archive_ages`` maps statuses to ages (default: ``RETENTION_ARCHIVE``);
    ``purge_archived_age`` the purge horizon (default:
    ``RETENTION_PURGE_ARCHIVED_SECONDS``; None: no purge). Each batch continues
    after the last candidate of the one before, so a busy or left-alone
    instance is not picked again in the same sweep (a later sweep takes it).
    ``progress`` is called after every batch. ``max_seconds`` bounds the sweep
    between batches (a batch is never cut short).
    """
    ages = dict(workflow_settings.RETENTION_ARCHIVE if archive_ages is None else archive_ages)
    for status, age in ages.items():
        _status(status)
        _seconds(age, f"the archive age of {status}")
    if purge_archived_age is None:
        purge_archived_age = workflow_settings.RETENTION_PURGE_ARCHIVED_SECONDS
    if purge_archived_age is not None:
        _seconds(purge_archived_age, "purge_archived_age")
    size = _batch(batch)
    started = time.monotonic()
    summary = SweepSummary()

    def out_of_time() -> bool:
        return max_seconds is not None and time.monotonic() - started >= max_seconds

    def run(step: Callable[[Any], BatchResult]) -> bool:
        after = None
        while True:
            if out_of_time():
                summary.complete = False
                return False
            result = step(after)
            summary.batches += 1
            summary.busy += result.busy
            summary.left_alone += result.left_alone
            if result.action == "archive":
                key = str(result.status)
                summary.archived[key] = summary.archived.get(key, 0) + result.processed
            else:
                summary.purged += result.processed
            if progress is not None:
                progress(result)
            if result.candidates < size:
                return True
            after = result.after

    for status, age in ages.items():
        summary.archived.setdefault(status, 0)
        if not run(lambda after, s=status, a=age: archive(s, a, batch=size, after=after)):
            break
    else:
        if purge_archived_age is not None:
            cutoff = timezone.now() - datetime.timedelta(
                seconds=_seconds(purge_archived_age, "purge_archived_age")
            )
            run(lambda after, c=cutoff: purge_archived(before=c, batch=size, after=after))
    summary.seconds = time.monotonic() - started
    return summary
