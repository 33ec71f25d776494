"""Reads of the execution probe: plain reads, no locks, the database clock.

The reads run on a connection of their own in autocommit (never in the
caller's open transaction, so they see committed state only and ``now()`` is
the clock at each statement). ``on_caller_connection=True`` is the test
helper's path: ``run_until_idle()`` in a plain ``django_db`` test must see the
test's own uncommitted rows, so it reads on the caller's connection instead.
"""

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


def _fetch(sql: str, params: Any, on_caller_connection: bool, dicts: bool) -> Any:
    context = db.cursor() if on_caller_connection else db.separate_cursor()
    with context as cur:
        cur.execute(sql, params)
        if not dicts:
            return cur.fetchone()
        names = [col.name for col in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def idle(workflow_id: Any = None, *, on_caller_connection: bool = False) -> tuple[bool, Any]:
    row = _fetch(IDLE, {"wf": workflow_id}, on_caller_connection, dicts=False)
    assert row is not None
    return bool(row[0]), row[1]


def lists(
    workflow_id: Any, stuck_after_seconds: float, *, on_caller_connection: bool = False
) -> dict[str, list[dict[str, Any]]]:
    params = {"wf": workflow_id, "stuck": stuck_after_seconds}
    if on_caller_connection:
        return {name: _fetch(sql, params, True, dicts=True) for name, sql in QUERIES.items()}
    # one connection for the six lists (each list is still its own statement)
    with db.separate_cursor() as cur:
        result = {}
        for name, sql in QUERIES.items():
            cur.execute(sql, params)
            names = [col.name for col in cur.description]
            result[name] = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        return result
