"""workflow_timers and their TIMER commands (the reference's PgTimerStore and recordTimer).

The timer row is the source of timer status (SCHEDULED -> FIRED / CANCELLED);
its TIMER command (linked by ``command_id``) is how the executor runs it.
Every statement runs in the caller's transaction, under the execution lock,
and the lock order is the reference's: timers before tasks before instances
before queues. A status change is guarded by ``status = 'SCHEDULED'``; a
guarded change that finds no row raises :class:`TimerConflict`, a transient
conflict (SQLSTATE 40001) that rolls the segment back instead of silently
moving a timer out of a state it was not in.
"""

from __future__ import annotations

import datetime
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from ..failures import text
from ..models import TIMER_KIND_OF_PURPOSE, TimerPurpose
from . import db

T = db.T


class TimerConflict(DatabaseError):
    """A guarded timer update found no SCHEDULED row: retried as a transient conflict."""

    sqlstate = "40001"


@dataclass(frozen=True)
class TimerSpec:
    """One timer to record: exactly one of ``delay_seconds`` and ``fire_at``.

    ``delay_seconds`` counts from the recording (the database clock);
    ``fire_at`` is an instant, an instant already past counts as the
    recording time. ``target`` is a TIMEOUT's ``{stepId, forkStepId?,
    branchId?, signalNames}`` (the eligibility rule holds the timeout back
    while a signal for that wait is on its way). ``metadata`` is the durable
    context of the drive that recorded it; the command stores no context.
    """

    timer_id: uuid.UUID
    step_id: str
    purpose: str
    delay_seconds: float | None = None
    fire_at: datetime.datetime | None = None
    task_id: uuid.UUID | None = None
    target: dict[str, Any] | None = None
    branch_token_id: uuid.UUID | None = None
    fork_step_id: str | None = None
    branch_id: str | None = None
    metadata: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.delay_seconds is None) == (self.fire_at is None):
            raise ValueError("a TimerSpec needs exactly one of delay_seconds and fire_at")
        if self.purpose not in TimerPurpose.values:
            raise ValueError(f"unknown timer purpose {self.purpose!r}")
        if self.fire_at is not None and self.fire_at.tzinfo is None:
            raise ValueError("fire_at must be timezone-aware")


@dataclass(frozen=True)
class TimerRow:
    id: uuid.UUID
    workflow_id: uuid.UUID
    step_id: str
    purpose: str
    fire_at: datetime.datetime
    status: str
    task_id: uuid.UUID | None
    branch_token_id: uuid.UUID | None
    fork_step_id: str | None
    branch_id: str | None
    metadata: Any
    command_id: int | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


# One statement for the whole list: one clock read (recorded_at and fire_at of
# every command), consecutive queue positions, the commands, then the timer
# rows with the same fire time and the command id. ``ord`` is the position in
# the caller's list (0-based).
RECORD = f"""
WITH specs AS (
    SELECT * FROM jsonb_to_recordset(%(specs)s::jsonb) AS s(
        ord int, timer_id uuid, step_id text, purpose text, timer_kind text,
        delay double precision, instant timestamptz, task_id uuid, target jsonb,
        branch_token_id uuid, fork_step_id text, branch_id text, metadata jsonb)
), clock AS MATERIALIZED (
    SELECT clock_timestamp() AS t
), q AS (
    INSERT INTO {T["command_queues"]} AS cq (workflow_id, next_seq)
    VALUES (%(wf)s, 1 + %(n)s)
    ON CONFLICT (workflow_id) DO UPDATE SET next_seq = cq.next_seq + %(n)s
    RETURNING next_seq - %(n)s AS first_seq
), timed AS (
    SELECT s.*, clock.t AS recorded_at,
           CASE WHEN s.delay IS NOT NULL THEN clock.t + make_interval(secs => s.delay)
                ELSE GREATEST(clock.t, s.instant) END AS fire_at
    FROM specs s, clock
), cmds AS (
    INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, timer_kind, timer_id, task_id,
        target_json, actor_kind, actor_id, actor_reason, attribution_status, recorded_at,
        fire_at, available_at)
    SELECT %(wf)s, q.first_seq + timed.ord, 'TIMER', 'PENDING', timed.timer_kind,
           timed.timer_id, timed.task_id, timed.target, 'SYSTEM', NULL, 'timer', 'VERIFIED',
           timed.recorded_at, timed.fire_at, timed.fire_at
    FROM timed, q
    RETURNING id, timer_id, fire_at
), rows AS (
    INSERT INTO {T["timers"]} (id, workflow_id, step_id, purpose, fire_at, status, task_id,
        branch_token_id, fork_step_id, branch_id, metadata, command_id, created_at, updated_at)
    SELECT timed.timer_id, %(wf)s, timed.step_id, timed.purpose, cmds.fire_at, 'SCHEDULED',
           timed.task_id, timed.branch_token_id, timed.fork_step_id, timed.branch_id,
           COALESCE(timed.metadata, '{{}}'::jsonb), cmds.id, timed.recorded_at,
           timed.recorded_at
    FROM timed JOIN cmds ON cmds.timer_id = timed.timer_id
)
SELECT cmds.id, cmds.fire_at FROM cmds JOIN timed ON timed.timer_id = cmds.timer_id
ORDER BY timed.ord
"""

