"""A start outside any transaction: its admission and record sent as one pipeline.

``start()`` called outside a transaction owns the transaction it writes in.
Through Django's ``atomic`` that transaction waits on the server six times:
``BEGIN``, the key + selection read, the admission's shared id lock, the id's
rows, the record, ``COMMIT``. None of the statements after the read needs
another's result before it is sent, so here the read runs on its own (an
autocommit statement: nothing to commit), and then the admission's two
statements and the record go to the server in one pipeline (``db.send_pipeline``): a start
is two waits. The statements of a pipeline up to its Sync are one
transaction (PostgreSQL's extended query protocol: a Sync commits what no
``BEGIN`` opened, and an error rolls all of it back), so no ``BEGIN`` or
``COMMIT`` is sent; the shared id lock is held until that commit. PostgreSQL
runs the statements one after the other, so the rows statement's snapshot
is taken after the lock is granted, as the reference's admission requires.

The commit is sent before the client has judged the rows, so the record
judges them too: it writes its dedup key (and so anything) only under
``definitions.ADMITTED_AT_READ_COMMITTED``, the admission rule as a SQL
condition, evaluated under the same shared lock (a registry change of the
id waits for it, so the rows cannot change between the two statements). The
client then applies the rule itself (:func:`definitions.check_admission`,
the one :func:`admit_pin` applies) to the rows it received, for the refusal
and its message: a refused pin has written nothing, so its record cannot
fail on a conflict, and the refusal is what the caller sees.

Taken only where it gives the transaction Django's ``atomic`` would: a
connection in autocommit, idle, whose transactions are plain READ COMMITTED
ones (no read-only or deferrable option, no isolation level but READ
COMMITTED). A session whose default isolation turns out to be stricter
(``default_transaction_isolation``, seen by the lock statement, and by the
record's guard, which then writes nothing) raises :class:`StricterIsolation`,
and the connection is not offered the pipeline again: ``start()`` then runs
in Django's ``atomic``, where the rows are read ``FOR SHARE`` as the
reference says for those levels.

**A remembered selection: one wait.** The first start of an id (in a scope)
in a process reads its key and selection as above and remembers the
selection with the digest of its rows' versions (:func:`definitions.selection_digest`:
each row's ``ctid`` and ``xmin``, read by the server). A later start of the same id judges on the
remembered selection (version, start schema) and sends only the admission
lock and a record guarded by the admission rule *and* by the digest of the
selection as read under that lock (:func:`record_on_remembered`): one
pipeline, one wait, no key read. The record writes nothing when the key
exists already (a replay), when the rule refuses the pin, or when the
selection's rows have changed since they were remembered; the caller then
takes the path above, which reads and judges afresh. Equal digests mean
the same row versions, so what the remembered selection judged is what a fresh read
would have judged; the remembered rows are never trusted otherwise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import DatabaseError
from psycopg import pq

from . import db, definitions, direct_statements, instances

READ_COMMITTED = "read committed"

_IDLE = pq.TransactionStatus.IDLE
_TUPLES_OK = pq.ExecStatus.TUPLES_OK


class StricterIsolation(Exception):
    """The session's transactions are not READ COMMITTED: start in Django's ``atomic``."""


def available() -> bool:
    """Whether a start on the workflow connection may take the pipelined path."""
    wrapper = db.connection()
    if wrapper.in_atomic_block:
        return False
    wrapper.ensure_connection()
    if not wrapper.get_autocommit():
        return False
    raw = wrapper.connection
    if getattr(raw, "_vertique_stricter_isolation", False):
        return False
    return raw.info.transaction_status == _IDLE and direct_statements.plain_transaction(raw)


# RECORD_START, its dedup key written only for an admitted pin (a refused one: no row);
# the casts give the parameters the types VALUES would take from the columns
RECORD_ADMITTED_START = instances.RECORD_START.replace(
    """    VALUES ('START', %(scope)s, %(definition)s, %(key)s, %(wf)s, %(fingerprint)s,
            %(result)s::jsonb)
