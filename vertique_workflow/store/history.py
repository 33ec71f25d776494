"""workflow_history: append-only entries, sequence MAX+1 under the execution lock."""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.decision_log import HistoryEntry
from . import db

T = db.T

# Columns an appended entry fills (workflow_id and sequence come from the statement).
HISTORY_COLUMNS = (
    "event_type, payload_json, step_id, outcome, patch_json, entry_version, "
    "state_version_before, state_version_after, executor_id, command_id, "
    "definition_scope_key, definition_id, definition_version, plan_hash, actor_kind, "
    "actor_id, actor_reason, on_behalf_of, attribution_status"
)

# An entry's own record: its position and fields, then its own values of shared
# columns and its actor (set by few entries, so last). HISTORY_RECORDSET adds the
# fallback actor each record carries for HISTORY_SELECTED.
_OWN_FIELDS = (  # (column, SQL type, HistoryEntry attribute)
    ("event_type", "text", "event_type"),
    ("payload_json", "jsonb", "payload"),
    ("step_id", "text", "step_id"),
    ("outcome", "text", "outcome"),
    ("patch_json", "jsonb", "patch_json"),
    ("entry_version", "smallint", "entry_version"),
    ("state_version_before", "bigint", "state_version_before"),
    ("state_version_after", "bigint", "state_version_after"),
)
_own_values = operator.attrgetter(*(attribute for _, _, attribute in _OWN_FIELDS))
_EXTRA_FIELDS = (
    ("command_id", "bigint"),
    ("executor_id", "text"),
    ("definition_scope_key", "text"),
    ("definition_id", "text"),
    ("definition_version", "int"),
    ("plan_hash", "text"),
    ("actor_kind", "text"),
    ("actor_id", "text"),
    ("actor_reason", "text"),
    ("on_behalf_of", "text"),
    ("attribution_status", "text"),
)
ENTRY_FIELDS = (
    ("ord", "int"),
    *((column, sql_type) for column, sql_type, _ in _OWN_FIELDS),
    *_EXTRA_FIELDS,
)
ENTRY_RECORDSET = ", ".join(f"{name} {sql_type}" for name, sql_type in ENTRY_FIELDS)


def _positional(index: int, name: str, sql_type: str) -> str:
    """Field ``index`` of an entry's array, typed; JSON null (or no such field) is NULL."""
    if sql_type == "jsonb":
        return f"NULLIF(r.entry -> {index}, 'null') AS {name}"
    if sql_type == "text":
        return f"r.entry ->> {index} AS {name}"
    return f"(r.entry ->> {index})::{sql_type} AS {name}"


# The segment's persist reads its entries as one JSON array per entry, fields in
# ENTRY_FIELDS order and trailing nulls left out (``entry_array``): PostgreSQL
# parses the entries' JSON on every persist, and without a key per field it has
# about half the text to read (1,473 -> 719 bytes for a 3-action segment).
ENTRY_ARRAYS = (
    "(SELECT "
    + ", ".join(_positional(i, name, sql_type) for i, (name, sql_type) in enumerate(ENTRY_FIELDS))
    + " FROM jsonb_array_elements(%(entries)s::jsonb) AS r(entry))"
)

ACTOR_COLUMNS = ("actor_kind", "actor_id", "actor_reason", "on_behalf_of", "attribution_status")


# The columns every entry of one segment's persist shares (its command, executor
# and pin): the persist sends them once, as parameters ``%(shared_<column>)s``,
# instead of in each entry's record (``SHARED_HISTORY_SELECTED``). PostgreSQL
# parses the entries' JSON on every persist, and these values were most of it.
SHARED_COLUMNS = frozenset(
    (
        "executor_id",
        "command_id",
        "definition_scope_key",
        "definition_id",
        "definition_version",
        "plan_hash",
    )
)


