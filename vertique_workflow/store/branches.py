"""workflow_branch_tokens: one token per branch of a fork (the reference's PgBranchTokenRepository).

A token's ``state_json`` is ``{"state": <the branch's own state>, "item":
<the fan-out item or null>}``; ``metadata`` is the durable context captured at
the fork (``{"context": {...}}`` or ``{}``), written by :func:`create` and by
no other statement (the reference's metadata immutability: demotion and
terminal failure keep it).

Statuses: RUNNING, WAITING (live) -> COMPLETED, FAILED or SUPERSEDED (ended);
RETRY_SCHEDULED is only read (written before migration 0003, which converts
it) and counts as live. Every change is guarded by "the token is live"; a
guarded change that finds fewer rows than it was given raises
:class:`BranchConflict` (SQLSTATE 40001), so the segment rolls back instead
of moving a branch out of a state it was not in.

Statements run in the caller's transaction, under the execution lock. The
lock order is the reference's: timers, tasks, branch tokens, instances,
queues, so a caller superseding branches cancels their timers
(``timers.cancel_scheduled(branch_token_ids=...)``) and tasks
(``tasks.cancel_open(branch_token_ids=...)``) before :func:`supersede`.
The table has no foreign key to workflow_instances, by design (one would
invert that order).

Nested forks: a fork inside a branch keys its tokens ``"<fork step>@<parent
token id>"`` (:func:`scoped_key`); a top-level fork uses the plain step id.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from ..engine import tokens
from ..engine.tokens import scoped_key as scoped_key  # the one rule of fork and join keys
from . import db

T = db.T

LIVE_STATUSES = ("RUNNING", "WAITING", "RETRY_SCHEDULED")
ENDED_STATUSES = ("COMPLETED", "FAILED", "SUPERSEDED")
WRITABLE_STATUSES = ("RUNNING", "WAITING", "COMPLETED", "FAILED")
# a branch a join superseded in the very drive that forked it is created superseded;
# an existing token is superseded only by supersede()
CREATABLE_STATUSES = (*WRITABLE_STATUSES, "SUPERSEDED")
SCOPE_SEPARATOR = "@"


class BranchConflict(DatabaseError):
    """A guarded branch update found a token that is not live: retried as a transient conflict."""

    sqlstate = "40001"


def split_key(key: str) -> tuple[str, uuid.UUID | None]:
    """:func:`engine.tokens.split_key` with the parent token id as a UUID."""
    step_id, parent = tokens.split_key(key)
    return step_id, None if parent is None else uuid.UUID(parent)


@dataclass(frozen=True)
class NewBranch:
    """A token to create at a fork; ``state`` and ``item`` are JSON values."""

    token_id: uuid.UUID
    fork_step_id: str
    branch_id: str
    status: str
    current_step_id: str | None
    state: Any
    item: Any = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class BranchChange:
    """What a drive changes on a live token: its status, step and own state (item kept)."""

    token_id: uuid.UUID
    status: str
    current_step_id: str | None
    state: Any
    # a FAILED token run again by a branch retry (wf.retry(branch=...)): the
    # one change a token that is no longer live may take
    retried: bool = False


@dataclass(frozen=True)
class BranchRow:
    """A token row, ``state`` and ``item`` unpacked from ``state_json``."""

    id: uuid.UUID
    workflow_id: uuid.UUID
    fork_step_id: str
    branch_id: str
    status: str
    current_step_id: str | None
    state: Any
    item: Any
    retry_at: datetime.datetime | None
    attempts: int
    metadata: Any
    created_at: datetime.datetime
    updated_at: datetime.datetime

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def parent_token_id(self) -> uuid.UUID | None:
        """The branch whose nested fork created this token (None at top level)."""
        return split_key(self.fork_step_id)[1]


_COLUMNS = """id, workflow_id, fork_step_id, branch_id, status, current_step_id, state_json,
    retry_at, attempts, metadata, created_at, updated_at"""

# One statement for the whole fork. created_at is one clock sample plus a
# microsecond per position, so "ORDER BY created_at" is the fork's order
# (a fan-out keeps its item order) without a column of its own.
CREATE = f"""
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS t)
INSERT INTO {T["branch_tokens"]} (id, workflow_id, fork_step_id, branch_id, status,
    current_step_id, state_json, attempts, metadata, created_at, updated_at)
