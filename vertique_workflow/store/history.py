"""workflow_history: append-only entries, sequence MAX+1 under the execution lock."""

from __future__ import annotations

import json
from collections.abc import Sequence
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

HISTORY_RECORDSET = (
    "event_type text, payload_json jsonb, step_id text, outcome text, patch_json jsonb, "
    "entry_version smallint, state_version_before bigint, state_version_after bigint, "
    "executor_id text, command_id bigint, definition_scope_key text, definition_id text, "
    "definition_version int, plan_hash text, actor_kind text, actor_id text, actor_reason text, "
    "on_behalf_of text, attribution_status text, ord int"
)

HISTORY_SELECTED = ", ".join(
    "COALESCE(e.entry_version, 1)" if column == "entry_version" else f"e.{column}"
    for column in HISTORY_COLUMNS.split(", ")
)

# One statement appends any number of entries: the caller holds the execution
# lock, so MAX(sequence) + n is the next dense sequence.
APPEND = f"""
INSERT INTO {T["history"]} (workflow_id, sequence, {HISTORY_COLUMNS})
SELECT %s, base.s + e.ord, {HISTORY_SELECTED}
FROM (SELECT COALESCE(MAX(sequence), 0) AS s FROM {T["history"]} WHERE workflow_id = %s) base,
     jsonb_to_recordset(%s::jsonb) AS e({HISTORY_RECORDSET})
"""

DECISION_LOG = f"""
SELECT sequence, event_type, payload_json, patch_json FROM {T["history"]}
WHERE workflow_id = %s AND entry_version = 2 AND sequence <= %s
  AND event_type IN ('STATE_BASELINE', 'DECISION')
ORDER BY sequence
"""

LIST = f"""
SELECT sequence, event_type, payload_json, step_id, outcome, patch_json, entry_version,
       command_id, executor_id, actor_kind, actor_id, created_at
FROM {T["history"]} WHERE workflow_id = %s ORDER BY sequence
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


def entry_row(entry: HistoryEntry, common: dict[str, Any]) -> dict[str, Any]:
    row = {
        "event_type": entry.event_type,
        "payload_json": entry.payload,
        "step_id": entry.step_id,
        "outcome": entry.outcome,
        "patch_json": entry.patch_json,
        "entry_version": entry.entry_version,
        "state_version_before": entry.state_version_before,
        "state_version_after": entry.state_version_after,
    }
    row.update(common)
    row.update(entry.extra)
    return row


def append(workflow_id: Any, entries: Sequence[HistoryEntry], **common: Any) -> None:
    """Append entries in order; ``common`` fills columns such as command_id, executor_id."""
    if not entries:
        return
    rows = [
        dict(entry_row(entry, common), ord=index) for index, entry in enumerate(entries, start=1)
    ]
    db.execute(APPEND, (workflow_id, workflow_id, json.dumps(rows, default=str)))


def decision_log(workflow_id: Any, up_to_sequence: int) -> list[tuple[str, Any, Any]]:
    """(event_type, payload, patch) of the decision log up to a sequence."""
    return [
        (row[1], db.load_json(row[2]), db.load_json(row[3]))
        for row in db.fetchall(DECISION_LOG, (workflow_id, up_to_sequence))
    ]


def entries(workflow_id: Any) -> list[dict[str, Any]]:
    rows = db.fetchdicts(LIST, (workflow_id,))
    for row in rows:
        row["payload_json"] = db.load_json(row["payload_json"])
        row["patch_json"] = db.load_json(row["patch_json"])
    return rows