def _selected(column: str, *, shared: bool = False, joined: bool = True) -> str:
    """The value an appended entry stores in ``column``.

    Attribution: an entry that carries an actor keeps it (a canceller, a
    caller of :func:`attribute_history`); any other entry takes the actor of
    the command it names (its ``command_id``, else its payload's
    ``commandId``; joined as ``n``), and failing that the fallback actor the
    writer gives (``fb_*``: the segment command's actor, or NONE/ABSENT).
    ``shared``: the fallback actor and the :data:`SHARED_COLUMNS` come as
    parameters (``%(fb_<column>)s``, ``%(shared_<column>)s``); an entry's own
    value of a shared column, when it has one, wins.
    """
    if column == "entry_version":
        return "COALESCE(e.entry_version, 1)"
    if column in ACTOR_COLUMNS:
        fallback = f"%(fb_{column})s" if shared else f"e.fb_{column}"
        if not joined:
            return f"CASE WHEN e.actor_kind IS NOT NULL THEN e.{column} ELSE {fallback} END"
        return (
            f"CASE WHEN e.actor_kind IS NOT NULL THEN e.{column} "
            f"WHEN n.actor_kind IS NOT NULL THEN n.{column} ELSE {fallback} END"
        )
    if shared and column in SHARED_COLUMNS:
        return f"COALESCE(e.{column}, %(shared_{column})s)"
    return f"e.{column}"


HISTORY_SELECTED = ", ".join(_selected(column) for column in HISTORY_COLUMNS.split(", "))
SHARED_HISTORY_SELECTED = ", ".join(
    _selected(column, shared=True) for column in HISTORY_COLUMNS.split(", ")
)
# SHARED_HISTORY_SELECTED for entries that all name the segment's own command
# (none carries a command id of another): the fallback actor *is* that command's
# actor, read by the fence in the same transaction under the execution lock, so no
# entry needs its command joined (``named_command_join``). (A stored actor with a
# kind but no attribution status reads ABSENT through the fence, NULL through the
# join; the recorders always write both.)
OWN_HISTORY_SELECTED = ", ".join(
    _selected(column, shared=True, joined=False) for column in HISTORY_COLUMNS.split(", ")
)
HISTORY_RECORDSET = (
    ENTRY_RECORDSET + ", " + ", ".join(f"fb_{column} text" for column in ACTOR_COLUMNS)
)


def named_command_join(workflow_param: str, *, shared: bool = False) -> str:
    """The command an entry names, for its attribution (same instance only).

    ``shared``: an entry with no ``command_id`` of its own names the shared one.
    """
    named = "COALESCE(e.command_id, %(shared_command_id)s)" if shared else "e.command_id"
    return (
        f"LEFT JOIN {T['commands']} n ON n.workflow_id = {workflow_param} AND n.id = "
        f"COALESCE({named}, (e.payload_json ->> 'commandId')::bigint)"
    )


# One statement appends any number of entries: the caller holds the execution
# lock, so MAX(sequence) + n is the next dense sequence.
APPEND = f"""
INSERT INTO {T["history"]} (workflow_id, sequence, {HISTORY_COLUMNS})
SELECT %(wf)s, base.s + e.ord, {HISTORY_SELECTED}
FROM (SELECT COALESCE(MAX(sequence), 0) AS s FROM {T["history"]} WHERE workflow_id = %(wf)s) base
CROSS JOIN jsonb_to_recordset(%(entries)s::jsonb) AS e({HISTORY_RECORDSET})
{named_command_join("%(wf)s")}
"""

# An actor for the entries from a sequence on that have none (record-side writers).
ATTRIBUTE = f"""
UPDATE {T["history"]}
SET actor_kind = %(kind)s, actor_id = %(id)s, actor_reason = %(reason)s,
    on_behalf_of = %(on_behalf_of)s, attribution_status = %(status)s
WHERE workflow_id = %(wf)s AND sequence >= %(from)s AND actor_kind IS NULL
"""

NO_ACTOR = {
    "actor_kind": "NONE",
    "actor_id": None,
    "actor_reason": None,
    "on_behalf_of": None,
    "attribution_status": "ABSENT",
}