SELECT n.token_id, %(wf)s, n.fork_step_id, n.branch_id, n.status, n.current_step_id,
       jsonb_build_object('state', COALESCE(n.state, 'null'::jsonb),
                          'item', COALESCE(n.item, 'null'::jsonb)),
       0, COALESCE(n.metadata, '{{}}'::jsonb),
       clock.t + make_interval(secs => n.ord / 1000000.0),
       clock.t + make_interval(secs => n.ord / 1000000.0)
FROM jsonb_to_recordset(%(rows)s::jsonb) AS n(
        ord int, token_id uuid, fork_step_id text, branch_id text, status text,
        current_step_id text, state jsonb, item jsonb, metadata jsonb), clock
ORDER BY n.ord
"""

FOR_INSTANCE = f"""
SELECT {_COLUMNS} FROM {T["branch_tokens"]}
WHERE workflow_id = %(wf)s AND (NOT %(live)s OR status IN {LIVE_STATUSES!r})
  AND (%(fork)s::text IS NULL OR fork_step_id = %(fork)s::text)
ORDER BY fork_step_id, created_at, id
"""

# The tokens one event is for -- by token id, or by branch id within a fork
# step (its plain key, or "<step>@<parent token id>" for a nested fork) --
# and the tokens of the branches enclosing them (a nested fork's key names
# its parent), so a branch's segment reads a few rows, not every branch.
ADDRESSED = f"""
WITH RECURSIVE hit AS (
    SELECT b.* FROM {T["branch_tokens"]} b
    WHERE b.workflow_id = %(wf)s
      AND (b.id = %(token)s::uuid
           OR (b.branch_id = %(branch)s::text
               AND (b.fork_step_id = %(fork)s::text
                    OR (length(b.fork_step_id) = length(%(fork)s::text) + 37
                        AND left(b.fork_step_id, length(%(fork)s::text) + 1)
                            = %(fork)s::text || '@'))))
    UNION
    SELECT p.* FROM {T["branch_tokens"]} p JOIN hit
      ON p.id = CASE WHEN hit.fork_step_id ~ '@[0-9a-f-]{{36}}$'
                     THEN right(hit.fork_step_id, 36)::uuid END
    WHERE p.workflow_id = %(wf)s
)
SELECT {_COLUMNS} FROM hit ORDER BY fork_step_id, created_at, id
"""

SELECT = f"SELECT {_COLUMNS} FROM {T['branch_tokens']} WHERE id = %s"
SELECT_FOR_UPDATE = SELECT + " FOR UPDATE"

# One statement for the list; each row guarded by "live" (or FAILED and retried). The item is kept,
# metadata is not named (never updated). Rows locked in ascending id.
UPDATE = f"""
WITH changes AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS c(
        token_id uuid, status text, current_step_id text, state jsonb, retried boolean)
), target AS (
    SELECT b.id FROM {T["branch_tokens"]} b JOIN changes ON changes.token_id = b.id
    WHERE b.workflow_id = %(wf)s
      AND (b.status IN {LIVE_STATUSES!r} OR (changes.retried AND b.status = 'FAILED'))
    ORDER BY b.id FOR UPDATE OF b
)
UPDATE {T["branch_tokens"]} b
SET status = changes.status, current_step_id = changes.current_step_id,
    state_json = jsonb_build_object('state', COALESCE(changes.state, 'null'::jsonb),
                                    'item', COALESCE(b.state_json -> 'item', 'null'::jsonb)),
    updated_at = now()
