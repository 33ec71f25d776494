"""workflow_commands and workflow_command_queues: the per-instance command log.

Every executor-side statement composes its eligibility from
:mod:`.eligibility`. Writers store ``last_error`` as ``<REASON_CODE>: <message>``
built by :func:`error_text` (at most 4000 characters, no payload values).
Statements that settle a SIGNAL into COMPLETE, REJECTED, STALE, FAILED or DEAD
lower ``open_signals`` in the same statement; moves between open states leave
it unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import failures
from ..engine.decision_log import HistoryEntry
from . import db, history, tasks
from .eligibility import claimable
from .instances import ENDED as ENDED_STATUSES
from .instances import ENDED_SQL

T = db.T

# The execution lock: two-integer advisory lock, first key a namespace of its
# own, second derived from the instance id (definition locks are one bigint,
# so the two never collide).
EXECUTION_LOCK_NAMESPACE = 0x56574600
LAST_ERROR_MAX = failures.LAST_ERROR_MAX
ENDED = ENDED_SQL


def execution_lock_sql(*, before: str = "") -> str:
    """The execution-lock statement: ``lock_timeout`` for this one wait, then restored.

    The caller's ``lock_timeout`` is read in a MATERIALIZED CTE, so it is
    evaluated before the first ``set_config`` (an inlined CTE would be read
    after it and "restore" the new value). The second parameter is the
    instance id. ``before`` adds select-list items evaluated first (the
    segment sets its deadline there).
    """
    return f"""
WITH prev AS MATERIALIZED (SELECT current_setting('lock_timeout') AS previous)
SELECT {before}set_config('lock_timeout', %s, true),
       pg_advisory_xact_lock({EXECUTION_LOCK_NAMESPACE}, hashtext(%s::text)),
       set_config('lock_timeout', prev.previous, true)
FROM prev
"""


LOCK_INSTANCE = execution_lock_sql()

TRY_LOCK_INSTANCE = f"""
SELECT pg_try_advisory_xact_lock({EXECUTION_LOCK_NAMESPACE}, hashtext(%s::text))
"""


def insert_command_from(source: str) -> str:
    """The insert of a PENDING command at ``q.seq`` (``insert_params``' names), from ``source``.

    ``source`` is the FROM list that yields ``q`` (the queue position) and
    decides whether a row is inserted. recorded_at is the clock at the
    insert; available_at the transaction's start (never later than the
    commit), so a command is claimable as soon as it is visible, even to a
    reader whose transaction began before the recording's.
    """
    return f"""INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, payload_json, dedup_key,
    target_json, context_json, explicit_carrier_json, actor_kind, actor_id, actor_reason,
    on_behalf_of, attribution_status, task_id, recorded_at, available_at)
SELECT %(wf)s, q.seq, %(kind)s, 'PENDING', %(payload)s::jsonb, %(dedup_key)s,
       %(target)s::jsonb, %(context)s::jsonb, %(carrier)s::jsonb, %(actor_kind)s, %(actor_id)s,
       %(actor_reason)s, %(on_behalf_of)s, %(attribution_status)s, %(task_id)s::uuid,
       clock_timestamp(), now()
FROM {source}
RETURNING id, seq"""


# Allocate the next queue position and insert the command in one statement.
INSERT_COMMAND = f"""
WITH q AS (
    INSERT INTO {T["command_queues"]} AS cq (workflow_id, next_seq) VALUES (%(wf)s, 2)
    ON CONFLICT (workflow_id) DO UPDATE SET next_seq = cq.next_seq + 1
    RETURNING next_seq - 1 AS seq
)
{insert_command_from("q")}
"""

# One more open signal, creating the queue row on first touch (its first
# position is then 1); no row returned when the instance is at the cap.
RAISE_OPEN_SIGNALS = f"""
INSERT INTO {T["command_queues"]} AS q (workflow_id, next_seq, open_signals) VALUES (%s, 1, 1)
ON CONFLICT (workflow_id) DO UPDATE SET open_signals = q.open_signals + 1
WHERE q.open_signals < %s
RETURNING 1
"""

PEEK = f"""
SELECT c.id, c.workflow_id, c.seq, c.kind, i.status, i.definition_scope_key, i.definition_id,
       i.definition_version, i.plan_hash, COALESCE(c.target_json ? 'branchId', FALSE)
FROM {T["commands"]} c JOIN {T["instances"]} i ON i.id = c.workflow_id
WHERE {claimable("c")}
ORDER BY c.available_at
LIMIT %s
"""

# The executor's common path in one autocommit statement: pick the oldest
# claimable head of a live instance whose plan this node holds and that has
# attempts left (row-locked, skipping heads another worker is taking), take its
# instance's execution lock without waiting, and claim it. Anything else
# (ended instances, dead letters, deferrals, a busy lock) is left to the
# peek path, which settles it.
#
# The claim commits with synchronous_commit off: it need not wait for its WAL
# flush, because nothing acts on a claim before the segment that follows it
# commits synchronously, and WAL is flushed in order, so a durable segment
# implies a durable claim. A claim lost in a crash is a claim never made: the
# command is PENDING again with its attempt unspent. The setting is made by the
# update's first condition, once a candidate is row-locked (a statement that
# locks nothing writes nothing to wait for).
#
# The kinds and the resident pins are tested as scalar jsonb conditions on the
# rows the walk reaches: no sub-plan, hash or function scan to set up on each
# execution (every node of a generic plan is initialised each time it runs,
# whether it reads a row or not). They are written as calls of jsonb_exists and
# jsonb_contains, the functions behind ``?`` and ``@>``: as operators the
# planner's estimator gives each a selectivity of 0.1 %, so it expected no
# candidate before the end of the index, priced the walk as reading all of it,
# and a plan that reads every active command and sorts them came within 10 to
# 15 % of it; statistics taken mid-drain tipped claims into that plan, each
# reading the whole backlog. A function call is priced at a third, and the walk
# at its first few heads (tests/test_stale_statistics.py).
#
# The instance is read per candidate, by its primary key, in a LATERAL subquery
# that PostgreSQL cannot flatten (OFFSET 0): the plan always walks the active
# commands in availability order and stops at the first runnable head. Joined
# plainly, statistics of workflow_instances taken while every instance had ended
# made the planner start from the instances of the pinned definitions and sort
# every candidate on each claim (docs/performance.md, "Statistics of the active
# commands").
_CLAIM_NEXT_CTES = f"""
cand AS (
    SELECT c.id, c.workflow_id,
           ARRAY[i.definition_id, i.definition_version::text, i.plan_hash,
                 i.definition_scope_key] AS claimed_pin
    FROM {T["commands"]} c
    CROSS JOIN LATERAL (
        SELECT li.definition_id, li.definition_version, li.plan_hash, li.definition_scope_key
        FROM {T["instances"]} li WHERE li.id = c.workflow_id AND li.status NOT IN {ENDED}
        OFFSET 0) i
    WHERE {claimable("c")}
      AND c.attempts < %(max_attempts)s
      AND jsonb_exists(%(kinds)s::jsonb, c.kind)
      AND NOT (c.kind = 'RETRY' AND COALESCE(c.target_json ? 'branchId', FALSE))
      AND jsonb_contains(%(resident)s::jsonb, jsonb_build_array(jsonb_build_object(
          'scope', i.definition_scope_key, 'id', i.definition_id,
          'version', i.definition_version)))
    ORDER BY c.available_at
    LIMIT 1
    FOR UPDATE OF c SKIP LOCKED
)"""
_CLAIM_NEXT_UPDATE = f"""
UPDATE {T["commands"]} c
SET state = 'CLAIMED', attempts = c.attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + make_interval(secs => %(lease)s), claimed_by = %(node)s
FROM cand
WHERE c.id = cand.id
  AND set_config('synchronous_commit', 'off', true) IS NOT NULL
  AND pg_try_advisory_xact_lock({EXECUTION_LOCK_NAMESPACE}, hashtext(cand.workflow_id::text))