MARK_FIRED = f"""
UPDATE {T["timers"]} SET status = 'FIRED', updated_at = now()
WHERE id = %s AND status = 'SCHEDULED'
"""

SELECT = f"""
SELECT id, workflow_id, step_id, purpose, fire_at, status, task_id, branch_token_id,
       fork_step_id, branch_id, metadata, command_id, created_at, updated_at
FROM {T["timers"]} WHERE id = %s
"""

# Cancel the instance's SCHEDULED timers that match, and in the same statement
# their linked commands while still unsettled (the claim cleared), except the
# command the caller's segment is running (it settles that one itself).
# Timers are locked first (ascending id), then their commands: the lock order.
CANCEL = f"""
WITH doomed AS (
    SELECT id, command_id FROM {T["timers"]}
    WHERE workflow_id = %(wf)s AND status = 'SCHEDULED'
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
      AND (%(task)s::uuid IS NULL OR task_id = %(task)s::uuid)
      AND (%(step)s::text IS NULL OR step_id = %(step)s::text)
      AND (%(purposes)s::text[] IS NULL OR purpose = ANY(%(purposes)s::text[]))
      AND (%(branches)s::uuid[] IS NULL OR branch_token_id = ANY(%(branches)s::uuid[]))
    ORDER BY id FOR UPDATE
), done AS (
    UPDATE {T["timers"]} t SET status = 'CANCELLED', updated_at = now()
    FROM doomed WHERE t.id = doomed.id
    RETURNING t.id
), cancelled AS (
    UPDATE {T["commands"]} c
    SET state = 'CANCELLED', claim_token = NULL, lease_until = NULL, settled_at = now(),
        last_error = %(last_error)s
    FROM doomed
    WHERE c.id = doomed.command_id AND c.kind = 'TIMER'
      AND c.state IN ('PENDING', 'DEFERRED', 'CLAIMED', 'PARKED', 'DEAD')
      AND c.id IS DISTINCT FROM %(keep)s::bigint
    RETURNING c.id, c.seq, c.kind, c.timer_id
)
SELECT (SELECT count(*) FROM done),
       COALESCE((SELECT jsonb_agg(jsonb_build_object(
           'id', id, 'seq', seq, 'kind', kind, 'timer_id', timer_id) ORDER BY id)
           FROM cancelled), '[]'::jsonb)
"""

# Time skipping: the TIMER commands first (the command log path, so the
# trigger notifies), then the timer rows alike. "Now" is the transaction's
# clock (``now()``), never later than its commit, as for a recorded command's
# available_at: a timer moved inside a test's enclosing transaction is due for
# that transaction too (``clock_timestamp()`` would stay ahead of its now()).
# ``advance`` is measured from the statement's clock.
MAKE_DUE = f"""
WITH clock AS MATERIALIZED (SELECT now() AS t),
due AS (
    SELECT t.id, t.command_id,
           CASE WHEN %(advance)s::double precision IS NULL THEN clock.t
                ELSE GREATEST(clock.t, t.fire_at - make_interval(
                    secs => %(advance)s::double precision)) END AS fire_at
    FROM {T["timers"]} t, clock
    WHERE (%(wf)s::uuid IS NULL OR t.workflow_id = %(wf)s::uuid)
      AND t.status = 'SCHEDULED' AND t.fire_at > clock.t
    ORDER BY t.id FOR UPDATE OF t
), moved AS (
    UPDATE {T["commands"]} c SET fire_at = due.fire_at, available_at = due.fire_at
    FROM due
    WHERE c.id = due.command_id AND c.state IN ('PENDING', 'DEFERRED')
    RETURNING c.id
), shifted AS (
    UPDATE {T["timers"]} t SET fire_at = due.fire_at, updated_at = now()
    FROM due WHERE t.id = due.id
    RETURNING t.fire_at, t.purpose, t.task_id
), due_dates AS (
    UPDATE {T["tasks"]} k SET due_at = shifted.fire_at, updated_at = now()
    FROM shifted
    WHERE shifted.purpose = 'TASK_DUE' AND k.id = shifted.task_id
      AND k.status IN ('OPEN', 'COMPLETING')
)
SELECT count(*) FILTER (WHERE fire_at <= (SELECT t FROM clock)) FROM shifted
"""


