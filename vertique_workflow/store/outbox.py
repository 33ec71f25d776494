"""workflow_service_outbox: the dispatches of ``service`` steps, recorded and relayed.

The segment inserts a transition's dispatches in one statement (the outbox
recorder); a relay claims due rows with ``FOR UPDATE SKIP LOCKED`` (so relays
on many nodes never take the same row), calls the handler with no
transaction open, and settles the row with a statement fenced by its claim
token: a relay whose lease expired (and whose row another relay took)
settles nothing. A CLAIMED row whose lease passed is claimable again -- the
relay that held it crashed or hung -- which is what makes the call *at least
once*. Rows of an instance that has ended are cancelled by the claim that
meets them, never called.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import db
from .instances import ENDED_SQL

T = db.T

INSERT_CALLS = f"""
INSERT INTO {T["service_outbox"]} (workflow_id, command_id, step_id, branch_token_id,
    fork_step_id, branch_id, dispatch_key, handler, request_json, policy_json, context_json)
SELECT r.workflow_id, r.command_id, r.step_id, r.branch_token_id, r.fork_step_id, r.branch_id,
       r.dispatch_key, r.handler, r.request, COALESCE(r.policy, '{{}}'::jsonb), r.context
FROM jsonb_to_recordset(%s::jsonb) AS r(workflow_id uuid, command_id bigint, step_id text,
    branch_token_id uuid, fork_step_id text, branch_id text, dispatch_key text, handler text,
    request jsonb, policy jsonb, context jsonb)
ON CONFLICT (workflow_id, dispatch_key) DO NOTHING
"""

# Due rows: PENDING whose backoff has passed, or CLAIMED whose lease has
# (its relay is gone). The lease covers the handler's timeout and a margin.
CLAIM = f"""
WITH due AS (
    SELECT o.id, (i.id IS NULL OR i.status IN {ENDED_SQL}) AS gone
    FROM {T["service_outbox"]} o
    LEFT JOIN {T["instances"]} i ON i.id = o.workflow_id
    WHERE (o.state = 'PENDING' AND o.available_at <= now())
       OR (o.state = 'CLAIMED' AND o.lease_until <= now())
    ORDER BY o.available_at, o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {T["service_outbox"]} o
SET state = CASE WHEN due.gone THEN 'CANCELLED' ELSE 'CLAIMED' END,
    claim_token = CASE WHEN due.gone THEN NULL ELSE %(token)s::uuid END,
    claimed_by = %(node)s,
    attempts = o.attempts + CASE WHEN due.gone THEN 0 ELSE 1 END,
    lease_until = CASE WHEN due.gone THEN NULL ELSE now() + make_interval(
        secs => COALESCE((o.policy_json->>'timeoutMs')::float8, 30000) / 1000.0
                + %(margin)s) END,
    last_error = CASE WHEN due.gone THEN 'INSTANCE_ENDED: the instance ended before the call'
                      ELSE o.last_error END,
    updated_at = now()
FROM due
WHERE o.id = due.id
RETURNING o.id, o.state, o.workflow_id, o.step_id, o.branch_token_id, o.fork_step_id,
          o.branch_id, o.dispatch_key, o.handler, o.request_json, o.policy_json,
          o.context_json, o.attempts, o.claim_token
"""

DELIVERED = f"""
UPDATE {T["service_outbox"]}
SET state = %(state)s, outcome = %(outcome)s, last_error = %(error)s, lease_until = NULL,
    delivered_at = now(), updated_at = now()
WHERE id = %(id)s AND claim_token = %(token)s::uuid AND state = 'CLAIMED'
RETURNING id
"""

RETRY_LATER = f"""
UPDATE {T["service_outbox"]}
SET state = 'PENDING', claim_token = NULL, lease_until = NULL, last_error = %(error)s,
    available_at = now() + make_interval(secs => %(delay_ms)s / 1000.0), updated_at = now()
WHERE id = %(id)s AND claim_token = %(token)s::uuid AND state = 'CLAIMED'
RETURNING id
"""

FOR_INSTANCE = f"""
SELECT id, workflow_id, command_id, step_id, branch_token_id, fork_step_id, branch_id,
       dispatch_key, handler, request_json, policy_json, state, attempts, claimed_by,
       lease_until, available_at, last_error, outcome, created_at, updated_at, delivered_at
FROM {T["service_outbox"]}
WHERE workflow_id = %s
ORDER BY id
"""

DELAYS = f"""
SELECT EXTRACT(EPOCH FROM (MIN(CASE WHEN state = 'PENDING' THEN available_at
                                   ELSE lease_until END) - now())) * 1000
FROM {T["service_outbox"]}
WHERE state IN ('PENDING', 'CLAIMED')
"""


@dataclass(frozen=True)
class ClaimedCall:
    """A dispatch a relay holds: what to call, with which key, under which claim."""

    id: int
    workflow_id: Any
    step_id: str
    branch_token_id: Any
    fork_step_id: str | None
    branch_id: str | None
    dispatch_key: str
    handler: str
    request: Any
    policy: dict[str, Any]
    context: Any
    attempts: int
    claim_token: Any


def insert_calls(rows: Sequence[dict[str, Any]]) -> int:
    """Insert dispatches (one statement for the batch); a key already present is kept."""
    if not rows:
        return 0
    return db.execute(INSERT_CALLS, (json.dumps(list(rows), default=str),))


def claim(limit: int, token: Any, node: str, lease_margin_seconds: float) -> list[ClaimedCall]:
    """Claim up to ``limit`` due dispatches (autocommit: the claim commits at once)."""
    rows = db.fetchall(
        CLAIM,
        {"limit": limit, "token": str(token), "node": node[:255], "margin": lease_margin_seconds},
    )
    return [
        ClaimedCall(
            row[0],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6],
            row[7],
            row[8],
            db.load_json(row[9]),
            db.load_json(row[10]) or {},
            db.load_json(row[11]),
            row[12],
            row[13],
        )
        for row in rows
        if row[1] == "CLAIMED"
    ]


def settle(call: ClaimedCall, *, state: str, outcome: str | None, error: str | None) -> bool:
    """Settle a held dispatch (DELIVERED or CANCELLED); False when the claim was lost."""
    row = db.fetchone(
        DELIVERED,
        {
            "state": state,
            "outcome": outcome,
            "error": error,
            "id": call.id,
            "token": str(call.claim_token),
        },
    )
    return row is not None


def retry_later(call: ClaimedCall, delay_ms: int, error: str) -> bool:
    """Give a held dispatch back for another attempt after ``delay_ms``; False: claim lost."""
    row = db.fetchone(
        RETRY_LATER,
        {"error": error, "delay_ms": delay_ms, "id": call.id, "token": str(call.claim_token)},
    )
    return row is not None


def for_instance(workflow_id: Any) -> list[dict[str, Any]]:
    """Every dispatch of an instance, oldest first (admin, tools, tests)."""
    rows = db.fetchdicts(FOR_INSTANCE, (workflow_id,))
    for row in rows:
        row["request_json"] = db.load_json(row["request_json"])
        row["policy_json"] = db.load_json(row["policy_json"])
    return rows


def next_delay_ms() -> float | None:
    """Milliseconds until the next dispatch is due (0: now), or None when none waits."""
    row = db.fetchone(DELAYS)
    return None if row is None or row[0] is None else max(0.0, float(row[0]))