RETURNING c.id, c.workflow_id, c.seq, c.kind, c.claim_token, c.attempts, cand.claimed_pin
"""
CLAIM_NEXT = f"WITH {_CLAIM_NEXT_CTES}{_CLAIM_NEXT_UPDATE}"

CLAIM_READ = f"""
SELECT c.id, c.workflow_id, c.seq, c.kind, c.attempts, c.target_json, c.task_id,
       c.actor_kind, c.actor_id, c.actor_reason, c.on_behalf_of, c.attribution_status,
       i.status, c.last_error
FROM {T["commands"]} c JOIN {T["instances"]} i ON i.id = c.workflow_id
WHERE c.id = %s AND {claimable("c")}
FOR UPDATE OF c
"""

CLAIM_UPDATE = f"""
UPDATE {T["commands"]}
SET state = 'CLAIMED', attempts = attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + make_interval(secs => %s), claimed_by = %s
WHERE id = %s
RETURNING claim_token, attempts
"""

# Settle a command without running it (ended instance, dead letter, failure,
# cancellation); lowers open_signals for a signal that leaves the open states.
SETTLE = f"""
WITH settled AS (
    UPDATE {T["commands"]}
    SET state = %(state)s, claim_token = NULL, lease_until = NULL,
        settled_at = CASE WHEN %(state)s = 'DEAD' THEN NULL ELSE now() END,
        last_error = %(last_error)s
    WHERE id = %(id)s
      AND (%(token)s::uuid IS NULL OR (state = 'CLAIMED' AND claim_token = %(token)s))
    RETURNING workflow_id, kind, state
), lowered AS (
    UPDATE {T["command_queues"]} q SET open_signals = GREATEST(q.open_signals - 1, 0)
    FROM settled WHERE q.workflow_id = settled.workflow_id AND settled.kind = 'SIGNAL'
      AND %(was_open)s
)
SELECT kind FROM settled
"""

PARK = f"""
UPDATE {T["commands"]}
SET state = 'PARKED', claim_token = NULL, lease_until = NULL, attempts = attempts - 1
WHERE id = %s AND state = 'CLAIMED' AND claim_token = %s
"""

# Parked signals a new wait accepts go back to PENDING with their seq: they
# are then the head of the queue and run next, in their recorded order.
REQUEUE_PARKED = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', available_at = LEAST(available_at, now()), last_error = NULL
WHERE workflow_id = %s AND state = 'PARKED' AND kind = 'SIGNAL'
  AND (target_json ->> 'name') = ANY(%s) AND (target_json ->> 'branchId') IS NULL
"""

# The branch twin of REQUEUE_PARKED: parked signals addressed to one branch
# of one fork (its key as the signal names it) that its new wait accepts.
REQUEUE_PARKED_FOR_BRANCH = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', available_at = LEAST(available_at, now()), last_error = NULL
WHERE workflow_id = %(wf)s AND state = 'PARKED' AND kind = 'SIGNAL'
  AND (target_json ->> 'name') = ANY(%(names)s::text[])
  AND (target_json ->> 'forkStepId') = %(fork)s AND (target_json ->> 'branchId') = %(branch)s
"""

# Parked signals addressed to superseded branches settle STALE (ascending id),
# lowering open_signals by their number in the same statement.
SETTLE_PARKED_FOR_BRANCHES = f"""
WITH addresses AS (
    SELECT * FROM jsonb_to_recordset(%(addresses)s::jsonb) AS a(fork text, branch text)
), doomed AS (
    SELECT c.id FROM {T["commands"]} c
    WHERE c.workflow_id = %(wf)s AND c.state = 'PARKED' AND c.kind = 'SIGNAL'
      AND EXISTS (SELECT 1 FROM addresses a
                  WHERE a.fork = (c.target_json ->> 'forkStepId')
                    AND a.branch = (c.target_json ->> 'branchId'))
    ORDER BY c.id FOR UPDATE
), settled AS (
    UPDATE {T["commands"]} c
    SET state = 'STALE', claim_token = NULL, lease_until = NULL, settled_at = now(),
        last_error = %(last_error)s
    FROM doomed WHERE c.id = doomed.id
    RETURNING c.id, c.seq, c.kind, c.target_json
), lowered AS (
    UPDATE {T["command_queues"]} q
    SET open_signals = GREATEST(q.open_signals - (SELECT count(*) FROM settled), 0)
    WHERE q.workflow_id = %(wf)s AND EXISTS (SELECT 1 FROM settled)
)
SELECT id, seq, kind, target_json FROM settled ORDER BY id
"""

# Timers and completions parked while the instance was FAILED go back to
# PENDING with their seq once a retry revived it; each is then offered to
# the step the instance stands at (applied, or settled STALE / REJECTED).
REQUEUE_PARKED_CALLBACKS = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', available_at = LEAST(available_at, now()), last_error = NULL
WHERE workflow_id = %s AND state = 'PARKED' AND kind IN ('TIMER', 'COMPLETION')
"""

