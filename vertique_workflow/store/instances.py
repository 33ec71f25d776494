"""workflow_instances: the snapshot row of each instance."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import db

T = db.T

# The ended statuses (FAILED is not ended: it can be retried). The one list;
# SQL uses ENDED_SQL.
ENDED = ("COMPLETED", "COMPENSATED", "CANCELLED", "EXPIRED")
ENDED_SQL = "(" + ", ".join(f"'{status}'" for status in ENDED) + ")"

# A start's three writes in one statement: its dedup key, then (only when the
# key was new) the PENDING instance, its queue row and its START command. The
# key goes first, so a concurrent start with the same key waits on it and
# resolves as a replay, never as a business-key conflict. Returns the START
# command's id; no row when another transaction committed the key first.
# The command's recorded_at (the clock, as every command's) is read in the queue
# row's RETURNING: a volatile call in the outer SELECT list kept PostgreSQL from
# pulling that SELECT up into the insert, and the extra subquery scan it then set
# up on every execution cost about 16,000 backend instructions a start (callgrind).
RECORD_START = f"""
WITH claimed AS (
    INSERT INTO {T["dedup"]} (kind, scope_key, dedup_namespace, key, workflow_id, fingerprint,
                              result_json)
    VALUES ('START', %(scope)s, %(definition)s, %(key)s, %(wf)s, %(fingerprint)s,
            %(result)s::jsonb)
    ON CONFLICT (kind, scope_key, dedup_namespace, key) DO NOTHING
    RETURNING workflow_id
), inst AS (
    INSERT INTO {T["instances"]} (id, definition_id, definition_version, plan_hash, status,
        business_key, subject_json, metadata, scope_key, definition_scope_key)
    SELECT %(wf)s, %(definition)s, %(version)s, %(plan_hash)s, 'PENDING', %(business_key)s,
           %(subject)s::jsonb, %(metadata)s::jsonb, %(scope)s, %(definition_scope)s
    FROM claimed
    RETURNING id
), queue AS (
    INSERT INTO {T["command_queues"]} (workflow_id, next_seq) SELECT id, 2 FROM inst
    RETURNING workflow_id, clock_timestamp() AS recorded_at
)
INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, payload_json, dedup_key,
    target_json, context_json, actor_kind, actor_id, actor_reason, on_behalf_of,
    attribution_status, recorded_at, available_at)
SELECT queue.workflow_id, 1, 'START', 'PENDING', %(payload)s::jsonb, %(key)s, %(subject)s::jsonb,
       %(context)s::jsonb, %(actor_kind)s, %(actor_id)s, %(actor_reason)s, %(on_behalf_of)s,
       %(attribution_status)s, queue.recorded_at, now()
FROM queue
RETURNING id
"""

# The columns of an InstanceRow, in its order (row_from_values)
COLUMNS = (
    "id, definition_id, definition_version, plan_hash, status, current_step_id, state_json, "
    "business_key, subject_json, metadata, version, error_type, error_message, created_at, "
    "updated_at, completed_at, archived_at, scope_key, definition_scope_key, baseline_logged"
)
COLUMN_COUNT = len(COLUMNS.split(", "))


def columns_of(alias: str) -> str:
    """``COLUMNS`` qualified by a table alias, for a statement that joins the instance."""
    return ", ".join(f"{alias}.{name}" for name in COLUMNS.split(", "))


SELECT = f"""
SELECT {COLUMNS}
FROM {T["instances"]} WHERE id = %s
"""

# The children a parent's ``call`` steps started: named by the parent's
# CHILD_STARTED history entries (the parent's history index, no instance scan).
CHILDREN = (
    SELECT.replace(
        "WHERE id = %s",
        f"""WHERE id IN (SELECT (h.payload_json ->> 'childId')::uuid FROM {T["history"]} h
                  WHERE h.workflow_id = %s AND h.event_type = 'CHILD_STARTED')""",
    )
    + " ORDER BY created_at, id"
)

# FAILED at the step that failed (kept when unknown), with the start payload as
# the state of an instance that never ran; returns where it stood before, which
# is where a retry resumes it.
MARK_FAILED = f"""
WITH old AS (
    SELECT id, status, current_step_id FROM {T["instances"]} WHERE id = %(wf)s FOR UPDATE
)
UPDATE {T["instances"]} i
SET status = 'FAILED', error_type = %(code)s, error_message = %(message)s, completed_at = now(),
    updated_at = now(), version = i.version + 1,
    current_step_id = COALESCE(%(step)s, i.current_step_id),
    state_json = COALESCE(i.state_json, %(state)s::jsonb)
FROM old
WHERE i.id = old.id AND old.status NOT IN {ENDED_SQL} AND old.status <> 'FAILED'
RETURNING old.status, old.current_step_id
"""

MARK_CANCELLED = f"""
UPDATE {T["instances"]}
SET status = 'CANCELLED', error_type = 'CANCELLED', error_message = %s, completed_at = now(),
    updated_at = now(), version = version + 1