DECISION_LOG = f"""
SELECT sequence, event_type, payload_json, patch_json FROM {T["history"]}
WHERE workflow_id = %s AND entry_version = 2 AND sequence <= %s
  AND event_type IN ('STATE_BASELINE', 'DECISION')
ORDER BY sequence
"""

# The decisions compensation reads (engine/compensation.py): the instance's own
# token's recorded steps, compensations run, and the COMPENSATING/COMPENSATED marks.
COMPENSATION_MARKS = f"""
SELECT step_id, outcome, payload_json FROM {T["history"]}
WHERE workflow_id = %s AND event_type = 'DECISION'
  AND (outcome IN ('COMPENSATING', 'COMPENSATED')
       OR (payload_json -> 'compensate') IS NOT NULL
       OR (payload_json -> 'compensates') IS NOT NULL)
ORDER BY sequence
"""

LIST = f"""
SELECT sequence, event_type, payload_json, step_id, outcome, patch_json, entry_version,
       command_id, executor_id, actor_kind, actor_id, created_at
FROM {T["history"]} WHERE workflow_id = %s ORDER BY sequence
"""


# Where the steps an instance took are, for its diagram: per step (and per
# branch token for BRANCH_DECISION entries) the first and last sequence and the
# outcome of the last -- a few rows whatever the history's length.
STEP_MARKS = f"""
SELECT e.event_type = 'BRANCH_DECISION',
       COALESCE(e.step_id, e.payload_json ->> 'step'),
       CASE WHEN e.event_type = 'BRANCH_DECISION'
            THEN COALESCE(e.payload_json ->> 'tokenId', e.payload_json ->> 'branchId', '') END,
       CASE WHEN e.event_type = 'BRANCH_DECISION'
            THEN COALESCE(e.payload_json ->> 'branchId', '?') END,
       min(e.sequence), max(e.sequence),
       (array_agg(COALESCE(e.outcome, e.payload_json ->> 'outcome', '')
                  ORDER BY e.sequence DESC))[1]
FROM {T["history"]} e
WHERE e.workflow_id = %(wf)s AND e.event_type = ANY(%(types)s)
  AND (%(upto)s::bigint IS NULL OR e.sequence <= %(upto)s::bigint)
  AND COALESCE(e.step_id, e.payload_json ->> 'step') IS NOT NULL
GROUP BY 1, 2, 3, 4
"""

LAST_FAILURE = f"""
SELECT payload_json ->> 'reason', created_at, COALESCE((payload_json ->> 'commandId')::bigint,
       command_id)
FROM {T["history"]}
WHERE workflow_id = %s AND event_type IN ('FAILED', 'COMMAND_DEAD_LETTERED')
ORDER BY sequence DESC LIMIT 1
"""


def last_failure(workflow_id: Any) -> tuple[str, Any, int | None] | None:
    """(stored reason, when, command id) of the latest FAILED or COMMAND_DEAD_LETTERED entry."""
    row = db.fetchone(LAST_FAILURE, (workflow_id,))
    return None if row is None else (row[0] or "", row[1], row[2])


