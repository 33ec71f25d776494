"""Retention's statements: archive and purge batches, as the reference describes.

Each batch is one transaction at READ COMMITTED (whatever the server
default), in two steps:

1. **Candidates** — ``FOR UPDATE SKIP LOCKED`` (another retention run's rows
   are skipped, never waited for), then ``pg_try_advisory_xact_lock`` on each
   candidate's execution lock, the executors' own two integers, without
   waiting. The candidates are a ``MATERIALIZED`` CTE, so the try-lock runs
   exactly once per candidate row and never on a row a later filter drops. A
   candidate whose lock is held is *busy*: skipped, counted, and removed by a
   later run; it still counts against the batch limit.
2. **Eligibility again**, in a statement of its own (a snapshot taken after
   the locks were won): an instance that is no longer eligible, or that has a
   PENDING, DEFERRED or CLAIMED command, is *left alone* (a RETRY recorded on
   an archive-eligible FAILED instance keeps it until the retry has run).

Archive stamps ``archived_at`` from the database clock. Purge deletes the
instance (history, commands and its queue row go by the foreign keys'
cascade) after its timers, tasks, branch tokens and join states (lock order:
timers, tasks, branch tokens, instances, queues), and its service calls,
events, and dedup keys other than the START key: a start key outlives its
instance, so a late replay of that start answers "no longer exists" instead
of starting it again.

Which dedup keys are the instance's: every ``workflow_dedup`` row names its
owner in ``workflow_id`` (indexed), whatever its namespace says. SIGNAL keys
(namespace: the instance id; a child's outcome signal is the *parent's* row,
owned by the parent), TASK_COMPLETION / TASK_REASSIGNMENT keys (namespace:
the task id, ``workflow_id`` the task's instance), RETRY keys (namespace: the
instance), DISPATCH keys (namespace: the instance, or
instance/branch token) are deduplication *within* the instance: with the
instance gone nothing can be delivered to it twice, so they go. A START key
(namespace: the definition, ``workflow_id`` the started instance) guards
against a second instance and is kept, as above. Matching on ``workflow_id``
rather than parsing namespaces never touches another instance's keys.

Candidates come in keyset order — ``(updated_at, id)`` for an archive,
``(archived_at, id)`` for a purge — so a sweep's next batch continues after
the last candidate of the one before and a busy or left-alone instance is not
picked again in the same sweep.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

from . import db
from .commands import EXECUTION_LOCK_NAMESPACE
from .eligibility import ACTIVE_STATES

T = db.T

READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

_TRY_LOCK = f"pg_try_advisory_xact_lock({EXECUTION_LOCK_NAMESPACE}, hashtext(c.id::text))"

ARCHIVE_CANDIDATES = f"""
WITH c AS MATERIALIZED (
    SELECT id, updated_at FROM {T["instances"]}
    WHERE archived_at IS NULL AND status = %(status)s
      AND updated_at < now() - make_interval(secs => %(age)s)
      AND (updated_at, id) > (%(after_at)s, %(after_id)s)
    ORDER BY updated_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
SELECT c.id, c.updated_at, {_TRY_LOCK} FROM c ORDER BY c.updated_at, c.id
"""

NO_ACTIVE_COMMAND = f"""NOT EXISTS (
    SELECT 1 FROM {T["commands"]} a WHERE a.workflow_id = i.id AND a.state IN {ACTIVE_STATES})"""

ARCHIVE = f"""
UPDATE {T["instances"]} i SET archived_at = now()
WHERE i.id = ANY(%(ids)s::uuid[]) AND i.archived_at IS NULL AND i.status = %(status)s
  AND i.updated_at < now() - make_interval(secs => %(age)s)
  AND {NO_ACTIVE_COMMAND}
RETURNING i.id
"""

PURGE_CANDIDATES = f"""
WITH c AS MATERIALIZED (
    SELECT id, archived_at FROM {T["instances"]}
    WHERE archived_at IS NOT NULL AND archived_at < %(cutoff)s
      AND (archived_at, id) > (%(after_at)s, %(after_id)s)
    ORDER BY archived_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
SELECT c.id, c.archived_at, {_TRY_LOCK} FROM c ORDER BY c.archived_at, c.id
"""

PURGE_ELIGIBLE = f"""
SELECT i.id FROM {T["instances"]} i
WHERE i.id = ANY(%(ids)s::uuid[]) AND i.archived_at IS NOT NULL AND i.archived_at < %(cutoff)s
  AND {NO_ACTIVE_COMMAND}
"""

# In lock order; the instance last (its history, commands and queue row cascade).
PURGE_DEPENDENTS = [
    f"DELETE FROM {T['timers']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['tasks']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['branch_tokens']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['join_states']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['service_outbox']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['events']} WHERE workflow_id = ANY(%(ids)s::uuid[])",
    f"DELETE FROM {T['dedup']} WHERE workflow_id = ANY(%(ids)s::uuid[]) AND kind <> 'START'",
]

PURGE = f"DELETE FROM {T['instances']} WHERE id = ANY(%(ids)s::uuid[])"

# where a sweep starts: before every row
EPOCH = datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)
NIL = uuid.UUID(int=0)

UNARCHIVE = (
    f"UPDATE {T['instances']} SET archived_at = NULL WHERE id = %s AND archived_at IS NOT NULL"
)


@dataclass(frozen=True)
class Batch:
    """What one batch did; ``after`` is where the next batch of a sweep starts."""

    candidates: int
    processed: int
    busy: int
    left_alone: int
    after: tuple[datetime.datetime, uuid.UUID] | None


def _candidates(sql: str, params: dict[str, Any]) -> tuple[list[Any], int, Any]:
    db.execute(READ_COMMITTED)
    rows = db.fetchall(sql, params)
    locked = [row[0] for row in rows if row[2]]
    after = (rows[-1][1], rows[-1][0]) if rows else None
    return locked, len(rows), after


def archive_batch(
    status: str, age_seconds: float, batch: int, after: tuple[Any, Any] | None
) -> Batch:
    """One archive batch; the caller runs it as one transaction (``atomic``)."""
    after_at, after_id = after or (EPOCH, NIL)
    params = {
        "status": status,
        "age": age_seconds,
        "batch": batch,
        "after_at": after_at,
        "after_id": after_id,
    }
    locked, count, last = _candidates(ARCHIVE_CANDIDATES, params)
    archived = len(db.fetchall(ARCHIVE, {**params, "ids": locked})) if locked else 0
    return Batch(count, archived, count - len(locked), len(locked) - archived, last)


def purge_batch(cutoff: datetime.datetime, batch: int, after: tuple[Any, Any] | None) -> Batch:
    """One purge batch of instances archived before ``cutoff``; run as one transaction."""
    after_at, after_id = after or (EPOCH, NIL)
    params = {"cutoff": cutoff, "batch": batch, "after_at": after_at, "after_id": after_id}
    locked, count, last = _candidates(PURGE_CANDIDATES, params)
    eligible = (
        [row[0] for row in db.fetchall(PURGE_ELIGIBLE, {**params, "ids": locked})] if locked else []
    )
    if eligible:
        ids = {"ids": eligible}
        for statement in PURGE_DEPENDENTS:
            db.execute(statement, ids)
        db.execute(PURGE, ids)
    return Batch(count, len(eligible), count - len(locked), len(locked) - len(eligible), last)


def unarchive(instance_id: Any) -> bool:
    """Clear ``archived_at`` (a retry revives the instance); the caller holds the lock."""
    return db.execute(UNARCHIVE, (instance_id,)) == 1