# An ended instance settles its parked and dead-lettered commands.
SETTLE_ENDED = f"""
WITH doomed AS (
    SELECT id FROM {T["commands"]}
    WHERE workflow_id = %(wf)s AND state IN ('PARKED', 'DEAD') ORDER BY id FOR UPDATE
), settled AS (
    UPDATE {T["commands"]} c
    SET state = %(state)s, claim_token = NULL, lease_until = NULL, settled_at = now(),
        last_error = %(last_error)s
    FROM doomed WHERE c.id = doomed.id
    RETURNING c.id, c.seq, c.kind, c.target_json, c.actor_kind, c.actor_id, c.actor_reason,
              c.on_behalf_of, c.attribution_status,
              (SELECT state FROM {T["commands"]} o WHERE o.id = c.id) AS old_state, c.task_id
), released AS (
    -- the task a dead-lettered completion still reserves is cancelled with it
    UPDATE {T["tasks"]} t SET status = 'CANCELLED', version = t.version + 1, updated_at = now()
    FROM settled
    WHERE settled.kind = 'COMPLETION' AND t.id = settled.task_id AND t.status = 'COMPLETING'
      AND t.reservation_command_id = settled.id
), lowered AS (
    UPDATE {T["command_queues"]} q
    SET open_signals = GREATEST(q.open_signals - (
        SELECT count(*) FROM settled WHERE kind = 'SIGNAL' AND old_state = 'PARKED'), 0)
    WHERE q.workflow_id = %(wf)s
)
SELECT id, seq, kind, target_json, actor_kind, actor_id, actor_reason, on_behalf_of,
       attribution_status FROM settled ORDER BY id
"""

RELEASE = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', attempts = attempts - 1, claim_token = NULL, lease_until = NULL
WHERE id = %s AND state = 'CLAIMED' AND claim_token = %s
"""

# The backoff grows with the command's own transient_count (jittered by a factor
# in [0.5, 1]), so a command stuck on a lock or a deadline backs off further each time.
RETRY_TRANSIENT = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', attempts = attempts - 1, transient_count = transient_count + 1,
    available_at = now() + make_interval(secs =>
        LEAST(%(max_ms)s, %(base_ms)s * power(2, LEAST(transient_count, 30)))
        * (0.5 + random() / 2) / 1000.0),
    claim_token = NULL, lease_until = NULL, last_error = %(last_error)s
WHERE id = %(id)s AND state = 'CLAIMED' AND claim_token = %(token)s
"""

# A failed attempt keeps its spent attempt; the next claim dead-letters it at
# max_attempts.
RETRY_AFTER_ERROR = f"""
UPDATE {T["commands"]}
SET state = 'PENDING', available_at = now() + make_interval(secs => %s), claim_token = NULL,
    lease_until = NULL, last_error = %s
WHERE id = %s AND state = 'CLAIMED' AND claim_token = %s
"""

FENCE_FOR_FAILURE = f"""
SELECT id, workflow_id, seq, kind, target_json, actor_kind, actor_id, actor_reason, on_behalf_of,
       attribution_status, claimed_by, CASE WHEN kind = 'START' THEN payload_json END
FROM {T["commands"]} WHERE id = %s AND state = 'CLAIMED' AND claim_token = %s FOR UPDATE
"""

WORKFLOW_OF = f"SELECT workflow_id FROM {T['commands']} WHERE id = %s"

DEFER = f"""
UPDATE {T["commands"]}
SET state = 'DEFERRED', deferral_count = deferral_count + 1,
    available_at = now() + make_interval(secs => LEAST(5 * power(2, deferral_count), 300)),
    last_error = %s, claimed_by = %s
WHERE id = %s
RETURNING deferral_count, seq, kind
"""

DEFER_READ = f"""
SELECT c.id FROM {T["commands"]} c JOIN {T["instances"]} i ON i.id = c.workflow_id
WHERE c.id = %s AND {claimable("c")}
  AND i.definition_scope_key = %s AND i.definition_id = %s AND i.definition_version = %s
  AND i.plan_hash = %s
FOR UPDATE OF c
"""

# cancelAll: every open command of the instance, ascending id, in one statement.
CANCEL_ALL = f"""
WITH doomed AS (
    SELECT id, state AS old_state FROM {T["commands"]}
    WHERE workflow_id = %(wf)s AND state IN ('PENDING', 'DEFERRED', 'CLAIMED', 'PARKED', 'DEAD')
    ORDER BY id FOR UPDATE
), cancelled AS (
    UPDATE {T["commands"]} c
    SET state = 'CANCELLED', claim_token = NULL, lease_until = NULL, settled_at = now(),
        last_error = 'INSTANCE_CANCELLED: ' || c.kind || ' command cancelled with its instance'
    FROM doomed WHERE c.id = doomed.id
    RETURNING c.id, c.seq, c.kind, c.target_json, c.timer_id, c.task_id, doomed.old_state
), lowered AS (
    UPDATE {T["command_queues"]} q
    SET open_signals = GREATEST(q.open_signals - (
        SELECT count(*) FROM cancelled WHERE kind = 'SIGNAL' AND old_state <> 'DEAD'), 0)
    WHERE q.workflow_id = %(wf)s
)
SELECT id, seq, kind, target_json, timer_id, task_id FROM cancelled ORDER BY id
"""

# -- recovery (a RETRY command's segment, under the execution lock) ----------

