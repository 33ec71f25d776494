"""The segment's statements, combined so a segment costs few round trips.

A segment is one transaction: (1) its deadline and the execution lock in one
statement, (2) the fence on the claim token together with the instance row,
(3) every write of the transition — the instance (optimistic version), the
history entries and the command's completion with the open-signal counter —
in one statement of data-modifying CTEs, in the lock order instances →
command queues, sent with the transaction's ``COMMIT`` when nothing follows
it (``persist(commit=True)``). Each piece keeps the rule of its table family (see
``commands.py``, ``instances.py``, ``history.py``); this module only joins
them into fewer statements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import tables
from ..engine.decision_log import HistoryEntry
from . import db
from .commands import FencedCommand, actor_from_row, execution_lock_sql
from .eligibility import at_head
from .history import (
    ACTOR_COLUMNS,
    ENTRY_ARRAYS,
    HISTORY_COLUMNS,
    OWN_HISTORY_SELECTED,
    SHARED_COLUMNS,
    SHARED_HISTORY_SELECTED,
    entry_array,
    named_command_join,
)
from .instances import COLUMN_COUNT as INSTANCE_COLUMN_COUNT
from .instances import InstanceRow, row_from_values
from .instances import columns_of as instance_columns

T = db.T

# The execution lock, lock_timeout for that wait only (see commands.execution_lock_sql);
# on PostgreSQL 17+ transaction_timeout first, so the server ends a segment that
# passes its deadline (15/16: the executor's deadline watchdog does).
BEGIN_SEGMENT = execution_lock_sql()
BEGIN_SEGMENT_WITH_TIMEOUT = execution_lock_sql(
    before="set_config('transaction_timeout', %s, true),\n       "
)

FENCE_AND_LOAD = f"""
SELECT c.id, c.workflow_id, c.seq, c.kind, c.payload_json, c.target_json, c.dedup_key,
       c.context_json, c.explicit_carrier_json, c.actor_kind, c.actor_id, c.actor_reason,
       c.on_behalf_of, c.attribution_status, c.attempts, c.claimed_by, c.timer_kind,
       c.timer_id, c.task_id,
       {instance_columns("i")},
       EXISTS (SELECT 1 FROM {T["commands"]} p
               WHERE p.workflow_id = c.workflow_id AND p.state IN ('PARKED', 'DEAD'))
FROM {T["commands"]} c JOIN {T["instances"]} i ON i.id = c.workflow_id
WHERE c.id = %s AND c.state = 'CLAIMED' AND c.claim_token = %s
  AND {at_head("c")}
FOR UPDATE OF c
"""


def _persist_ctes(selected: str, join: str) -> str:
    """The persist's three writes; ``selected``/``join``: how the entries' columns are read."""
    return f"""
WITH inst AS (
    UPDATE {T["instances"]}
    SET status = %(status)s, current_step_id = %(step)s, state_json = %(state)s::jsonb,
        version = %(new_version)s, error_type = %(error_type)s,
        error_message = %(error_message)s,
        subject_json = COALESCE(%(subject)s::jsonb, subject_json), updated_at = now(),
        completed_at = CASE WHEN %(ended)s THEN now() END,
        baseline_logged = baseline_logged OR %(legacy_baseline)s
    WHERE id = %(wf)s AND version = %(version)s
      AND (NOT %(legacy_baseline)s OR baseline_logged = FALSE)
    RETURNING id
), hist AS (
    INSERT INTO {T["history"]} (workflow_id, sequence, {HISTORY_COLUMNS})
    SELECT %(wf)s, base.s + e.ord, {selected}
    FROM (SELECT COALESCE(MAX(sequence), 0) AS s FROM {T["history"]}
          WHERE workflow_id = %(wf)s) base
    CROSS JOIN {ENTRY_ARRAYS} AS e
    {join}
    WHERE EXISTS (SELECT 1 FROM inst)
), done AS (
    UPDATE {T["commands"]}
    SET state = 'COMPLETE', claim_token = NULL, lease_until = NULL, settled_at = now(),
        last_error = NULL
    WHERE id = %(command)s AND state = 'CLAIMED' AND claim_token = %(token)s
      AND EXISTS (SELECT 1 FROM inst)
    RETURNING workflow_id, kind
)"""


# The persist fails itself unless it wrote the instance and the command's
# completion: a PL/pgSQL function (migration 0017 creates it) raises SQLSTATE
# 40001 (retried as transient) for any count but one. So a COMMIT sent in the
# same pipeline (``persist(commit=True)``) never runs after a persist that wrote
# nothing: the transaction's earlier writes (timers, tasks, a child's start)
# roll back with it. IMMUTABLE: it reads nothing, only its argument.
PERSISTED_ONCE_FUNCTION = "workflow_persisted_once"
PERSIST_CONFLICT = "the instance or the command changed under the execution lock"


def persisted_once_function_sql(schema: str | None = tables.SCHEMA) -> str:
    """``CREATE OR REPLACE FUNCTION`` of the persist's own check, in ``schema``."""
    return f"""
CREATE OR REPLACE FUNCTION {tables.qualified_object(PERSISTED_ONCE_FUNCTION, schema)}(
    written bigint
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF written = 1 THEN
        RETURN written;
    END IF;
    RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = '{PERSIST_CONFLICT}';
END
$$"""


