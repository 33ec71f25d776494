"""Read statements behind ``wf.instances``, ``wf.history`` and ``wf.count_non_terminal``.

Plain reads in the caller's connection (no lock, no write). The instance list
is a keyset page on ``(updated_at DESC, id)``: the order of the scope keyset
index ``idx_workflow_instances_scope_updated_at (scope_key, updated_at DESC,
id)``, so a scope-filtered page is an index range scan that stops after
``limit + 1`` rows, however deep the page. Without a scope filter the same
index serves a *loose* scan: the distinct scopes are walked through the index
(a recursive CTE, one probe per scope) and each scope contributes its own
first ``limit + 1`` rows, merged and cut; PostgreSQL has no skip scan to do
this by itself, and a top-N sort of a million rows is what this avoids. A
status filter is merged the same way, one range of ``wf_inst_status_updated_idx
(status, updated_at)`` per status (a scope filter is then a filter on it, or
the planner's pick of the scope index); a business key is a few rows through
its own index.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import db, keyset
from .definitions import COUNT_PINNED_INSTANCES

T = db.T

QUERY_LIMIT_MAX = 500
HISTORY_LIMIT_MAX = 1000
# Commands not settled: the active states of eligibility, and PARKED and DEAD ones.
OPEN_STATES = "('PENDING', 'DEFERRED', 'CLAIMED', 'PARKED', 'DEAD')"

INSTANCE_COLUMNS = (
    "id, definition_id, definition_version, status, current_step_id, business_key, scope_key, "
    "error_type, error_message, version, created_at, updated_at, completed_at, archived_at"
)


@dataclass(frozen=True)
class InstancePageRows:
    """Rows in ``INSTANCE_COLUMNS`` order (``query.InstanceSummary`` has the same order)."""

    rows: list[tuple[Any, ...]]
    next_cursor: str | None


def encode_instance_cursor(updated_at: datetime.datetime, instance_id: Any) -> str:
    return keyset.encode("instance", [updated_at.isoformat(), str(instance_id)])


def decode_instance_cursor(cursor: str) -> tuple[datetime.datetime, uuid.UUID]:
    """Raises ValueError for a cursor that is not an instance-list cursor."""
    return keyset.decode("instance", cursor, (datetime.datetime.fromisoformat, uuid.UUID))


def instance_page_sql(
    *,
    scope: str | None = None,
    statuses: Sequence[str] | None = None,
    definition_id: str | None = None,
    definition_version: int | None = None,
    business_key: str | None = None,
    updated_after: datetime.datetime | None = None,
    updated_before: datetime.datetime | None = None,
    include_archived: bool = False,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[str, dict[str, Any], int]:
    """The page statement, its parameters and the bounded limit (it fetches one row more).

    Conditions are only written when given (no ``%s IS NULL OR`` guards), so
    each combination gets a plan fit for it. The keyset condition repeats
    ``updated_at <= after`` beside the exact tie-break, so the index scan
    *starts* at the cursor instead of filtering its way there.
    ``updated_after`` is inclusive, ``updated_before`` exclusive.
    """
    limit = max(1, min(int(limit), QUERY_LIMIT_MAX))
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if scope is not None:
        where.append("i.scope_key = %(scope)s")
        params["scope"] = scope
    if statuses is not None:
        where.append("i.status = ANY(%(statuses)s::text[])")
        params["statuses"] = list(statuses)
    if definition_id is not None:
        where.append("i.definition_id = %(definition)s")
        params["definition"] = definition_id
    if definition_version is not None:
        where.append("i.definition_version = %(version)s")
        params["version"] = int(definition_version)
    if business_key is not None:
        where.append("i.business_key = %(business_key)s")
        params["business_key"] = business_key
    if updated_after is not None:
        where.append("i.updated_at >= %(updated_after)s")
        params["updated_after"] = updated_after
    if updated_before is not None:
        where.append("i.updated_at < %(updated_before)s")
        params["updated_before"] = updated_before
    if not include_archived:
        where.append("i.archived_at IS NULL")
    if cursor is not None:
        after_at, after_id = decode_instance_cursor(cursor)
        where.append(
            "i.updated_at <= %(after_at)s AND (i.updated_at < %(after_at)s OR i.id > %(after_id)s)"
        )
        params.update(after_at=after_at, after_id=after_id)
    columns = ", ".join(f"i.{c}" for c in INSTANCE_COLUMNS.split(", "))
    if business_key is None and statuses is not None:
        # one index range per status, merged: (status, updated_at) serves each
        where[where.index("i.status = ANY(%(statuses)s::text[])")] = "i.status = u.status"
        sql = _merged("SELECT DISTINCT unnest(%(statuses)s::text[]) AS status", "u", columns, where)
    elif business_key is None and scope is None:
        # the loose scan: one index range per distinct scope, merged
        where.insert(0, "i.scope_key = u.scope_key")
        sql = _merged(DISTINCT_SCOPES, "u", columns, where)
    else:
        sql = f"""
