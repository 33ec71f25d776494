"""A signal's recording in few round trips: one read, then the lock and one write together.

``signal()`` reads its dedup key, the instance and the declared signal names
of the instance's pinned registry row; judges (replay, unknown instance,
undeclared name or payload, ended instance); then takes the instance's
execution lock and writes the open-signal count, the queue position, the
dedup key and the SIGNAL command. Statement by statement that was seven
waits on the server inside the transaction. Here the three reads are one
statement (:data:`READ`), and the lock and the three writes are two
statements sent together in one pipeline (:func:`lock_and_write`, :func:`db.send_pipeline`):
the lock statement runs first, so every write happens under it, as the
reference's lock order requires (instances before command queues).

The write (:data:`WRITE`) allocates the queue position and raises the
open-signal count in one upsert, refused at the cap; claims the dedup key
only when the count was raised; inserts the command only when the key was
claimed. A refusal at the cap therefore writes nothing. A lost key race
(another transaction committed the same key first) leaves the count and
position raised in this transaction: the caller rolls the transaction (or
its savepoint) back, as before, and answers with the replay.

In the caller's transaction the pipeline opens a savepoint of its own first
(:data:`SAVEPOINT`), so the caller's transaction stays usable after an
error or a refusal: :func:`release` or :func:`roll_back` ends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from . import db, dedup, instances
from .commands import LOCK_INSTANCE, insert_command_from
from .instances import InstanceRow

T = db.T

# the key's row, the instance and its pinned registry row's declared signal names,
# in one statement: one row always (the VALUES row), the missing parts NULL
READ = f"""
SELECT earlier.workflow_id, earlier.fingerprint, earlier.result_json,
       {instances.columns_of("i")},
       d.definition_id IS NOT NULL, d.signal_names_json::text
FROM (VALUES (1)) AS one (x)
LEFT JOIN ({dedup.FIND}) AS earlier ON true
LEFT JOIN {T["instances"]} i ON i.id = %s
LEFT JOIN {T["definitions"]} d
       ON d.scope_key = i.definition_scope_key AND d.definition_id = i.definition_id
      AND d.definition_version = i.definition_version
"""

# Counts one more open signal and takes the next queue position in one upsert
# (refused at the cap: no row), claims the key only then, inserts the command only
# when the key was claimed. (raised, claimed, command id, seq).
WRITE = f"""
WITH q AS (
    INSERT INTO {T["command_queues"]} AS cq (workflow_id, next_seq, open_signals)
    VALUES (%(wf)s, 2, 1)
    ON CONFLICT (workflow_id) DO UPDATE
    SET open_signals = cq.open_signals + 1, next_seq = cq.next_seq + 1
    WHERE cq.open_signals < %(cap)s
    RETURNING next_seq - 1 AS seq
), claimed AS (
    INSERT INTO {T["dedup"]} (kind, scope_key, dedup_namespace, key, workflow_id, fingerprint,
                              result_json)
    SELECT 'SIGNAL', %(scope)s, %(namespace)s, %(dedup_key)s, %(wf)s, %(fingerprint)s, NULL
    FROM q
    ON CONFLICT (kind, scope_key, dedup_namespace, key) DO NOTHING
    RETURNING workflow_id
), inserted AS (
{insert_command_from("q CROSS JOIN claimed")}
)
SELECT EXISTS (SELECT 1 FROM q), EXISTS (SELECT 1 FROM claimed),
       (SELECT id FROM inserted), (SELECT seq FROM inserted)
"""

SAVEPOINT = db.Savepoint("vertique_workflow_signal")


@dataclass(frozen=True)
class Read:
    """What :data:`READ` found: the key's row, the instance, its pin's declaration."""

    earlier: tuple[Any, str, Any] | None
    instance: InstanceRow | None
    declaration_found: bool
    declared: Any  # the row's signal_names_json, decoded (None: NULL or no row)


@dataclass(frozen=True)
class Written:
    """What :data:`WRITE` did: raised the count, claimed the key, inserted the command."""

    raised: bool
    claimed: bool
    command_id: int | None
    seq: int | None


def read(scope: str, namespace: str, dedup_key: str, workflow_id: Any) -> Read:
    """The key's row (``SIGNAL`` in ``scope``), the instance and its pin's declared names."""
    row = db.fetchone_prepared(READ, ("SIGNAL", scope, namespace, dedup_key, workflow_id))
    assert row is not None  # the VALUES row
    earlier = None if row[0] is None else (row[0], row[1], row[2])
    end = 3 + instances.COLUMN_COUNT
    values = row[3:end]
    instance = None if values[0] is None else instances.row_from_values(values)
    found, names = row[end], row[end + 1]
    declared = db.load_json(names) if names is not None else None
    return Read(earlier, instance, bool(found), declared)


def lock_and_write(params: dict[str, Any], *, lock_timeout_ms: int, savepoint: bool) -> Written:
    """The execution lock and :data:`WRITE`, in one pipeline (after a savepoint when asked).

    ``params`` are :data:`WRITE`'s. With ``savepoint`` (the caller's
    transaction), an error rolls back to the savepoint and releases it before
    it is raised; otherwise the caller's ``atomic`` rolls back. Either way the
    caller ends a savepoint it asked for with :func:`release` or
    :func:`roll_back` once it has judged the result.
    """
    queued: list[tuple[str, Any]] = [(SAVEPOINT.begin, ())] if savepoint else []
    queued.append((LOCK_INSTANCE, (f"{int(lock_timeout_ms)}ms", str(params["wf"]))))
    queued.append((WRITE, params))
    results: list[Any] = []
    try:
        db.send_pipeline(queued, results)
    except DatabaseError:
        if savepoint and results and SAVEPOINT.opened(results[0]):
            SAVEPOINT.undo()
        raise
    write = results[-1]
    raised, claimed, command_id, seq = write.fetchone()
    return Written(bool(raised), bool(claimed), command_id, seq)


def release() -> None:
    """Release the signal's savepoint: its writes become the caller's transaction's."""
    db.execute_prepared(SAVEPOINT.release)


def roll_back() -> None:
    """Undo the signal's writes and release its savepoint; the caller's transaction goes on."""
    SAVEPOINT.undo()