# Whether the instance has dead letters, and the payload of its latest FAILED
# entry (which command failed it, and where a retry resumes it).
RECOVERY_FACTS = f"""
SELECT EXISTS (SELECT 1 FROM {T["commands"]} WHERE workflow_id = %(wf)s AND state = 'DEAD'),
       (SELECT payload_json FROM {T["history"]}
        WHERE workflow_id = %(wf)s AND event_type = 'FAILED'
        ORDER BY sequence DESC LIMIT 1)
"""

READ_START = f"""
SELECT id, seq, state, payload_json FROM {T["commands"]}
WHERE workflow_id = %s AND kind = 'START'
"""

SUPERSEDE_DEAD_START = f"""
UPDATE {T["commands"]}
SET state = 'SUPERSEDED', claim_token = NULL, lease_until = NULL, settled_at = now(),
    last_error = %s
WHERE workflow_id = %s AND kind = 'START' AND state = 'DEAD'
RETURNING id, seq
"""

# Every DEAD command (and the FAILED command a retry re-runs) back to PENDING
# with attempts 0, available now; open_signals rises by the re-offered signals
# without the cap check (their slots were released when they failed).
REOFFER = f"""
WITH offered AS (
    UPDATE {T["commands"]}
    SET state = 'PENDING', attempts = 0, claim_token = NULL, lease_until = NULL,
        available_at = LEAST(available_at, now()), settled_at = NULL, last_error = NULL
    WHERE workflow_id = %(wf)s
      AND (state = 'DEAD' OR (id = %(failed)s AND state = 'FAILED'))
    RETURNING id, seq, kind
), raised AS (
    UPDATE {T["command_queues"]}
    SET open_signals = open_signals + (SELECT count(*) FROM offered WHERE kind = 'SIGNAL')
    WHERE workflow_id = %(wf)s AND EXISTS (SELECT 1 FROM offered WHERE kind = 'SIGNAL')
)
SELECT id, seq, kind FROM offered ORDER BY id
"""

# Record side of wf.retry(): whether there is anything to retry, and an open RETRY.
RETRY_NEEDED = f"""
SELECT EXISTS (SELECT 1 FROM {T["commands"]} WHERE workflow_id = %(wf)s AND state = 'DEAD'),
       (SELECT id FROM {T["commands"]}
        WHERE workflow_id = %(wf)s AND kind = 'RETRY'
          AND state IN ('PENDING', 'DEFERRED', 'CLAIMED')
          AND NOT COALESCE(target_json ? 'branchId', FALSE)
        ORDER BY id LIMIT 1)
"""

# How an instance is doing: dead and parked counts (one read of the partial index).
HEALTH = f"""
SELECT count(*) FILTER (WHERE state = 'DEAD'), count(*) FILTER (WHERE state = 'PARKED')
FROM {T["commands"]} WHERE workflow_id = %s AND state IN ('PARKED', 'DEAD')
"""

# One database clock sample (the CTE's now(), read once) answers three delays:
# to the earliest PENDING/DEFERRED availability (0 when one is already
# available, NULL when nothing is pending), to the earliest one still in the
# future, and to a notification's epoch-millisecond hint (0 once it is due).
# NULLs stay NULL (GREATEST would turn them into 0): the clamp is in Python.
_DELAYS_CTES = f"""
clock AS MATERIALIZED (SELECT now() AS t),
pending AS (
  SELECT min(c.available_at) AS earliest,
         min(c.available_at) FILTER (WHERE c.available_at > (SELECT t FROM clock)) AS future
  FROM {T["commands"]} c WHERE c.state IN ('PENDING', 'DEFERRED')
)"""
_DELAYS_SELECT = """
SELECT ceil(extract(epoch FROM (p.earliest - k.t)) * 1000)::bigint,
       ceil(extract(epoch FROM (p.future - k.t)) * 1000)::bigint,
       (%(hint)s::bigint - floor(extract(epoch FROM k.t) * 1000))::bigint"""
AVAILABILITY_DELAYS_MS = f"WITH {_DELAYS_CTES}{_DELAYS_SELECT}\nFROM clock k, pending p\n"

# A notified worker's one statement: the claim of CLAIM_NEXT (committed on its
# own, as ever) and the delays of AVAILABILITY_DELAYS_MS from the same clock
# sample, so a notification for a due command is claimed in one round trip and
# one for a future time is scheduled by the same statement. The delays read the
# statement's snapshot, taken before the claim: they are used only when nothing
# was claimed.
CLAIM_NEXT_OR_DELAYS = f"""
WITH {_CLAIM_NEXT_CTES},
claimed AS ({_CLAIM_NEXT_UPDATE}),
{_DELAYS_CTES}{_DELAYS_SELECT}, claimed.*
FROM clock k CROSS JOIN pending p LEFT JOIN claimed ON TRUE
"""


@dataclass(frozen=True)
class AvailabilityDelays:
    """Delays in milliseconds measured from one database clock sample.

    ``earliest``: to the earliest PENDING or DEFERRED availability, 0 when one
    is already available, None when nothing is pending. ``next_future``: to the
    earliest availability still in the future (None when there is none); the
    executor schedules its wake-up with it when an available command could not
    be claimed (it is behind a head in flight, or held back). ``hint``: to the
    epoch-millisecond time a notification carried (0 once due), or None.
    """

    earliest: int | None
    next_future: int | None
    hint: int | None = None


error_text = failures.text


@dataclass(frozen=True)
class Actor:
    """Who asked for a command (the attribution columns)."""

    kind: str = "NONE"
    id: str | None = None
    reason: str | None = None
    on_behalf_of: str | None = None
    status: str = "ABSENT"

    def history_columns(self) -> dict[str, Any]:
        return {
            "actor_kind": self.kind,
            "actor_id": self.id,
            "actor_reason": self.reason,
            "on_behalf_of": self.on_behalf_of,
            "attribution_status": self.status,
        }


def actor_from_row(
    kind: str | None,
    actor_id: str | None,
    reason: str | None,
    on_behalf_of: str | None,
    status: str | None,
) -> Actor:
    if kind is None:
        return Actor()
    return Actor(kind, actor_id, reason, on_behalf_of, status or "ABSENT")