WHERE id = %s AND status NOT IN {ENDED_SQL}
RETURNING version
"""


# Instances a retry could repair: FAILED and/or holding dead letters, by id
# (keyset pages of ``workflow_retry``).
RETRY_CANDIDATES = f"""
SELECT i.id, i.definition_id, i.definition_version, i.status,
       (SELECT count(*) FROM {T["commands"]} c WHERE c.workflow_id = i.id AND c.state = 'DEAD')
FROM {T["instances"]} i
WHERE i.id > %(after)s
  AND (%(definition)s::text IS NULL OR i.definition_id = %(definition)s)
  AND ((%(failed)s AND i.status = 'FAILED')
       OR (%(dead)s AND EXISTS (SELECT 1 FROM {T["commands"]} c
                                WHERE c.workflow_id = i.id AND c.state = 'DEAD')))
ORDER BY i.id
LIMIT %(limit)s
"""

_JSON_COLUMNS = (6, 8, 9)  # state_json, subject_json, metadata


@dataclass(frozen=True)
class InstanceRow:
    id: Any
    definition_id: str
    definition_version: int
    plan_hash: str
    status: str
    current_step_id: str | None
    state_json: Any
    business_key: str | None
    subject_json: Any
    metadata: Any
    version: int
    error_type: str | None
    error_message: str | None
    created_at: Any
    updated_at: Any
    completed_at: Any
    archived_at: Any
    scope_key: str
    definition_scope_key: str
    baseline_logged: bool

    @property
    def ended(self) -> bool:
        return self.status in ENDED


def record_prepared_start(params: dict[str, Any]) -> bool:
    """Claim the start key and write the instance and its START command; False: a replay.

    ``params`` are :func:`record_start_params`'. The caller holds the pin's
    admission (the shared id lock). A business key already used raises the
    unique violation (23505) and writes nothing.
    """
    return db.fetchone_prepared(RECORD_START, params) is not None


def record_start_params(
    instance_id: Any,
    *,
    scope_key: str,
    definition_id: str,
    idempotency_key: str,
    fingerprint: str,
    definition_version: int,
    plan_hash: str,
    definition_scope_key: str,
    business_key: str | None,
    subject: Any,
    metadata: Any,
    payload: Any,
    context: Any,
    actor: Any,
) -> dict[str, Any]:
    """The parameters of ``RECORD_START`` (JSON values dumped) for one start."""
    return {
        "wf": instance_id,
        "scope": scope_key,
        "definition": definition_id,
        "key": idempotency_key,
        "fingerprint": fingerprint,
        "result": json.dumps({"instanceId": str(instance_id)}),
        "version": definition_version,
        "plan_hash": plan_hash,
        "definition_scope": definition_scope_key,
        "business_key": business_key,
        "subject": None if subject is None else json.dumps(subject),
        "metadata": json.dumps(metadata or {}),
        "payload": json.dumps(payload),
        "context": None if context is None else json.dumps(context),
        "actor_kind": actor.kind,
        "actor_id": actor.id,
        "actor_reason": actor.reason,
        "on_behalf_of": actor.on_behalf_of,
        "attribution_status": actor.status,
    }


def get(instance_id: Any) -> InstanceRow | None:
    row = db.fetchone_prepared(SELECT, (instance_id,))
    return None if row is None else row_from_values(row)


def children(parent_id: Any) -> list[InstanceRow]:
    """The instances started by ``call`` steps of ``parent_id``, oldest first."""
    return [row_from_values(r) for r in db.fetchall(CHILDREN, (parent_id,))]


def row_from_values(row: Sequence[Any]) -> InstanceRow:
    """An InstanceRow from the columns of SELECT, in its order (jsonb decoded)."""
    values = list(row)
    for index in _JSON_COLUMNS:
        values[index] = db.load_json(values[index])
    return InstanceRow(*values)


def mark_failed(
    instance_id: Any,
    error_type: str,
    message: str,
    *,
    step: str | None = None,
    state_if_none: Any = None,
) -> tuple[str, str | None] | None:
    """FAILED (unless ended or failed); returns the (status, step) it had, None: unchanged."""
    row = db.fetchone(
        MARK_FAILED,
        {
            "wf": instance_id,
            "code": error_type,
            "message": message,
            "step": step,
            "state": None if state_if_none is None else json.dumps(state_if_none),
        },
    )
    return None if row is None else (row[0], row[1])


def mark_cancelled(instance_id: Any, message: str) -> bool:
    return db.fetchone(MARK_CANCELLED, (message, instance_id)) is not None


def retry_candidates(
    *, definition_id: str | None, failed: bool, dead: bool, after: Any, limit: int
) -> list[tuple[Any, str, int, str, int]]:
    """(id, definition id, version, status, dead count) of repairable instances after ``after``."""
    rows = db.fetchall(
        RETRY_CANDIDATES,
        {
            "definition": definition_id,
            "failed": failed,
            "dead": dead,
            "after": after,
            "limit": limit,
        },
    )
    return [(r[0], r[1], r[2], r[3], int(r[4])) for r in rows]
