"""workflow_events: the events recorder's outbox, and its consumers' positions.

A transition's events are inserted in one statement (``insert``); each row
takes its transaction's id (``txid``, the column default). A consumer reads
in ``(txid, id)`` order after its acknowledged position and only below the
oldest transaction still running (``pg_snapshot_xmin``): an event whose
transaction commits late has a smaller ``id`` than events committed before
it, but its ``txid`` is at or above that horizon until it commits, so it is
never skipped. An acknowledgement moves the position forward only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import db

T = db.T

INSERT = f"""
INSERT INTO {T["events"]} (workflow_id, event_type, step_id, fork_step_id, branch_id,
    command_id, definition_id, definition_version, data_json)
SELECT r.workflow_id, r.event_type, r.step_id, r.fork_step_id, r.branch_id, r.command_id,
       r.definition_id, r.definition_version, COALESCE(r.data, '{{}}'::jsonb)
FROM ROWS FROM (jsonb_to_recordset(%s::jsonb) AS (workflow_id uuid, event_type text,
    step_id text, fork_step_id text, branch_id text, command_id bigint, definition_id text,
    definition_version int, data jsonb)) WITH ORDINALITY
    AS r(workflow_id, event_type, step_id, fork_step_id, branch_id, command_id, definition_id,
         definition_version, data, n)
ORDER BY r.n
RETURNING id, txid, recorded_at
"""

READ = f"""
SELECT e.id, e.txid, e.workflow_id, e.event_type, e.step_id, e.fork_step_id, e.branch_id,
       e.command_id, e.definition_id, e.definition_version, e.data_json, e.recorded_at
FROM {T["events"]} e
LEFT JOIN {T["event_consumers"]} c ON c.consumer = %(consumer)s
WHERE (e.txid, e.id) > (COALESCE(c.last_txid, 0), COALESCE(c.last_id, 0))
  AND e.txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
ORDER BY e.txid, e.id
LIMIT %(limit)s
"""

# GREATEST on the row pair: an acknowledgement never moves the position back.
ACK = f"""
INSERT INTO {T["event_consumers"]} AS c (consumer, last_txid, last_id, updated_at)
VALUES (%(consumer)s, %(txid)s, %(id)s, now())
ON CONFLICT (consumer) DO UPDATE
SET last_txid = EXCLUDED.last_txid, last_id = EXCLUDED.last_id, updated_at = now()
WHERE (EXCLUDED.last_txid, EXCLUDED.last_id) > (c.last_txid, c.last_id)
"""

POSITION = f"SELECT last_txid, last_id FROM {T['event_consumers']} WHERE consumer = %s"


def insert(rows: Sequence[dict[str, Any]]) -> list[tuple[int, int, Any]]:
    """Insert a transition's events in one statement; (id, txid, recorded_at) in order."""
    if not rows:
        return []
    # ids are drawn in the ORDER BY's order: sorted by id, the rows are in the batch's order
    inserted = sorted(db.fetchall(INSERT, [json.dumps(list(rows))]), key=lambda r: r[0])
    return [(r[0], r[1], r[2]) for r in inserted]


def read(consumer: str, limit: int) -> list[dict[str, Any]]:
    """The committed events after ``consumer``'s position, in ``(txid, id)`` order."""
    rows = db.fetchdicts(READ, {"consumer": consumer, "limit": limit})
    for row in rows:
        row["data_json"] = db.load_json(row["data_json"])
    return rows


def ack(consumer: str, txid: int, event_id: int) -> bool:
    """Move ``consumer``'s position to ``(txid, event_id)``; False when it was not ahead."""
    return db.execute(ACK, {"consumer": consumer, "txid": txid, "id": event_id}) > 0


def position(consumer: str) -> tuple[int, int] | None:
    """``consumer``'s acknowledged ``(txid, id)``, or None before its first ack."""
    row = db.fetchone(POSITION, [consumer])
    return None if row is None else (int(row[0]), int(row[1]))