def drop_persisted_once_function_sql(schema: str | None = tables.SCHEMA) -> str:
    """The reverse of :func:`persisted_once_function_sql`."""
    return f"DROP FUNCTION {tables.qualified_object(PERSISTED_ONCE_FUNCTION, schema)}(bigint)"


# The completion is written only after the instance's update (``EXISTS (SELECT 1
# FROM inst)``), so one count answers both; the history insert runs to completion
# unread (PostgreSQL runs every data-modifying CTE once, whether the query reads it
# or not), and no other result is set up on each execution.
_PERSIST_RESULT = f"""
SELECT {tables.qualified_object(PERSISTED_ONCE_FUNCTION)}(count(*)) FROM done
"""
# A settled SIGNAL leaves the open states: its queue row's open_signals is lowered
# in the same statement. Any other kind runs the statement without that update:
# PostgreSQL initialises every data-modifying CTE of a statement on each
# execution (the table, its indexes, the projection), even one that writes nothing.
_LOWER_OPEN_SIGNALS = f""", lowered AS (
    UPDATE {T["command_queues"]} q SET open_signals = GREATEST(q.open_signals - 1, 0)
    FROM done WHERE q.workflow_id = done.workflow_id AND done.kind = 'SIGNAL'
)"""


def _persist(selected: str, join: str, *, signal: bool) -> str:
    lowered = _LOWER_OPEN_SIGNALS if signal else ""
    return f"{_persist_ctes(selected, join)}{lowered}{_PERSIST_RESULT}"


_JOINED = (SHARED_HISTORY_SELECTED, named_command_join("%(wf)s", shared=True))
PERSIST_SIGNAL = _persist(*_JOINED, signal=True)
PERSIST = _persist(*_JOINED, signal=False)
# The same, for entries that all name the segment's command (the common case):
# no join of each entry's command for its attribution (the fallback actor is that
# command's), so no hash join, hash or index scan to set up on each execution.
OWN_PERSIST_SIGNAL = _persist(OWN_HISTORY_SELECTED, "", signal=True)
OWN_PERSIST = _persist(OWN_HISTORY_SELECTED, "", signal=False)


@dataclass(frozen=True)
class Loaded:
    command: FencedCommand
    instance: InstanceRow
    has_parked_or_dead: bool


def _lock_statement(
    workflow_id: Any, lock_timeout_ms: int, transaction_timeout_ms: int | None
) -> tuple[str, tuple[str, ...]]:
    """The execution lock's statement and parameters (with transaction_timeout on 17+)."""
    lock = (f"{int(lock_timeout_ms)}ms", str(workflow_id))
    if transaction_timeout_ms is None:
        return BEGIN_SEGMENT, lock
    return BEGIN_SEGMENT_WITH_TIMEOUT, (f"{int(transaction_timeout_ms)}ms", *lock)


def begin_fence_and_load(
    workflow_id: Any,
    command_id: int,
    token: Any,
    *,
    lock_timeout_ms: int,
    transaction_timeout_ms: int | None = None,
) -> Loaded | None:
    """The execution lock, then :func:`fence_and_load`, sent as one pipeline: one wait, not three.

    PostgreSQL runs a pipeline's statements one after the other, each with a
    snapshot of its own taken when it starts (READ COMMITTED), so the fence
    reads after the execution lock is granted, as when the two are sent one
    by one: every transaction that changes the instance takes the lock first,
    and the fence sees what the last of them committed. The transaction's
    ``BEGIN`` goes in the same pipeline (``db.send_pipeline``). A lock that
    times out fails the pipeline with its own error (55P03); the fence then
    does not run.
    """
    results: list[Any] = []
    db.send_pipeline(
        [
            _lock_statement(workflow_id, lock_timeout_ms, transaction_timeout_ms),
            (FENCE_AND_LOAD, (command_id, token)),
        ],
        results,
    )
    return _loaded(results[1].fetchone())


