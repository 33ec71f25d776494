"""A start outside any transaction: its admission and record sent as one pipeline.

``start()`` called outside a transaction owns the transaction it writes in.
Through Django's ``atomic`` that transaction waits on the server six times:
``BEGIN``, the key + selection read, the admission's shared id lock, the id's
rows, the record, ``COMMIT``. None of the statements after the read needs
another's result before it is sent, so here the read runs on its own (an
autocommit statement: nothing to commit), and then the admission's two
statements and the record go to the server in one psycopg pipeline: a start
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
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import DatabaseError
from psycopg import pq

from . import db, definitions, instances

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
    return raw.info.transaction_status == _IDLE and _plain_transaction(raw)


def _plain_transaction(raw: Any) -> bool:
    """Whether Django's transaction on ``raw`` would be a plain ``BEGIN`` at READ COMMITTED.

    No read-only or deferrable option, and no isolation level or READ
    COMMITTED (a session default that is stricter is caught by the lock
    statement: :class:`StricterIsolation`).
    """
    if raw.read_only or raw.deferrable:
        return False
    return raw.isolation_level in (None, psycopg.IsolationLevel.READ_COMMITTED)


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
    wrapper, raw, (lock, rows, insert) = db.pipeline_cursors(3)
    try:
        # no BEGIN and no COMMIT: the statements up to the pipeline's one Sync
        # are one transaction, committed at the Sync (rolled back by an error)
        with wrapper.wrap_database_errors, raw.pipeline():
            lock.execute(
                definitions.ADMIT_LOCK_SHARED,
                [definitions.admission_lock_timeout(), record["definition"]],
                prepare=lock.prepare,
            )
            rows.execute(definitions.PIN_ROWS, [record["definition"]], prepare=rows.prepare)
            insert.execute(RECORD_ADMITTED_START, record, prepare=insert.prepare)
    except DatabaseError as exc:
        if _has_rows(rows):
            # the record failed: its guard had admitted the pin (a refused one
            # writes nothing, so it cannot fail on a conflict), so as is
            raise
        error = definitions.admission_error(exc, record["definition"])  # lock or rows failed
        if error is exc:
            raise
        raise error from exc
    finally:
        if not raw.closed and raw.info.transaction_status != _IDLE:
            _rollback(raw)  # interrupted in between: never leave the transaction open
    _judge(raw, lock, rows, *pin)
    return insert.fetchone() is not None


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
    _, isolation, _ = lock.fetchone()
    if isolation != READ_COMMITTED:
        # read without FOR SHARE: not the reference's admission at this level
        raw._vertique_stricter_isolation = True
        raise StricterIsolation(isolation)
    definitions.check_admission(
        rows.fetchall(), isolation, scope_key, definition_id, version, plan_hash
    )


def _has_rows(cursor: Any) -> bool:
    result = cursor.pgresult
    return result is not None and result.status == _TUPLES_OK


def _rollback(raw: Any) -> None:
    """Roll back what the pipeline began (psycopg's rollback also leaves an aborted pipeline)."""
    if raw.closed:
        return
    with contextlib.suppress(psycopg.Error):
        raw.rollback()