@dataclass(frozen=True)
class Head:
    """A claimable head as peek sees it, with its instance's pin."""

    id: int
    workflow_id: Any
    seq: int
    kind: str
    instance_status: str
    definition_scope_key: str
    definition_id: str
    definition_version: int
    plan_hash: str
    branch_addressed: bool = False

    @property
    def instance_ended(self) -> bool:
        return self.instance_status in ENDED_STATUSES


@dataclass(frozen=True)
class Claim:
    """The result of a claim: CLAIMED (token set), SETTLED, DEAD, or BUSY."""

    outcome: str
    command_id: int
    token: Any = None
    attempts: int = 0


@dataclass(frozen=True)
class FencedCommand:
    id: int
    workflow_id: Any
    seq: int
    kind: str
    payload: Any
    target: Any
    dedup_key: str | None
    context: Any
    explicit_carrier: Any
    actor: Actor
    attempts: int
    claimed_by: str | None
    timer_kind: str | None
    timer_id: Any
    task_id: Any


# -- record side -----------------------------------------------------------


def lock_instance(workflow_id: Any, lock_timeout_ms: int) -> None:
    """Take the execution lock, waiting at most ``lock_timeout_ms`` for it."""
    db.fetchone_prepared(LOCK_INSTANCE, (f"{int(lock_timeout_ms)}ms", str(workflow_id)))


def try_lock_instance(workflow_id: Any) -> bool:
    row = db.fetchone(TRY_LOCK_INSTANCE, (str(workflow_id),))
    return bool(row and row[0])


def insert(workflow_id: Any, kind: str, **fields: Any) -> tuple[int, int]:
    """Insert a PENDING command at the next queue position; returns (id, seq).

    ``fields`` are :func:`insert_params`' keywords (payload, dedup key,
    target, context, carrier, actor, and ``task_id``, the task a COMPLETION
    completes).
    """
    row = db.fetchone_prepared(INSERT_COMMAND, insert_params(workflow_id, kind, **fields))
    assert row is not None
    return row[0], row[1]


def insert_params(
    workflow_id: Any,
    kind: str,
    *,
    payload: Any = None,
    dedup_key: str | None = None,
    target: Any = None,
    context: Any = None,
    carrier: Any = None,
    actor: Actor | None = None,
    task_id: Any = None,
) -> dict[str, Any]:
    """The named parameters of a command's insert (``INSERT_COMMAND``; JSON values dumped)."""
    actor = actor or Actor()
    return {
        "wf": workflow_id,
        "kind": kind,
        "payload": None if payload is None else json.dumps(payload),
        "dedup_key": dedup_key,
        "target": None if target is None else json.dumps(target),
        "context": None if context is None else json.dumps(context),
        "carrier": None if carrier is None else json.dumps(carrier),
        "actor_kind": actor.kind,
        "actor_id": actor.id,
        "actor_reason": actor.reason,
        "on_behalf_of": actor.on_behalf_of,
        "attribution_status": actor.status,
        "task_id": None if task_id is None else str(task_id),
    }


def raise_open_signals(workflow_id: Any, cap: int) -> bool:
    """Count one more open signal; False when the instance is at the cap."""
    return db.fetchone_prepared(RAISE_OPEN_SIGNALS, (workflow_id, cap)) is not None


def peek(limit: int) -> list[Head]:
    """Claimable heads with their pins, oldest availability first (no locks)."""
    return [Head(*row) for row in db.fetchall(PEEK, (limit,))]


def _settle(
    command_id: int, state: str, last_error: str | None, *, token: Any = None, was_open: bool = True
) -> str | None:
    row = db.fetchone(
        SETTLE,
        {
            "id": command_id,
            "state": state,
            "last_error": last_error,
            "token": token,
            "was_open": was_open,
        },
    )
    return None if row is None else row[0]


def claim(
    command_id: int, workflow_id: Any, *, node_id: str, lease_seconds: float, max_attempts: int
) -> Claim | None:
    """Claim a head; call inside a transaction of its own.

    Returns None when the lock is busy or the command is no longer claimable.
    An ended instance settles the command (no attempt spent); a command out
    of attempts is dead-lettered (a START also fails its instance).
    """
    if not try_lock_instance(workflow_id):
        return None
    row = db.fetchone(CLAIM_READ, (command_id,))
    if row is None:
        return None
    (
        cid,
        wf,
        seq,
        kind,
        attempts,
        target,
        task_id,
        a_kind,
        a_id,
        a_reason,
        a_obo,
        a_status,
        instance_status,
        previous_error,
    ) = row
    target = db.load_json(target)
    actor = actor_from_row(a_kind, a_id, a_reason, a_obo, a_status)
    common = {"command_id": cid, **actor.history_columns()}
    if instance_status in ENDED_STATUSES:
        branch_addressed = kind == "SIGNAL" and bool((target or {}).get("branchId"))
        if instance_status == "CANCELLED":
            state, event = "CANCELLED", "COMMAND_CANCELLED"
            reason = error_text("INSTANCE_CANCELLED", f"{kind} command of a cancelled instance")
        elif kind == "TIMER" or branch_addressed:
            state, event = "STALE", "COMMAND_STALE"
            reason = error_text("INSTANCE_ENDED", f"{kind} command of an ended instance")
        else:
            state, event = "REJECTED", "COMMAND_REJECTED"
            reason = error_text("INSTANCE_ENDED", f"{kind} command of an ended instance")
        if kind == "COMPLETION" and task_id is not None:
            # the reservation settles with its command (tasks before commands)
            tasks.cancel_reserved(task_id, cid)
        _settle(cid, state, reason)
        history.append(
            wf, [HistoryEntry(event, _command_payload(cid, seq, kind, target, reason))], **common
        )
        return Claim("SETTLED", cid)
    if attempts >= max_attempts:
        cause = failures.parse(previous_error)
        reason = failures.attempts_exhausted(cause.step, kind, attempts, max_attempts, cause.code)
        _dead_letter(cid, wf, seq, kind, target, reason, cause.step, None, common)
        return Claim("DEAD", cid)
    claimed = db.fetchone(CLAIM_UPDATE, (lease_seconds, node_id, cid))
    assert claimed is not None
    return Claim("CLAIMED", cid, claimed[0], claimed[1])