FROM changes, target
WHERE b.id = target.id AND changes.token_id = b.id
"""

SUPERSEDE = f"""
WITH doomed AS (
    SELECT id FROM {T["branch_tokens"]}
    WHERE workflow_id = %(wf)s AND id = ANY(%(ids)s::uuid[]) AND status IN {LIVE_STATUSES!r}
    ORDER BY id FOR UPDATE
)
UPDATE {T["branch_tokens"]} b SET status = 'SUPERSEDED', updated_at = now()
FROM doomed WHERE b.id = doomed.id
RETURNING b.id
"""


def _row(values: Sequence[Any]) -> BranchRow:
    v = list(values)
    packed = db.load_json(v[6])
    packed = packed if isinstance(packed, dict) else {"state": packed, "item": None}
    return BranchRow(
        id=v[0],
        workflow_id=v[1],
        fork_step_id=v[2],
        branch_id=v[3],
        status=v[4],
        current_step_id=v[5],
        state=packed.get("state"),
        item=packed.get("item"),
        retry_at=v[7],
        attempts=v[8],
        metadata=db.load_json(v[9]),
        created_at=v[10],
        updated_at=v[11],
    )


def _check_status(status: str, allowed: tuple[str, ...] = WRITABLE_STATUSES) -> str:
    if status not in allowed:
        raise ValueError(f"a branch cannot be written as {status!r}")
    return status


def _distinct(token_ids: Sequence[Any]) -> list[str]:
    ids = [str(t) for t in token_ids]
    if len(set(ids)) != len(ids):
        raise ValueError("a token id is named twice")
    return ids


def create(workflow_id: Any, branches: Sequence[NewBranch]) -> None:
    """Insert the tokens of a fork in one statement, in the list's order.

    ``metadata`` is written here once and never again.
    """
    if not branches:
        return
    _distinct([b.token_id for b in branches])
    rows = [
        {
            "ord": index,
            "token_id": str(b.token_id),
            "fork_step_id": b.fork_step_id,
            "branch_id": b.branch_id,
            "status": _check_status(b.status, CREATABLE_STATUSES),
            "current_step_id": b.current_step_id,
            "state": b.state,
            "item": b.item,
            "metadata": b.metadata or {},
        }
        for index, b in enumerate(branches)
    ]
    inserted = db.execute(CREATE, {"wf": workflow_id, "rows": json.dumps(rows)})
    assert inserted == len(branches)


def for_instance(
    workflow_id: Any, *, live_only: bool = False, fork_key: str | None = None
) -> list[BranchRow]:
    """The instance's tokens (``live_only``: RUNNING, WAITING, RETRY_SCHEDULED).

    ``fork_key`` keeps the tokens of one fork (its scoped key). Ordered by
    fork key, then the order the fork created them.
    """
    params = {"wf": workflow_id, "live": live_only, "fork": fork_key}
    return [_row(r) for r in db.fetchall(FOR_INSTANCE, params)]


def addressed(
    workflow_id: Any,
    *,
    token_id: Any = None,
    fork_step_id: str | None = None,
    branch_id: str | None = None,
) -> list[BranchRow]:
    """The tokens an event addresses (by id, or by fork step and branch id) and their parents.

    Ordered as :func:`for_instance` orders them. No lock: the segment holds
    the execution lock.
    """
    params = {
        "wf": workflow_id,
        "token": None if token_id is None else str(uuid.UUID(str(token_id))),
        "fork": fork_step_id,
        "branch": branch_id,
    }
    return [_row(r) for r in db.fetchall(ADDRESSED, params)]


def get(token_id: Any, *, lock: bool = False) -> BranchRow | None:
    """One token; ``lock``: FOR UPDATE (after timers and tasks in the lock order)."""
    row = db.fetchone(SELECT_FOR_UPDATE if lock else SELECT, (token_id,))
    return None if row is None else _row(row)


def update(workflow_id: Any, changes: Sequence[BranchChange]) -> None:
    """Write the drive's changes to live tokens in one statement.

    Raises :class:`BranchConflict` when any token of the list is not a live
    token of the instance (ended, superseded or missing): nothing of the
    statement may stand, the segment rolls back.
    """
    if not changes:
        return
    _distinct([c.token_id for c in changes])
    rows = [
        {
            "token_id": str(c.token_id),
            "status": _check_status(c.status),
            "current_step_id": c.current_step_id,
            "state": c.state,
            "retried": c.retried,
        }
        for c in changes
    ]
    updated = db.execute(UPDATE, {"wf": workflow_id, "rows": json.dumps(rows)})
    if updated != len(changes):
        raise BranchConflict("a branch token is no longer live")


def supersede(workflow_id: Any, token_ids: Sequence[Any]) -> list[uuid.UUID]:
    """Live tokens of the list -> SUPERSEDED in one statement; returns those it superseded.

    Ended tokens are left as they are (a branch that completed before the
    join decided keeps COMPLETED). Cancel the branches' timers and tasks
    first (the lock order).
    """
    if not token_ids:
        return []
    ids = _distinct(token_ids)
    rows = db.fetchall(SUPERSEDE, {"wf": workflow_id, "ids": ids})
    return sorted((r[0] for r in rows), key=lambda t: ids.index(str(t)))
