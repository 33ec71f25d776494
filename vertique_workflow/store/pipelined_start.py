"""A start outside any transaction: its admission and record sent as one pipeline.

``start()`` called outside a transaction owns the transaction it writes in.
Through Django's ``atomic`` that transaction waits on the server six times:
``BEGIN``, the key + selection read, the admission's shared id lock, the id's
rows, the record, ``COMMIT``. The statements after the read do not need each
other's results before they are sent, only before the commit, so here the
read runs on its own (an autocommit statement: nothing to commit), and then
``BEGIN``, the admission's two statements and the record go to the server in
one psycopg pipeline: one wait. PostgreSQL still runs them one after the
other as separate statements, so the rows statement's snapshot is taken after
the lock is granted, as the reference's admission requires. The admission
rule (:func:`definitions.check_admission`, the one :func:`admit_pin` applies)
then judges the rows before anything is committed: a refusal rolls the
transaction back, so the record it sent is never seen, and the refusal wins
over an error of the record, as when the record ran only after the rule. A
start is then three waits: the read, the pipeline, ``COMMIT``.

Taken only where it gives the transaction Django's ``atomic`` would: a
connection in autocommit, idle, whose transactions begin READ COMMITTED
(no isolation level, read-only or deferrable option asking for another
``BEGIN``). A session whose default isolation turns out to be stricter
(``default_transaction_isolation``, seen by the lock statement) raises
:class:`StricterIsolation` after rolling back, and the connection is not
offered the pipeline again: ``start()`` then runs in Django's ``atomic``,
where the rows are read ``FOR SHARE`` as the reference says for those
levels.
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
    return raw.info.transaction_status == _IDLE and _begin_statement(raw) is not None


def _begin_statement(raw: Any) -> str | None:
    """The ``BEGIN`` psycopg would send for Django's transaction, when it is READ COMMITTED's."""
    if raw.read_only or raw.deferrable:
        return None
    level = raw.isolation_level
    if level is None:
        return "BEGIN"
    if level == psycopg.IsolationLevel.READ_COMMITTED:
        return "BEGIN ISOLATION LEVEL READ COMMITTED"
    return None


def admit_and_record(
    scope_key: str,
    definition_id: str,
    version: int,
    plan_hash: str,
    record: Mapping[str, Any],
) -> bool:
    """Admit the pin and record the start (``instances.record_start_params``) in one transaction.

    True: recorded and committed. False: another transaction committed the
    same idempotency key first (nothing written: a replay). Raises what
    :func:`definitions.admit_pin` and :func:`instances.record_prepared_start` raise,
    the admission's errors first; nothing is committed then.
    """
    wrapper, raw, (begin, lock, rows, insert) = db.pipeline_cursors(4)
    begin_sql = _begin_statement(raw)
    try:
        try:
            with wrapper.wrap_database_errors, raw.pipeline():
                begin.execute(begin_sql, prepare=False)
                lock.execute(
                    definitions.ADMIT_LOCK_SHARED,
                    [definitions.admission_lock_timeout(), definition_id],
                    prepare=lock.prepare,
                )
                rows.execute(definitions.PIN_ROWS, [definition_id], prepare=rows.prepare)
                insert.execute(instances.RECORD_START, record, prepare=insert.prepare)
        except DatabaseError as exc:
            _rollback(raw)
            if not _has_rows(rows):  # the lock or the rows statement failed
                error = definitions.admission_error(exc, definition_id)
                if error is exc:
                    raise
                raise error from exc
            # the record failed after the admission ran: the rule's refusal comes first
            _judge(raw, lock, rows, scope_key, definition_id, version, plan_hash)
            raise
        try:
            _judge(raw, lock, rows, scope_key, definition_id, version, plan_hash)
        except BaseException:
            _rollback(raw)
            raise
        claimed = insert.fetchone() is not None
        with wrapper.wrap_database_errors:
            raw.commit()
        return claimed
    finally:
        if not raw.closed and raw.info.transaction_status != _IDLE:
            _rollback(raw)  # interrupted in between: never leave the transaction open


def _judge(
    raw: Any,
    lock: Any,
    rows: Any,
    scope_key: str,
    definition_id: str,
    version: int,
    plan_hash: str,
) -> None:
    """The admission rule over the pipelined rows; StricterIsolation outside READ COMMITTED."""
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