def entry_row(
    entry: HistoryEntry, common: dict[str, Any], fallback_actor: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One entry's recordset row; ``fallback_actor`` attributes an entry naming no command."""
    row = {
        **{f"fb_{column}": value for column, value in (fallback_actor or NO_ACTOR).items()},
        **_fields(entry),
    }
    row.update(common)
    row.update(entry.extra)
    return row


def entry_array(entry: HistoryEntry, ord: int) -> list[Any]:
    """One entry as :data:`ENTRY_ARRAYS` reads it: its fields in ``ENTRY_FIELDS`` order.

    Trailing None values are left out (a missing field reads as NULL, as null
    does), so an entry's ``extra`` overrides a shared column with a value,
    never with None. An ``extra`` naming no field of the table is refused.
    """
    values = [ord, *_own_values(entry)]
    if entry.extra:
        values.extend([None] * len(_EXTRA_FIELDS))
        for name, value in entry.extra.items():
            position = _EXTRA_POSITIONS.get(name)
            if position is None:
                raise ValueError(f"a history entry cannot carry {name!r}")
            values[position] = value
    while values[-1] is None:
        values.pop()
    return values


# where an entry's extra fields go in its array, after its position and own fields
_EXTRA_POSITIONS = {
    name: position for position, (name, _) in enumerate(ENTRY_FIELDS) if position > len(_OWN_FIELDS)
}


_OWN_COLUMNS = tuple(column for column, _, _ in _OWN_FIELDS)


def _fields(entry: HistoryEntry) -> dict[str, Any]:
    return dict(zip(_OWN_COLUMNS, _own_values(entry), strict=True))


def append(
    workflow_id: Any,
    entries: Sequence[HistoryEntry],
    *,
    fallback_actor: dict[str, Any] | None = None,
    **common: Any,
) -> None:
    """Append entries in order; ``common`` fills columns such as command_id, executor_id.

    Actor columns given in ``common`` (or an entry's ``extra``) are stored as
    given; otherwise an entry is attributed to the command it names (see
    ``_selected``), then to ``fallback_actor`` (NONE/ABSENT by default).
    """
    if not entries:
        return
    rows = [
        dict(entry_row(entry, common, fallback_actor), ord=index)
        for index, entry in enumerate(entries, start=1)
    ]
    db.execute(APPEND, {"wf": workflow_id, "entries": json.dumps(rows, default=str)})


def attribute_history(workflow_id: Any, from_sequence: int, actor: dict[str, Any]) -> int:
    """Set ``actor`` (history columns) on the entries from ``from_sequence`` on that have none.

    Never overwrites an entry that has an actor. Call in the transaction that
    holds the instance's execution lock, like every history write.
    """
    return db.execute(
        ATTRIBUTE,
        {
            "wf": workflow_id,
            "from": from_sequence,
            "kind": actor.get("actor_kind", "NONE"),
            "id": actor.get("actor_id"),
            "reason": actor.get("actor_reason"),
            "on_behalf_of": actor.get("on_behalf_of"),
            "status": actor.get("attribution_status", "ABSENT"),
        },
    )


def decision_log(workflow_id: Any, up_to_sequence: int) -> list[tuple[str, Any, Any]]:
    """(event_type, payload, patch) of the decision log up to a sequence."""
    return [
        (row[1], db.load_json(row[2]), db.load_json(row[3]))
        for row in db.fetchall(DECISION_LOG, (workflow_id, up_to_sequence))
    ]


def compensation_marks(workflow_id: Any) -> list[Any]:
    """The marks of ``engine.compensation``, oldest first (the caller holds the execution lock)."""
    from ..engine.compensation import Mark

    return [
        Mark(row[0] or "", row[1] or "", db.load_json(row[2]) or {})
        for row in db.fetchall(COMPENSATION_MARKS, (workflow_id,))
    ]


@dataclass(frozen=True)
class StepMark:
    """One step an instance's entries name: by its own token, or by a branch token."""

    branch: bool
    step_id: str
    token: str | None
    branch_id: str | None
    first_sequence: int
    last_sequence: int
    last_outcome: str


def step_marks(
    workflow_id: Any, event_types: Sequence[str], upto_sequence: int | None = None
) -> list[StepMark]:
    """The steps entries of ``event_types`` name (up to a sequence), aggregated per step/token."""
    rows = db.fetchall(
        STEP_MARKS, {"wf": workflow_id, "types": list(event_types), "upto": upto_sequence}
    )
    return [StepMark(bool(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), r[6] or "") for r in rows]


def entries(workflow_id: Any) -> list[dict[str, Any]]:
    rows = db.fetchdicts(LIST, (workflow_id,))
    for row in rows:
        row["payload_json"] = db.load_json(row["payload_json"])
        row["patch_json"] = db.load_json(row["patch_json"])
    return rows
