"""workflow_join_states: the fan-in progress of one join (the reference's PgJoinStateRepository).

A row is keyed by (workflow_id, join key): the join step id at top level,
``"<join step>@<parent branch token id>"`` for a join inside a branch
(``branches.scoped_key``). ``arrived_json`` lists the branches that reached
the join, in arrival order, as ``{"branchId", "tokenId", "status"}`` with
status COMPLETED or FAILED (a FAILED one with its ``error`` text); the
branches' states stay on their tokens and are never copied here.
``decided`` turns true once, guarded by ``decided = false``; a guarded
change that finds no row raises :class:`JoinConflict` (SQLSTATE 40001), so
the segment rolls back.

Statements run in the caller's transaction, under the execution lock; the
table has no foreign key to workflow_instances.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from . import db

T = db.T

ARRIVAL_STATUSES = ("COMPLETED", "FAILED")


class JoinConflict(DatabaseError):
    """A guarded join change found no row in the expected state: a transient conflict."""

    sqlstate = "40001"


@dataclass(frozen=True)
class JoinRow:
    workflow_id: uuid.UUID
    join_key: str
    fork_key: str
    expected: int
    arrived: list[dict[str, Any]]
    decided: bool
    created_at: datetime.datetime | None = None
    updated_at: datetime.datetime | None = None


_COLUMNS = """workflow_id, join_step_id, fork_step_id, expected, arrived_json, decided,
    created_at, updated_at"""

# A loop that enters the fork again opens a new join over the same key.
OPEN = f"""
INSERT INTO {T["join_states"]} AS j (workflow_id, join_step_id, fork_step_id, expected,
    arrived_json, decided, created_at, updated_at)
VALUES (%(wf)s, %(join)s, %(fork)s, %(expected)s, '[]'::jsonb, FALSE, now(), now())
ON CONFLICT (workflow_id, join_step_id) DO UPDATE
SET fork_step_id = EXCLUDED.fork_step_id, expected = EXCLUDED.expected,
    arrived_json = '[]'::jsonb, decided = FALSE, created_at = now(), updated_at = now()
"""

SELECT = f"SELECT {_COLUMNS} FROM {T['join_states']} WHERE workflow_id = %s AND join_step_id = %s"
SELECT_FOR_UPDATE = SELECT + " FOR UPDATE"

FOR_INSTANCE = f"""
SELECT {_COLUMNS} FROM {T["join_states"]} WHERE workflow_id = %s
ORDER BY created_at, join_step_id
"""

# Appends in the given order; a token already in the list is not appended
# again (an arrival is one fact per token, counted once).
ARRIVE = f"""
UPDATE {T["join_states"]} j
SET arrived_json = j.arrived_json || COALESCE((
        SELECT jsonb_agg(a.value ORDER BY a.ord)
        FROM jsonb_array_elements(%(arrivals)s::jsonb) WITH ORDINALITY AS a(value, ord)
        WHERE NOT j.arrived_json @> jsonb_build_array(
            jsonb_build_object('tokenId', a.value -> 'tokenId'))), '[]'::jsonb),
    updated_at = now()
WHERE j.workflow_id = %(wf)s AND j.join_step_id = %(join)s
RETURNING {_COLUMNS}
"""

# A branch retried after it failed: its arrival is taken back, so it counts
# again when it arrives anew. Only an undecided join changes.
WITHDRAW = f"""
UPDATE {T["join_states"]} j
SET arrived_json = COALESCE((
        SELECT jsonb_agg(a.value ORDER BY a.ord)
        FROM jsonb_array_elements(j.arrived_json) WITH ORDINALITY AS a(value, ord)
        WHERE a.value ->> 'tokenId' <> %(token)s), '[]'::jsonb),
    updated_at = now()
WHERE j.workflow_id = %(wf)s AND j.join_step_id = %(join)s AND j.decided = FALSE
"""

DECIDE = f"""
UPDATE {T["join_states"]} SET decided = TRUE, updated_at = now()
WHERE workflow_id = %s AND join_step_id = %s AND decided = FALSE
"""


def _row(values: Sequence[Any]) -> JoinRow:
    v = list(values)
    return JoinRow(
        workflow_id=v[0],
        join_key=v[1],
        fork_key=v[2],
        expected=int(v[3]),
        arrived=list(db.load_json(v[4]) or []),
        decided=bool(v[5]),
        created_at=v[6],
        updated_at=v[7],
    )


def _arrival(value: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("status") not in ARRIVAL_STATUSES:
        raise ValueError("an arrival is {branchId, tokenId, status: COMPLETED or FAILED}")
    if not value.get("branchId") or not value.get("tokenId"):
        raise ValueError("an arrival names its branchId and tokenId")
    arrival = {
        "branchId": str(value["branchId"]),
        "tokenId": str(uuid.UUID(str(value["tokenId"]))),
        "status": value["status"],
    }
    if value.get("error"):  # why a branch failed: a stored failure text, bounded
        arrival["error"] = str(value["error"])[:255]
    return arrival


def open(workflow_id: Any, join_key: str, fork_key: str, expected: int) -> None:
    """Open the join of a fork: insert, or reset the row of that key (arrived [], undecided)."""
    if int(expected) < 0:
        raise ValueError("a join expects zero or more branches")
    db.execute(
        OPEN, {"wf": workflow_id, "join": join_key, "fork": fork_key, "expected": int(expected)}
    )


def get(workflow_id: Any, join_key: str, *, lock: bool = False) -> JoinRow | None:
    """The join's row; ``lock``: FOR UPDATE (after the branch tokens in the lock order)."""
    row = db.fetchone(SELECT_FOR_UPDATE if lock else SELECT, (workflow_id, join_key))
    return None if row is None else _row(row)


def arrive(workflow_id: Any, join_key: str, arrivals: Sequence[dict[str, Any]]) -> JoinRow:
    """Append arrivals in one statement and return the row after it.

    Raises :class:`JoinConflict` when the join has no row (it was never
    opened). A token that already arrived is not appended twice. Whether the
    join is decided is the caller's to read from the row it gets back.
    """
    rows = [_arrival(a) for a in arrivals]
    if len({r["tokenId"] for r in rows}) != len(rows):
        raise ValueError("a token arrives twice in one call")
    row = db.fetchone(ARRIVE, {"wf": workflow_id, "join": join_key, "arrivals": json.dumps(rows)})
    if row is None:
        raise JoinConflict("the join has no state row")
    return _row(row)


def withdraw(workflow_id: Any, join_key: str, token_id: Any) -> None:
    """Take a retried branch's arrival back; :class:`JoinConflict` when the join decided."""
    changed = db.execute(
        WITHDRAW, {"wf": workflow_id, "join": join_key, "token": str(uuid.UUID(str(token_id)))}
    )
    if changed != 1:
        raise JoinConflict("the join has decided already")


def decide(workflow_id: Any, join_key: str) -> None:
    """Mark the join decided; :class:`JoinConflict` when it was decided already (or is missing)."""
    if db.execute(DECIDE, (workflow_id, join_key)) != 1:
        raise JoinConflict("the join has decided already")


def for_instance(workflow_id: Any) -> list[JoinRow]:
    """The instance's joins, oldest opened first."""
    return [_row(r) for r in db.fetchall(FOR_INSTANCE, (workflow_id,))]
