"""Reads of the execution probe: plain reads, no locks, the database clock."""

from __future__ import annotations

from typing import Any

from . import db
from .eligibility import claimable

T = db.T
LIMIT = 1000

_COLUMNS = """c.id, c.workflow_id, c.seq, c.kind, c.state, c.attempts, c.available_at,
    c.lease_until, left(c.last_error, 4000) AS last_error"""
_FOR_INSTANCE = "(%(wf)s::uuid IS NULL OR c.workflow_id = %(wf)s::uuid)"

IDLE = f"""
SELECT
  NOT EXISTS (SELECT 1 FROM {T["commands"]} c
              WHERE c.state = 'CLAIMED' AND c.lease_until >= now() AND {_FOR_INSTANCE})
  AND NOT EXISTS (SELECT 1 FROM {T["commands"]} c WHERE {_FOR_INSTANCE} AND {claimable("c")}),
  now()
"""

LISTS = {
    "in_flight": "c.state = 'CLAIMED' AND c.lease_until >= now()",
    "claimable": claimable("c"),
    "deferred": f"c.state = 'DEFERRED' AND NOT {claimable('c')}",
    "parked": "c.state = 'PARKED'",
    "waiting": f"""c.state IN ('PENDING', 'CLAIMED') AND NOT {claimable("c")}
                   AND NOT (c.state = 'CLAIMED' AND c.lease_until >= now())""",
    "stuck": """c.state = 'DEAD' OR (c.state IN ('PENDING', 'DEFERRED', 'CLAIMED', 'PARKED')
                AND CASE WHEN c.kind = 'TIMER' THEN c.fire_at ELSE c.recorded_at END
                    < now() - make_interval(secs => %(stuck)s))""",
}

QUERIES = {
    name: f"""SELECT {_COLUMNS} FROM {T["commands"]} c
              WHERE {_FOR_INSTANCE} AND ({condition})
              ORDER BY c.workflow_id, c.seq LIMIT {LIMIT}"""
    for name, condition in LISTS.items()
}


def idle(workflow_id: Any = None) -> tuple[bool, Any]:
    row = db.fetchone(IDLE, {"wf": workflow_id})
    assert row is not None
    return bool(row[0]), row[1]


def lists(workflow_id: Any, stuck_after_seconds: float) -> dict[str, list[dict[str, Any]]]:
    params = {"wf": workflow_id, "stuck": stuck_after_seconds}
    return {name: db.fetchdicts(sql, params) for name, sql in QUERIES.items()}