SELECT {columns} FROM {T["instances"]} i
{"WHERE " + " AND ".join(where) if where else ""}
ORDER BY i.updated_at DESC, i.id
LIMIT %(limit)s
"""
    return sql, params, limit


# The distinct scopes, walked through the scope index one probe each (no skip scan
# in PostgreSQL 15-17 does this by itself).
DISTINCT_SCOPES = f"""
WITH RECURSIVE s(scope_key) AS (
    (SELECT scope_key FROM {T["instances"]} ORDER BY scope_key LIMIT 1)
    UNION ALL
    SELECT (SELECT n.scope_key FROM {T["instances"]} n
            WHERE n.scope_key > s.scope_key ORDER BY n.scope_key LIMIT 1)
    FROM s WHERE s.scope_key IS NOT NULL
)
SELECT scope_key FROM s WHERE scope_key IS NOT NULL
"""


def _merged(parts: str, alias: str, columns: str, where: list[str]) -> str:
    """Each row of ``parts`` contributes its own first page; the heads are merged and cut."""
    return f"""
SELECT p.* FROM ({parts}) {alias} CROSS JOIN LATERAL (
    SELECT {columns} FROM {T["instances"]} i
    WHERE {" AND ".join(where)}
    ORDER BY i.updated_at DESC, i.id
    LIMIT %(limit)s
) p
ORDER BY p.updated_at DESC, p.id
LIMIT %(limit)s
"""


def instance_page(**filters: Any) -> InstancePageRows:
    """One keyset page of instance summaries (see :func:`instance_page_sql`)."""
    sql, params, limit = instance_page_sql(**filters)
    rows = db.fetchall(sql, params)
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = dict(zip(INSTANCE_COLUMNS.split(", "), rows[-1], strict=True))
        next_cursor = encode_instance_cursor(last["updated_at"], last["id"])
    return InstancePageRows(rows, next_cursor)


def count_non_terminal(scope: str, definition_id: str, version: int) -> int:
    """PENDING, RUNNING, WAITING and COMPENSATING instances pinned to that exact version.

    The retirement guard's own statement (archived rows included, the
    definition's scope), read here outside any lock: information, not a guard.
    """
    row = db.fetchone(COUNT_PINNED_INSTANCES, (scope, definition_id, version))
    return int(row[0]) if row else 0


# -- history pages -------------------------------------------------------------

HISTORY_PAGE_COLUMNS = (
    "sequence, event_type, payload_json, step_id, outcome, patch_json, entry_version, "
    "state_version_before, state_version_after, command_id, executor_id, definition_scope_key, "
    "definition_id, definition_version, plan_hash, actor_kind, actor_id, actor_reason, "
    "on_behalf_of, attribution_status, created_at"
)

_HISTORY_PAGE = f"""
SELECT {HISTORY_PAGE_COLUMNS} FROM {T["history"]}
WHERE workflow_id = %(wf)s AND {{keyset}}
ORDER BY sequence {{direction}}
LIMIT %(limit)s
"""

HISTORY_PAGE_ASC = _HISTORY_PAGE.format(keyset="sequence > %(after)s", direction="ASC")
HISTORY_PAGE_DESC = _HISTORY_PAGE.format(keyset="sequence < %(after)s", direction="DESC")

OPEN_COMMANDS = f"""
SELECT id, seq, kind, state, timer_kind, task_id, target_json ->> 'name' AS signal_name,
       dedup_key, attempts, recorded_at, available_at, fire_at, claimed_by, lease_until, last_error,
       actor_kind, actor_id
FROM {T["commands"]}
WHERE workflow_id = %s AND state IN {OPEN_STATES}
ORDER BY seq
"""


def encode_history_cursor(sequence: int, newest_first: bool) -> str:
    return keyset.encode("history", [int(sequence), bool(newest_first)])


def decode_history_cursor(cursor: str) -> tuple[int, bool]:
    """Raises ValueError for a cursor that is not a history cursor."""
    return keyset.decode("history", cursor, (int, bool))


def history_page(
    workflow_id: Any, *, limit: int, newest_first: bool, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of entries (json decoded) and the cursor of the next, if any.

    A cursor remembers its direction; one written for the other direction
    is refused (ValueError) rather than read backwards.
    """
    limit = max(1, min(int(limit), HISTORY_LIMIT_MAX))
    if cursor is None:
        after = 2**62 if newest_first else 0
    else:
        after, direction = decode_history_cursor(cursor)
        if direction != newest_first:
            raise ValueError("the cursor was written for the other direction")
    sql = HISTORY_PAGE_DESC if newest_first else HISTORY_PAGE_ASC
    rows = db.fetchdicts(sql, {"wf": workflow_id, "after": after, "limit": limit + 1})
    for row in rows:
        row["payload_json"] = db.load_json(row["payload_json"])
        row["patch_json"] = db.load_json(row["patch_json"])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_history_cursor(rows[-1]["sequence"], newest_first)
    return rows, next_cursor


def open_commands(workflow_id: Any) -> list[dict[str, Any]]:
    """The instance's commands that are not settled: active, PARKED and DEAD, by queue order."""
    return db.fetchdicts(OPEN_COMMANDS, (workflow_id,))