@dataclass(frozen=True)
class ClaimedCommand:
    """A command claimed by :func:`claim_next`, with its instance's pin."""

    id: int
    workflow_id: Any
    seq: int
    kind: str
    token: Any
    attempts: int
    definition_id: str
    definition_version: int
    plan_hash: str
    definition_scope_key: str = "default"


def claim_next(
    *,
    node_id: str,
    lease_seconds: float,
    max_attempts: int,
    resident: Sequence[tuple[str, str, int]],
    kinds: Sequence[str],
) -> ClaimedCommand | None:
    """Claim the oldest runnable head in one autocommit statement (None: use the peek path).

    ``resident`` lists the pins (definition scope, id, version) this node can
    run, whatever their plan hash; ``kinds`` the command kinds its engine runs.
    Must run outside a transaction so the statement commits (and releases the
    execution lock it tried) on its own.
    """
    if not resident:
        return None
    row = db.fetchone_prepared(
        claim_statement(CLAIM_NEXT, resident, kinds),
        _claim_next_params(node_id, lease_seconds, max_attempts),
    )
    return None if row is None else _claimed(row)


def claim_next_or_delays(
    *,
    node_id: str,
    lease_seconds: float,
    max_attempts: int,
    resident: Sequence[tuple[str, str, int]],
    kinds: Sequence[str],
    hint_ms: int | None,
) -> ClaimedCommand | AvailabilityDelays:
    """:func:`claim_next`, or when it claims nothing :func:`availability_delays`: one statement.

    A notified worker's first statement: a notification for a due command is
    claimed in one round trip; one for a future time (or for a command another
    worker took) answers the delays the worker schedules its wake-up with,
    measured on the database clock as :func:`availability_delays` measures them.
    Like :func:`claim_next`, it must run outside a transaction.
    """
    if not resident:
        return availability_delays(hint_ms)
    params = _claim_next_params(node_id, lease_seconds, max_attempts)
    row = db.fetchone_prepared(
        claim_statement(CLAIM_NEXT_OR_DELAYS, resident, kinds), {**params, "hint": hint_ms}
    )
    assert row is not None  # the delays' one row, with or without a claim
    delays, claimed = row[:3], row[3:]
    if claimed[0] is not None:
        return _claimed(claimed)
    return _delays(delays)


def claim_after_commit(
    *,
    node_id: str,
    lease_seconds: float,
    max_attempts: int,
    resident: Sequence[tuple[str, str, int]],
    kinds: Sequence[str],
) -> db.AfterCommit | None:
    """:func:`claim_next`'s statement, to send behind a segment's ``COMMIT`` (None: no pins).

    The segment's persist sends it in its own wait (``db.AfterCommit``): the
    claim then runs once the segment has committed, as the implicit
    transaction of its own a claim is, and the worker is spared one round
    trip before its next segment. :func:`claimed_after_commit` reads what it
    claimed.
    """
    if not resident:
        return None
    return db.AfterCommit(
        claim_statement(CLAIM_NEXT, resident, kinds),
        _claim_next_params(node_id, lease_seconds, max_attempts),
    )


def claimed_after_commit(after: db.AfterCommit | None) -> ClaimedCommand | None:
    """The command a :func:`claim_after_commit` statement claimed; None: not sent, none, failed."""
    if after is None or after.row is None:
        return None
    return _claimed(after.row)


def _claim_next_params(node_id: str, lease_seconds: float, max_attempts: int) -> dict[str, Any]:
    return {"max_attempts": max_attempts, "lease": lease_seconds, "node": node_id}


# The claim's kinds and resident pins are constants of its statement's text, not
# parameters: PostgreSQL parses a jsonb parameter on every execution, and the
# resident pins grow with the definitions a node holds (seven objects in the
# benchmark's catalog, 40 % of the JSON a 3-action instance made the server
# parse). As constants they are parsed once, when the statement is prepared on
# a connection. Both change rarely (a definition version loaded, a document
# published): each set is one more statement, prepared once per connection.
_CLAIM_TEXTS_LIMIT = 64
_claim_texts: dict[tuple[str, tuple[Any, ...], tuple[str, ...]], str] = {}


def claim_statement(
    template: str, resident: Sequence[tuple[str, str, int]], kinds: Sequence[str]
) -> str:
    """``template`` (CLAIM_NEXT or CLAIM_NEXT_OR_DELAYS) with the kinds and pins written in."""
    key = (template, tuple(resident), tuple(kinds))
    text = _claim_texts.get(key)
    if text is None:
        pins = [{"scope": scope, "id": id_, "version": version} for scope, id_, version in resident]
        text = template.replace("%(kinds)s::jsonb", jsonb_constant(json.dumps(list(kinds))))
        text = text.replace("%(resident)s::jsonb", jsonb_constant(json.dumps(pins)))
        if len(_claim_texts) >= _CLAIM_TEXTS_LIMIT:
            _claim_texts.clear()  # more sets than a process sees: start over
        _claim_texts[key] = text
    return text


def jsonb_constant(document: str) -> str:
    """``document`` as a dollar-quoted ``jsonb`` constant of a statement with placeholders.

    Dollar quoting reads the same whatever ``standard_conforming_strings`` is;
    the tag is one the document does not contain, and ``%`` is doubled so the
    placeholder conversion leaves it as it is.
    """
    tag = "$vwf$"
    n = 0
    while tag in document:
        n += 1
        tag = f"$vwf{n}$"
    return f"{tag}{document.replace('%', '%%')}{tag}::jsonb"


def _claimed(row: Sequence[Any]) -> ClaimedCommand:
    cid, wf, seq, kind, token, attempts, pin = row
    return ClaimedCommand(cid, wf, seq, kind, token, attempts, pin[0], int(pin[1]), pin[2], pin[3])


def _command_payload(
    command_id: int, seq: int, kind: str, target: Any, reason: str | None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"commandId": command_id, "seq": seq, "kind": kind}
    if kind == "SIGNAL" and target:
        payload["signal"] = str(target.get("name", ""))[:255]
    if reason:
        payload["reason"] = reason
    return payload


def park(command_id: int, token: Any) -> int:
    return db.execute(PARK, (command_id, token))