""",
    """    SELECT 'START', %(scope)s::varchar, %(definition)s::varchar, %(key)s::varchar, %(wf)s,
           %(fingerprint)s::varchar, %(result)s::jsonb
    WHERE """
    + definitions.ADMITTED_AT_READ_COMMITTED
    + "\n",
)
assert RECORD_ADMITTED_START != instances.RECORD_START


# RECORD_ADMITTED_START that also requires the selection's rows to be the remembered
# ones (the digest parameter): judged on what the caller remembered, written only
# when a fresh read under the admission lock would have judged the same
RECORD_REMEMBERED_START = RECORD_ADMITTED_START.replace(
    "    WHERE " + definitions.ADMITTED_AT_READ_COMMITTED + "\n",
    "    WHERE "
    + definitions.ADMITTED_AT_READ_COMMITTED
    + "\n      AND ("
    + definitions.selection_digest("%(definition)s", "%(scope)s")
    + ") = %(selection_digest)s\n",
)
assert RECORD_REMEMBERED_START != RECORD_ADMITTED_START

# (alias, start scope, definition id) -> (selection, digest): a few per id a process starts
REMEMBERED_LIMIT = 1024
_remembered: dict[tuple[str, str, str], tuple[definitions.SelectionResult, str]] = {}
_remembered_lock = threading.Lock()


def remember(
    scope: str, definition_id: str, selection: definitions.SelectionResult, digest: str
) -> None:
    """Keep a selection just read (and its rows' digest) for the next starts of the id."""
    key = (db.alias(), scope, definition_id)
    with _remembered_lock:
        if len(_remembered) >= REMEMBERED_LIMIT and key not in _remembered:
            _remembered.clear()  # more pairs than a process starts: start over
        _remembered[key] = (selection, digest)


def remembered(scope: str, definition_id: str) -> tuple[definitions.SelectionResult, str] | None:
    """(selection, digest) remembered for the id in the scope on this alias, or None."""
    return _remembered.get((db.alias(), scope, definition_id))


def forget(scope: str, definition_id: str) -> None:
    """Drop what is remembered of the id in the scope (its rows were found changed)."""
    with _remembered_lock:
        _remembered.pop((db.alias(), scope, definition_id), None)


def forget_all() -> None:
    """Drop every remembered selection (tests; nothing depends on it for correctness)."""
    with _remembered_lock:
        _remembered.clear()


def record_on_remembered(record: Mapping[str, Any], digest: str) -> bool:
    """Lock, then record only if the selection's rows still have ``digest``: one pipeline.

    ``record`` is :func:`instances.record_start_params`' for the pin judged on
    the remembered selection. True: recorded and committed. False: nothing
    written (the key exists, the admission rule refuses the pin, or the
    selection changed); take :func:`admit_and_record`'s path, which reads
    afresh. Raises :class:`StricterIsolation` as :func:`admit_and_record`, a
    lock timeout as the admission's error, the record's own errors as they are.
    """
    lock, _, insert, raw = _send(RECORD_REMEMBERED_START, {**record, "selection_digest": digest})
    _require_read_committed(raw, lock)
    return insert.fetchone() is not None


# A start in the caller's transaction writes under a savepoint of its own, so an
# error of the record (a business key taken) leaves the caller's transaction usable.
SAVEPOINT = db.Savepoint("vertique_workflow_start")


def record_on_remembered_in_transaction(record: Mapping[str, Any], digest: str) -> bool:
    """:func:`record_on_remembered` in the caller's open transaction: one pipeline.

    A savepoint, the shared id lock, the guarded record and the savepoint's
    release, sent together: nothing is committed (the caller commits), and
    the lock is held to the caller's end, as :func:`definitions.admit_pin`
    holds it. True: recorded. False: nothing written (the key exists, the
    pin is refused, the selection changed, or the transaction is not READ
    COMMITTED, where the reference reads the rows ``FOR SHARE``): read afresh.
    On an error the savepoint is rolled back and released, so the caller's
    transaction is as it was, and the error is raised as :func:`_send`
    raises it. A caller's ``atomic`` that has sent nothing yet gets its
    ``BEGIN`` from psycopg first.
    """
    params = {**record, "selection_digest": digest}
    lock, _, insert, _ = _send(RECORD_REMEMBERED_START, params, savepoint=SAVEPOINT)
    _, isolation, _ = lock.fetchone()
    return isolation == READ_COMMITTED and insert.fetchone() is not None


def admit_and_record(record: Mapping[str, Any]) -> bool:
    """Admit the record's pin, record the start and commit, in one pipeline.

    ``record`` is :func:`instances.record_start_params`' (its pin: the
    definition scope, id, version and plan hash). True: recorded and
    committed. False: another transaction committed the same idempotency key
    first (nothing written: a replay). Raises what
    :func:`definitions.admit_pin` and :func:`instances.record_prepared_start`
    raise, the admission's refusal first; nothing is written then.
    """
    pin = (record["definition_scope"], record["definition"], record["version"], record["plan_hash"])
    lock, rows, insert, raw = _send(RECORD_ADMITTED_START, record, with_rows=True)
    _judge(raw, lock, rows, *pin)
    return insert.fetchone() is not None


def _send(
    record_sql: str,
    params: Mapping[str, Any],
    *,
    with_rows: bool = False,
    savepoint: db.Savepoint | None = None,
) -> tuple[Any, ...]:
    """The shared id lock, the id's rows (``with_rows``) and the record, as one pipeline.

    (lock, rows or None, record, the psycopg connection), each cursor holding
    its statement's result. Without ``savepoint`` no BEGIN and no COMMIT:
    the statements up to the pipeline's one Sync are one transaction,
    committed at the Sync (rolled back by an error). With it (the caller's
    open transaction) they are wrapped in that savepoint and its release,
    nothing is committed, and an error rolls back to the savepoint and
    releases it. An error of the lock or the rows is the admission's
    (:func:`definitions.admission_error`); the record's is raised as it is
    (its guard had admitted the pin: a refused one writes nothing, so it
    cannot fail on a conflict).
    """
    queued: list[tuple[str, Any]] = [(savepoint.begin, ())] if savepoint is not None else []
    queued.append(
        (
            definitions.ADMIT_LOCK_SHARED,
            [definitions.admission_lock_timeout(), params["definition"]],
        )
    )
    if with_rows:
        queued.append((definitions.PIN_ROWS, [params["definition"]]))
    queued.append((record_sql, params))
    if savepoint is not None:
        queued.append((savepoint.release, ()))
    results: list[Any] = []
    try:
        db.send_pipeline(queued, results)
    except DatabaseError as exc:
        if not results:
            raise  # nothing was sent
        mark, lock, rows, _ = _named(results, savepoint, with_rows)
        if mark is not None and savepoint is not None and savepoint.opened(mark):
            savepoint.undo()
        if _has_rows(rows if rows is not None else lock):
            raise  # the record failed
        error = definitions.admission_error(exc, params["definition"])  # lock or rows failed
        if error is exc:
            raise
        raise error from exc
    finally:
        raw = db.connection().connection
        if (
            savepoint is None
            and raw is not None
            and not raw.closed
            and raw.info.transaction_status != _IDLE
        ):
            _rollback(raw)  # interrupted in between: never leave the transaction open
    _, lock, rows, insert = _named(results, savepoint, with_rows)
    return lock, rows, insert, raw


def _named(
    results: list[Any], savepoint: db.Savepoint | None, with_rows: bool
) -> tuple[Any, Any, Any, Any]:
    """(savepoint mark, lock, rows, record) of :func:`_send`'s results; None for a missing one."""
    taken = iter(results)
    mark = next(taken) if savepoint is not None else None
    lock = next(taken)
    rows = next(taken) if with_rows else None
    return mark, lock, rows, next(taken)


def _judge(
    raw: Any,
    lock: Any,
    rows: Any,
    scope_key: str,
    definition_id: str,
    version: int,
    plan_hash: str,
) -> None:
    """The admission rule over the pipelined rows; StricterIsolation outside READ COMMITTED.

    The record's guard judged the same rows the same way, so a refusal here
    has written nothing.
    """
    isolation = _require_read_committed(raw, lock)
    definitions.check_admission(
        rows.fetchall(), isolation, scope_key, definition_id, version, plan_hash
    )


def _require_read_committed(raw: Any, lock: Any) -> str:
    """The isolation the lock statement saw; StricterIsolation unless READ COMMITTED.

    The record's guard wrote nothing then; the connection is not offered the
    pipeline again.
    """
    _, isolation, _ = lock.fetchone()
    if isolation != READ_COMMITTED:
        # read without FOR SHARE: not the reference's admission at this level
        raw._vertique_stricter_isolation = True
        raise StricterIsolation(isolation)
    return str(isolation)


def _has_rows(cursor: Any) -> bool:
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


def _rollback(raw: Any) -> None:
    """Roll back what the pipeline began (psycopg's rollback also leaves an aborted pipeline)."""
    if raw.closed:
        return
    with contextlib.suppress(psycopg.Error):
        raw.rollback()