def record(workflow_id: Any, specs: list[TimerSpec]) -> list[tuple[int, datetime.datetime]]:
    """Record timers and their TIMER commands in one statement: (command id, fire_at) each.

    The queue positions are consecutive, in the order of ``specs``.
    """
    if not specs:
        return []
    rows = [
        {
            "ord": index,
            "timer_id": str(spec.timer_id),
            "step_id": spec.step_id,
            "purpose": str(spec.purpose),
            "timer_kind": str(TIMER_KIND_OF_PURPOSE[TimerPurpose(spec.purpose)]),
            "delay": spec.delay_seconds,
            "instant": None if spec.fire_at is None else spec.fire_at.isoformat(),
            "task_id": None if spec.task_id is None else str(spec.task_id),
            "target": spec.target,
            "branch_token_id": None if spec.branch_token_id is None else str(spec.branch_token_id),
            "fork_step_id": spec.fork_step_id,
            "branch_id": spec.branch_id,
            "metadata": spec.metadata,
        }
        for index, spec in enumerate(specs)
    ]
    result = db.fetchall(RECORD, {"wf": workflow_id, "n": len(specs), "specs": json.dumps(rows)})
    assert len(result) == len(specs)
    return [(int(r[0]), r[1]) for r in result]


def mark_fired(timer_id: Any) -> None:
    """SCHEDULED -> FIRED; raises :class:`TimerConflict` when the timer is not SCHEDULED."""
    if db.execute(MARK_FIRED, (timer_id,)) != 1:
        raise TimerConflict("the timer is no longer SCHEDULED")


def get(timer_id: Any) -> TimerRow | None:
    row = db.fetchone(SELECT, (timer_id,))
    if row is None:
        return None
    values = list(row)
    values[10] = db.load_json(values[10])
    return TimerRow(*values)


def _cancel(
    workflow_id: Any,
    last_error: str,
    *,
    timer_ids: Any = None,
    task_id: Any = None,
    step_id: str | None = None,
    purposes: Any = None,
    branch_token_ids: Any = None,
    keep_command_id: int | None = None,
) -> tuple[int, list[dict[str, Any]]]:
    row = db.fetchone(
        CANCEL,
        {
            "wf": workflow_id,
            "ids": None if timer_ids is None else [str(t) for t in timer_ids],
            "task": None if task_id is None else str(task_id),
            "step": step_id,
            "purposes": None if purposes is None else [str(p) for p in purposes],
            "branches": None if branch_token_ids is None else [str(b) for b in branch_token_ids],
            "keep": keep_command_id,
            "last_error": last_error,
        },
    )
    assert row is not None
    return int(row[0]), list(db.load_json(row[1]))


def cancel_scheduled(
    workflow_id: Any,
    *,
    timer_ids: Any = None,
    task_id: Any = None,
    step_id: str | None = None,
    purposes: Any = None,
    branch_token_ids: Any = None,
    keep_command_id: int | None = None,
    cancelled_commands: list[dict[str, Any]] | None = None,
) -> int:
    """Cancel the instance's SCHEDULED timers matching every filter given; returns the count.

    Their TIMER commands are CANCELLED in the same statement (``TIMER_CANCELLED``
    reason) while unsettled, except ``keep_command_id``: the command the
    caller's segment runs, which it settles itself (a FIRED timer is never
    matched, so a timer firing its own segment is safe without it). Appends
    no history; ``cancelled_commands`` (when given) receives the cancelled
    commands (id, seq, kind, timer_id) for the caller to log.
    ``branch_token_ids`` keeps only the timers of those branches (a
    superseded branch's timers; an empty list matches none).
    """
    count, commands = _cancel(
        workflow_id,
        text("TIMER_CANCELLED", "timer command cancelled with its timer"),
        timer_ids=timer_ids,
        task_id=task_id,
        step_id=step_id,
        purposes=purposes,
        branch_token_ids=branch_token_ids,
        keep_command_id=keep_command_id,
    )
    if cancelled_commands is not None:
        cancelled_commands.extend(commands)
    return count


def cancel_all_for_instance(
    workflow_id: Any, *, cancelled_commands: list[dict[str, Any]] | None = None
) -> int:
    """``cancel()``: every SCHEDULED timer of the instance and its command (INSTANCE_CANCELLED).

    Runs before the commands' ``cancel_all`` (timers before queues); the
    commands it cancels are settled, so ``cancel_all`` does not see them
    again. ``cancelled_commands`` receives them for the history entries.
    """
    count, commands = _cancel(
        workflow_id, text("INSTANCE_CANCELLED", "TIMER command cancelled with its instance")
    )
    if cancelled_commands is not None:
        cancelled_commands.extend(commands)
    return count


def make_due(workflow_id: Any = None, *, advance: datetime.timedelta | None = None) -> int:
    """Time skipping: move SCHEDULED timers forward as if ``advance`` had passed.

    With ``advance`` every SCHEDULED timer of the instance (of every instance
    when ``workflow_id`` is None) fires ``advance`` earlier: one due within
    it fires now, a later one stays that much closer, so advancing twice by
    a day fires what two days would. Without it every timer fires now. The
    TIMER commands' ``fire_at`` and ``available_at``, the timer rows'
    ``fire_at`` and the due date of a task whose DUE timer moved, move on
    the database clock (the transaction's ``now()``, so
    a test wrapped in one transaction sees them due); returns the number of
    timers now due. The executor then runs them through the command log as
    it would at their time, in their queue order.
    """
    seconds = None if advance is None else advance.total_seconds()
    row = db.fetchone(MAKE_DUE, {"wf": workflow_id, "advance": seconds})
    return 0 if row is None else int(row[0])