def requeue_parked(workflow_id: Any, signal_names: list[str]) -> int:
    return db.execute(REQUEUE_PARKED, (workflow_id, signal_names))


def requeue_parked_for_branch(
    workflow_id: Any, fork_step_id: str, branch_id: str, signal_names: Sequence[str]
) -> int:
    """Parked SIGNALs addressed to that fork and branch, named by its new wait -> PENDING.

    ``fork_step_id`` is matched as the signal's ``forkStepId`` names it. The
    branch twin of :func:`requeue_parked` (which re-queues only signals that
    name no branch); returns how many went back.
    """
    return db.execute(
        REQUEUE_PARKED_FOR_BRANCH,
        {"wf": workflow_id, "names": list(signal_names), "fork": fork_step_id, "branch": branch_id},
    )


def settle_parked_for_branches(
    workflow_id: Any, branches: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Parked SIGNALs addressed to superseded branches settle STALE (``BRANCH_SUPERSEDED``).

    ``branches`` lists (fork step id, branch id) addresses. ``open_signals``
    falls by their number in the same statement. Appends no history: the
    settled commands (id, seq, kind, target) are returned for the caller's
    ``BRANCH_LATE_CALLBACK_IGNORED`` entries.
    """
    if not branches:
        return []
    addresses = [{"fork": fork, "branch": branch} for fork, branch in branches]
    rows = db.fetchall(
        SETTLE_PARKED_FOR_BRANCHES,
        {
            "wf": workflow_id,
            "addresses": json.dumps(addresses),
            "last_error": error_text(
                "BRANCH_SUPERSEDED", "SIGNAL command addressed to a superseded branch"
            ),
        },
    )
    return [{"id": r[0], "seq": r[1], "kind": r[2], "target": db.load_json(r[3])} for r in rows]


def requeue_parked_callbacks(workflow_id: Any) -> int:
    """Offer again the timers and completions parked while the instance was FAILED."""
    return db.execute(REQUEUE_PARKED_CALLBACKS, (workflow_id,))


def settle_ended(workflow_id: Any, *, cancelled: bool) -> int:
    """Settle an ended instance's PARKED and DEAD commands, one history entry each."""
    if cancelled:
        state, event = "CANCELLED", "COMMAND_CANCELLED"
        reason = error_text("INSTANCE_CANCELLED", "command of a cancelled instance")
    else:
        state, event = "REJECTED", "COMMAND_REJECTED"
        reason = error_text("INSTANCE_ENDED", "command of an ended instance")
    rows = db.fetchall(SETTLE_ENDED, {"wf": workflow_id, "state": state, "last_error": reason})
    for cid, seq, kind, target, *actor_cols in rows:
        target = db.load_json(target)
        history.append(
            workflow_id,
            [HistoryEntry(event, _command_payload(cid, seq, kind, target, reason))],
            command_id=cid,
            **actor_from_row(*actor_cols).history_columns(),
        )
    return len(rows)


def release(command_id: int, token: Any) -> int:
    """Return an unstarted claim to PENDING with its attempt restored (no lock)."""
    return db.execute(RELEASE, (command_id, token))


def retry_transient(command_id: int, token: Any, reason: str, *, base_ms: int, max_ms: int) -> int:
    """Back to PENDING with the attempt restored, after a backoff of its transient count."""
    return db.execute(
        RETRY_TRANSIENT,
        {
            "id": command_id,
            "token": token,
            "last_error": reason,
            "base_ms": base_ms,
            "max_ms": max_ms,
        },
    )


def retry_after_error(command_id: int, token: Any, backoff_seconds: float, reason: str) -> int:
    """Back to PENDING after a failed attempt (spent), available after the backoff."""
    return db.execute(RETRY_AFTER_ERROR, (backoff_seconds, reason, command_id, token))


def _dead_letter(
    cid: int,
    wf: Any,
    seq: int,
    kind: str,
    target: Any,
    reason: str,
    step: str | None,
    start_payload: Any,
    common: dict[str, Any],
) -> None:
    """DEAD with a COMMAND_DEAD_LETTERED entry; a dead START also fails its instance.

    The caller holds the execution lock and the command's row lock.
    """
    from . import instances

    entries = [
        HistoryEntry("COMMAND_DEAD_LETTERED", _command_payload(cid, seq, kind, target, reason))
    ]
    if kind == "START":
        resumed = instances.mark_failed(
            wf, "ATTEMPTS_EXHAUSTED", reason, step=step, state_if_none=start_payload
        )
        if resumed is not None:
            entries.append(_failed_entry(cid, reason, step, resumed))
    _settle(cid, "DEAD", reason)
    history.append(wf, entries, **common)


def _failed_entry(
    cid: int, reason: str, step: str | None, resumed: tuple[str, str | None]
) -> HistoryEntry:
    """The reference's FAILED entry (step id null); names where a retry resumes."""
    return HistoryEntry(
        "FAILED",
        {
            "reason": reason,
            "commandId": cid,
            "step": step,
            "resumeStatus": resumed[0],
            "resumeStep": resumed[1],
        },
        outcome="FAILED",
    )


def _fenced_for_failure(command_id: int, token: Any) -> tuple[Any, ...] | str:
    """Failure dispositions: the execution lock first, then the fenced command row.

    Lock order (the reference): execution lock, then rows; a busy lock answers
    BUSY and writes nothing, a lost claim CLAIM_LOST.
    """
    row = db.fetchone(WORKFLOW_OF, (command_id,))
    if row is None:
        return "CLAIM_LOST"
    if not try_lock_instance(row[0]):
        return "BUSY"
    fenced = db.fetchone(FENCE_FOR_FAILURE, (command_id, token))
    return "CLAIM_LOST" if fenced is None else fenced


def fail(command_id: int, token: Any, reason_code: str, reason: str, step: str | None) -> str:
    """Failure disposition, in a transaction of its own: BUSY, CLAIM_LOST or FAILED.

    ``reason`` is the stored text (``failures``). The command becomes FAILED
    and its instance FAILED at ``step`` (unless already ended or failed) with
    a FAILED history entry; writes go instances, then commands and queues.
    """
    from . import instances

    fenced = _fenced_for_failure(command_id, token)
    if isinstance(fenced, str):
        return fenced
    cid, wf, _seq, _kind, _target, *rest = fenced
    actor = actor_from_row(*rest[:5])
    start_payload = db.load_json(rest[6])
    entries = []
    resumed = instances.mark_failed(wf, reason_code, reason, step=step, state_if_none=start_payload)
    if resumed is not None:
        entries.append(_failed_entry(cid, reason, step, resumed))
    _settle(cid, "FAILED", reason, token=token)
    history.append(wf, entries, command_id=cid, executor_id=rest[5], **actor.history_columns())
    return "FAILED"


def dead_letter(command_id: int, token: Any, reason: str, step: str | None) -> str:
    """Dead-letter a claimed command whose failing step spent its attempts: BUSY, CLAIM_LOST, DEAD.

    The same writes as the claim's dead letter, in a transaction of its own.
    """
    fenced = _fenced_for_failure(command_id, token)
    if isinstance(fenced, str):
        return fenced
    cid, wf, seq, kind, target, *rest = fenced
    actor = actor_from_row(*rest[:5])
    common = {"command_id": cid, "executor_id": rest[5], **actor.history_columns()}
    _dead_letter(
        cid, wf, seq, kind, db.load_json(target), reason, step, db.load_json(rest[6]), common
    )
    return "DEAD"


def defer(command_id: int, head: Head, reason: str, node_id: str | None = None) -> int:
    """Defer a head this node cannot run; returns the new deferral count (0: nothing).

    ``claimed_by`` keeps the node that deferred it last (the doctor names it:
    a deferral that never clears is a plan no node that saw it has).
    """
    if not try_lock_instance(head.workflow_id):
        return 0
    if (
        db.fetchone(
            DEFER_READ,
            (
                command_id,
                head.definition_scope_key,
                head.definition_id,
                head.definition_version,
                head.plan_hash,
            ),
        )
        is None
    ):
        return 0
    row = db.fetchone(DEFER, (error_text("NOT_RUNNABLE", reason), node_id, command_id))
    assert row is not None
    count, seq, kind = row
    if count == 1:
        history.append(
            head.workflow_id,
            [
                HistoryEntry(
                    "COMMAND_DEFERRED",
                    {
                        "commandId": command_id,
                        "seq": seq,
                        "kind": kind,
                        "reason": error_text("NOT_RUNNABLE", reason),
                    },
                )
            ],
            command_id=command_id,
        )
    return int(count)


def cancel_all(workflow_id: Any) -> list[dict[str, Any]]:
    """Cancel every open command of the instance (caller holds the execution lock)."""
    rows = db.fetchall(CANCEL_ALL, {"wf": workflow_id})
    return [
        {
            "id": r[0],
            "seq": r[1],
            "kind": r[2],
            "target": db.load_json(r[3]),
            "timer_id": r[4],
            "task_id": r[5],
        }
        for r in rows
    ]


@dataclass(frozen=True)
class RecoveryFacts:
    has_dead: bool
    failed_entry: dict[str, Any] | None


def recovery_facts(workflow_id: Any) -> RecoveryFacts:
    row = db.fetchone(RECOVERY_FACTS, {"wf": workflow_id})
    assert row is not None
    entry = db.load_json(row[1])
    return RecoveryFacts(bool(row[0]), entry if isinstance(entry, dict) else None)


def read_start(workflow_id: Any) -> tuple[int, int, str, Any] | None:
    """The instance's START command: (id, seq, state, payload)."""
    row = db.fetchone(READ_START, (workflow_id,))
    return None if row is None else (row[0], row[1], row[2], db.load_json(row[3]))


def supersede_dead_start(workflow_id: Any) -> tuple[int, int] | None:
    """A DEAD START becomes SUPERSEDED (a START in any other state is left alone)."""
    reason = error_text("SUPERSEDED", "START command superseded by a retry")
    row = db.fetchone(SUPERSEDE_DEAD_START, (reason, workflow_id))
    return None if row is None else (row[0], row[1])


def reoffer(workflow_id: Any, failed_command_id: int | None) -> list[tuple[int, int, str]]:
    """Re-offer every DEAD command and the FAILED one a retry re-runs (one statement)."""
    rows = db.fetchall(REOFFER, {"wf": workflow_id, "failed": failed_command_id})
    return [(r[0], r[1], r[2]) for r in rows]


def retry_needed(workflow_id: Any) -> tuple[bool, int | None]:
    """(has dead letters, id of an open RETRY command)."""
    row = db.fetchone(RETRY_NEEDED, {"wf": workflow_id})
    assert row is not None
    return bool(row[0]), row[1]


def health(workflow_id: Any) -> tuple[int, int]:
    """(dead, parked) command counts of an instance."""
    row = db.fetchone(HEALTH, (workflow_id,))
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def reject(command_id: int, token: Any, reason: str) -> str | None:
    """Settle a claimed command REJECTED with a reason (fenced on the claim)."""
    return _settle(command_id, "REJECTED", reason, token=token)


def stale(command_id: int, token: Any, reason: str) -> str | None:
    """Settle a claimed command STALE with a reason (fenced on the claim): it applies nowhere."""
    return _settle(command_id, "STALE", reason, token=token)


def availability_delays(hint_ms: int | None = None) -> AvailabilityDelays:
    """The executor's idle read: every delay from one database clock sample."""
    # prepared: a worker reads it after every due notification, before it claims
    row = db.fetchone_prepared(AVAILABILITY_DELAYS_MS, {"hint": hint_ms})
    if row is None:
        return AvailabilityDelays(None, None, None)
    return _delays(row)


def _delays(row: Sequence[Any]) -> AvailabilityDelays:
    def ms(value: Any) -> int | None:
        return None if value is None else max(0, int(value))

    return AvailabilityDelays(ms(row[0]), ms(row[1]), ms(row[2]))


def earliest_availability_delay_ms() -> int | None:
    """Milliseconds from the database clock to the earliest PENDING/DEFERRED availability.

    0 when a command is already available, None when nothing is pending (the
    reference's ``findEarliestAvailabilityDelayMs()``).
    """
    return availability_delays().earliest