def fence_and_load(command_id: int, token: Any) -> Loaded | None:
    """The fenced command and its instance; None when the claim was lost."""
    return _loaded(db.fetchone_prepared(FENCE_AND_LOAD, (command_id, token)))


def _loaded(row: tuple[Any, ...] | None) -> Loaded | None:
    """The fence's row as a :class:`Loaded`; None when the claim was lost."""
    if row is None:
        return None
    (
        cid,
        wf,
        seq,
        kind,
        payload,
        target,
        dedup_key,
        context,
        carrier,
        a_kind,
        a_id,
        a_reason,
        a_obo,
        a_status,
        attempts,
        claimed_by,
        timer_kind,
        timer_id,
        task_id,
    ) = row[:19]
    command = FencedCommand(
        cid,
        wf,
        seq,
        kind,
        db.load_json(payload),
        db.load_json(target),
        dedup_key,
        db.load_json(context),
        db.load_json(carrier),
        actor_from_row(a_kind, a_id, a_reason, a_obo, a_status),
        attempts,
        claimed_by,
        timer_kind,
        timer_id,
        task_id,
    )
    end = 19 + INSTANCE_COLUMN_COUNT
    return Loaded(command, row_from_values(row[19:end]), bool(row[end]))


def persist(
    *,
    instance: InstanceRow,
    command_id: int,
    token: Any,
    status: str,
    current_step: str | None,
    state: Any,
    error_type: str | None,
    error_message: str | None,
    ended: bool,
    subject: Any,
    entries: Sequence[HistoryEntry],
    common: dict[str, Any],
    actor: dict[str, Any],
    new_version: int,
    legacy_baseline: bool,
    signal: bool = True,
    commit: bool = False,
    then: db.AfterCommit | None = None,
) -> bool:
    """Write the transition; True when written.

    When the instance or the command changed (a bug: the fence holds the
    command and the execution lock the instance) the statement fails itself
    with SQLSTATE 40001 (:data:`PERSIST_CONFLICT`), retried as transient.

    ``common`` holds the history columns every entry carries
    (:data:`~vertique_workflow.store.history.SHARED_COLUMNS`, sent once); an
    entry's ``extra`` overrides them with a value of its own.

    ``actor`` attributes the entries that name no command with an actor (the
    segment command's); ``new_version`` is the state version the decision log
    reached (at least one past the version read). ``legacy_baseline``: the
    entries hold the one baseline of an instance from before 0003, consumed
    by the guard ``baseline_logged = FALSE`` in this same update, so two
    segments can never both log it. ``signal``: the command may be a SIGNAL,
    whose settlement lowers its instance's open-signal count (False only when
    its kind is known to be another).

    ``commit``: nothing follows the persist in its transaction, so the
    transaction's ``COMMIT`` goes in the persist's own pipeline, one wait
    less a segment, where :func:`db.owns_transaction` allows it (one
    outermost ``atomic`` block; inside another block, a test's or the
    caller's, the block commits as usual). ``then``: with ``commit``, a
    statement sent behind the ``COMMIT`` in the same wait, as a transaction
    of its own (the executor's next claim; ``db.AfterCommit``); not sent
    where the ``COMMIT`` cannot go with the persist.
    """
    unknown = common.keys() - SHARED_COLUMNS
    if unknown:
        raise ValueError(f"history columns the persist does not share: {sorted(unknown)}")
    rows = [entry_array(entry, index) for index, entry in enumerate(entries, start=1)]
    own = all(entry.extra.get("command_id") in (None, command_id) for entry in entries)
    if own:
        statement = OWN_PERSIST_SIGNAL if signal else OWN_PERSIST
    else:
        statement = PERSIST_SIGNAL if signal else PERSIST
    params = {
        **{f"shared_{column}": common.get(column) for column in SHARED_COLUMNS},
        **{f"fb_{column}": actor.get(column) for column in ACTOR_COLUMNS},
        "wf": instance.id,
        "version": instance.version,
        "new_version": max(new_version, instance.version + 1),
        "legacy_baseline": legacy_baseline,
        "status": status,
        "step": current_step,
        "state": json.dumps(state),
        "error_type": error_type,
        "error_message": error_message,
        "subject": None if subject is None else json.dumps(subject),
        "ended": ended,
        "entries": json.dumps(rows, default=str),
        "command": command_id,
        "token": token,
    }
    if commit:
        result = db.fetchone_prepared_then_commit(statement, params, then)
    else:
        result = db.fetchone_prepared(statement, params)
    return result is not None and result[0] == 1
