"""Connection helpers shared by the store modules: cursor, rows, error mapping."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from ..conf import workflow_settings
from ..exceptions import WorkflowConflict, WorkflowPersistenceError
from ..tables import sql_names
from . import direct_statements

T = sql_names()

# serialization failure, deadlock, lock timeout, statement cancelled (deadline),
# session ended by transaction_timeout or by the deadline watchdog
RETRYABLE_SQLSTATES = ("40001", "40P01", "55P03", "57014", "25P04", "57P01")


_alias_override: str | None = None
_local = threading.local()


class DeadlinePassed(DatabaseError):
    """A statement refused because the running segment passed its deadline (retryable)."""

    sqlstate = "57014"


def set_deadline(expires: float | None) -> None:
    """Refuse this thread's prepared statements after ``expires`` (``time.monotonic()``)."""
    _local.deadline = expires


def check_deadline() -> None:
    expires = getattr(_local, "deadline", None)
    if expires is not None and time.monotonic() >= expires:
        raise DeadlinePassed("the segment passed SEGMENT_DEADLINE_MS")


def alias() -> str:
    """The database alias of the workflow tables (``DATABASE``, or the executor's --database)."""
    return _alias_override or workflow_settings.DATABASE


def use_alias(name: str | None) -> None:
    """Process-wide override of the alias (``workflow_executor --database``)."""
    global _alias_override
    _alias_override = name


def connection() -> Any:
    return connections[alias()]


@contextmanager
def cursor() -> Iterator[Any]:
    with connection().cursor() as cur:
        yield cur


def connect_kwargs(settings_dict: dict[str, Any]) -> dict[str, Any]:
    """psycopg.connect() arguments from a Django DATABASES entry."""
    params: dict[str, Any] = {
        "dbname": settings_dict.get("NAME") or "postgres",
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": settings_dict.get("PORT") or None,
    }
    options = dict(settings_dict.get("OPTIONS") or {})
    for key in (
        "pool",
        "isolation_level",
        "server_side_binding",
        "assume_role",
        "cursor_factory",
        "context",
        "prepare_threshold",
    ):
        options.pop(key, None)
    params.update(options)
    return {key: value for key, value in params.items() if value is not None}


@contextmanager
def separate_cursor() -> Iterator[Any]:
    """A cursor on a short-lived autocommit connection of its own, never the caller's.

    For plain reads that must not join a caller's open transaction (nor see
    its snapshot or its uncommitted rows): each statement is its own
    transaction and ``now()`` is the database clock at that statement. Errors
    surface as ``django.db`` errors, as from any cursor.
    """
    wrapper = connection()
    with (
        wrapper.wrap_database_errors,
        psycopg.connect(
            autocommit=True, connect_timeout=5, **connect_kwargs(wrapper.settings_dict)
        ) as conn,
        conn.cursor() as cur,
    ):
        yield cur


def fetchone(sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    with cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()


# A prepare_threshold no statement reaches by repetition: psycopg then prepares
# only what is executed with prepare=True (fetchone_prepared), never the rest.
ONLY_WHEN_ASKED = 2**31 - 1


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A server-side-binding cursor on the caller's connection (and transaction).

    Django's cursors bind on the client, so PostgreSQL parses and plans every
    statement again; the large claim and segment statements cost more to plan
    than to run. ``execute(sql, params)`` on this cursor asks PostgreSQL to
    prepare the statement once per connection and keep its plan
    (``PREPARED_STATEMENTS``; without it the statements run unprepared).
    For static statements only: every distinct text is a prepared statement.
    The cursor is made once per connection and reused (the hot path runs
    several statements a command; a fresh psycopg cursor each time costs more
    Python than the statement's own round trip on a local server).
    """
    wrapper, cursor = _ready_cursor()
    # Django's error wrapper: callers see django.db errors, as from any cursor
    with wrapper.wrap_database_errors:
        yield cursor


def _ready_cursor() -> tuple[Any, _PreparingCursor]:
    """(Django's connection wrapper, its reused preparing cursor), ready for a statement.

    The hot path's per-statement work, kept to attribute reads: the deadline,
    the connection (opened when Django has none yet), the cursor.
    """
    check_deadline()
    wrapper = connection()
    raw = wrapper.connection
    if raw is None or raw.closed:
        wrapper.ensure_connection()
        raw = wrapper.connection
    cursor = getattr(raw, "_vertique_cursor", None)
    prepare = bool(workflow_settings.PREPARED_STATEMENTS)
    if cursor is None or cursor.prepare is not prepare or cursor.closed:
        with wrapper.wrap_database_errors:
            cursor = _open_prepared_cursor(raw, prepare)
    elif _wants_generic_plans(raw, prepare):
        with wrapper.wrap_database_errors:
            _keep_plans_generic(raw)
    return wrapper, cursor


def _open_prepared_cursor(raw: Any, prepare: bool) -> Any:
    """The connection's reused cursor, after allowing preparation on it when asked."""
    if prepare and raw.prepare_threshold is None:
        # Django disables psycopg's preparation (prepare_threshold=None), and with it
        # every prepare=True: allow it again, for the statements that ask only.
        raw.prepare_threshold = ONLY_WHEN_ASKED
    if not hasattr(raw, "_vertique_generic_plans"):
        raw._vertique_generic_plans = False
    if _wants_generic_plans(raw, prepare):
        _keep_plans_generic(raw)
    cursor = _PreparingCursor(raw)
    cursor.prepare = prepare
    _load_timestamps_in_c(cursor, raw)
    raw._vertique_cursor = cursor
    return cursor


TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid


def _load_timestamps_in_c(cursor: Any, raw: Any) -> None:
    """psycopg's own ``timestamptz`` loader on the reused cursor, where it loads what Django's does.

    Django's loader (a subclass of psycopg's pure-Python one) parses every value
    in Python and then replaces its tzinfo with the connection's timezone: about
    6 µs a column, 23 µs of the segment's fence-and-load with its four instance
    timestamps. psycopg's default loader (C, with psycopg's binary package) gives
    the same datetime with the same tzinfo object, ``datetime.UTC``,
    when that timezone is UTC and so is the session's ``TimeZone`` (Django's
    ``USE_TZ`` with no database ``TIME_ZONE`` sets both). Any other setting
    keeps Django's loader on this cursor too.
    """
    text = psycopg.pq.Format.TEXT
    django_loader = raw.adapters.get_loader(TIMESTAMPTZ_OID, text)
    if getattr(django_loader, "timezone", None) is not datetime.UTC:
        return
    if raw.info.parameter_status("TimeZone") != "UTC":
        return
    cursor.adapters.register_loader(
        TIMESTAMPTZ_OID, psycopg.adapters.get_loader(TIMESTAMPTZ_OID, text)
    )


def _wants_generic_plans(raw: Any, prepare: bool) -> bool:
    """Only a connection whose threshold this module set gets the session setting."""
    return prepare and not raw._vertique_generic_plans and raw.prepare_threshold == ONLY_WHEN_ASKED


def _keep_plans_generic(raw: Any) -> None:
    """``plan_cache_mode = force_generic_plan`` for the session, once, outside a transaction.

    With real statistics PostgreSQL's plan cache switches the claim back to
    custom plans (its cost estimate of the generic plan is pessimistic) and
    plans it on every call: 1.2 ms of planning for 0.3 ms of execution. The
    only prepared statements of a connection whose threshold this module set
    are its own, so the session setting reaches no one else's. It is set only
    in autocommit (a SET inside a transaction that rolls back would be undone);
    a connection that never is idle keeps PostgreSQL's default choice
    (``_vertique_generic_plans`` stays False and it is tried again at the
    next statement).
    """
    if not raw.autocommit or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return
    raw.execute(KEEP_PLANS_GENERIC)
    raw._vertique_generic_plans = True


KEEP_PLANS_GENERIC = "SET plan_cache_mode = force_generic_plan"


class _PreparingCursor(psycopg.Cursor):  # type: ignore[type-arg]
    """A psycopg cursor whose ``execute`` prepares (or not, by the setting)."""

    prepare: bool = True
    _vertique_direct: direct_statements.Statements | None = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("prepare", self.prepare)
        return super().execute(query, params, **kwargs)


_execute = psycopg.Cursor.execute  # the hot helpers pass ``prepare`` themselves


def pipeline_cursors(count: int) -> tuple[Any, Any, list[Any]]:
    """(Django's wrapper, its psycopg connection, ``count`` reused preparing cursors).

    For statements sent together in one psycopg pipeline, where each needs a
    cursor of its own to hold its result. The first is the connection's
    reused cursor (:func:`prepared_cursor`'s); the others are made once per
    connection, like it.
    """
    wrapper, first = _ready_cursor()
    raw = wrapper.connection
    extra: list[Any] = getattr(raw, "_vertique_pipeline_cursors", [])
    if len(extra) < count - 1 or any(c.closed or c.prepare is not first.prepare for c in extra):
        extra = []
        for _ in range(count - 1):
            cursor = _PreparingCursor(raw)
            cursor.prepare = first.prepare
            _load_timestamps_in_c(cursor, raw)
            extra.append(cursor)
        raw._vertique_pipeline_cursors = extra
    return wrapper, raw, [first, *extra[: count - 1]]


class Savepoint:
    """A named savepoint a record-side pipeline opens in the caller's transaction.

    The statements are sent by the caller (``SAVEPOINT`` first in its
    pipeline, ``RELEASE`` last or after judging); :meth:`undo` rolls back to
    it and releases it, so the caller's transaction is as it was, after an
    error or a refusal. One fixed name per use: a savepoint of the same name
    the caller holds is only shadowed until this one is released.
    """

    def __init__(self, name: str) -> None:
        self.begin = f"SAVEPOINT {name}"
        self.release = f"RELEASE SAVEPOINT {name}"
        self.rollback_to = f"ROLLBACK TO SAVEPOINT {name}"

    @staticmethod
    def opened(cursor: Any) -> bool:
        """Whether the cursor's ``SAVEPOINT`` statement ran (its command completed)."""
        result = cursor.pgresult
        return result is not None and result.status == psycopg.pq.ExecStatus.COMMAND_OK

    def undo(self) -> None:
        """Roll back to the savepoint and release it (a broken connection: nothing to undo)."""
        wrapper = connection()
        raw = wrapper.connection
        if raw is None or raw.closed:
            return
        with wrapper.wrap_database_errors:
            raw.execute(self.rollback_to)
            raw.execute(self.release)


def fetchone_prepared(sql: str, params: Any = ()) -> tuple[Any, ...] | None:
    """``fetchone`` of a hot static statement, prepared once per connection."""
    wrapper, cur = _ready_cursor()
    with wrapper.wrap_database_errors:
        return _fetchone_on(cur, sql, params)


def _fetchone_on(cur: _PreparingCursor, sql: str, params: Any) -> tuple[Any, ...] | None:
    """``fetchone`` on the libpq layer where it may run, else on the reused cursor."""
    direct = _direct(cur)
    if direct is not None:
        return direct.fetchone(sql, params)
    _execute(cur, sql, params, prepare=cur.prepare)
    return cur.fetchone()


_IN_TRANSACTION = psycopg.pq.TransactionStatus.INTRANS


def owns_transaction() -> bool:
    """Whether the open transaction is one outermost ``atomic`` block's, which commits on exit.

    Only then may a statement carry the transaction's ``COMMIT``
    (:func:`fetchone_prepared_then_commit`): no enclosing block or savepoint
    (an outer block, a test's, must still be able to roll it back), no
    rollback asked for, no psycopg transaction context, and the connection
    in an open, healthy transaction on psycopg's libpq layer.
    """
    wrapper = connection()
    raw = wrapper.connection
    if raw is None or raw.closed:
        return False
    cursor = getattr(raw, "_vertique_cursor", None)
    return cursor is not None and _committing(wrapper, cursor) is not None


def _committing(wrapper: Any, cursor: _PreparingCursor) -> direct_statements.Statements | None:
    """The libpq-layer statements that may carry the ``COMMIT`` (see :func:`owns_transaction`)."""
    if not (
        wrapper.in_atomic_block
        and wrapper.commit_on_exit
        and len(wrapper.atomic_blocks) == 1
        and not wrapper.savepoint_ids
        and not wrapper.needs_rollback
        and not wrapper.closed_in_transaction
    ):
        return None
    raw = cursor.connection
    if getattr(raw, "_num_transactions", 1) or raw.pgconn.transaction_status != _IN_TRANSACTION:
        return None
    return _direct(cursor)


@dataclass
class AfterCommit:
    """A statement to run once the transaction has committed, in the ``COMMIT``'s own wait.

    Given to :func:`fetchone_prepared_then_commit`, which fills it in: ``sent``
    once it went with a ``COMMIT`` (it is sent at most once), ``row`` its
    first row when it ran, ``error`` the error it failed with (it does not
    run when the transaction failed). Not sent where the ``COMMIT`` cannot go
    in the statement's pipeline: ``sent`` stays false and the caller runs it
    itself, if it still wants to.
    """

    sql: str
    params: Any
    sent: bool = False
    row: tuple[Any, ...] | None = None
    error: Exception | None = None


def fetchone_prepared_then_commit(
    sql: str, params: Any = (), then: AfterCommit | None = None
) -> tuple[Any, ...] | None:
    """``fetchone`` of a hot static statement and the transaction's ``COMMIT``, one wait.

    For the last statement of a transaction: where :func:`owns_transaction`
    holds, the two go in one pipeline with one Sync, so the commit costs no
    wait of its own; anywhere else the statement runs as
    :func:`fetchone_prepared` runs it and the block commits as usual. A failed
    statement raises its error with ``COMMIT`` not run (the transaction is
    left failed for the block to roll back); a ``COMMIT`` that fails (a
    deferred constraint) raises its own, the transaction already ended.
    Django's block then finds the connection idle: its commit (or rollback)
    sends nothing, and its ``on_commit`` callbacks run as usual.

    ``then``: a statement sent behind the ``COMMIT``, in the same wait, as a
    transaction of its own (:class:`AfterCommit`); its outcome is left on it,
    never raised here.
    """
    wrapper, cur = _ready_cursor()
    with wrapper.wrap_database_errors:
        direct = _committing(wrapper, cur)
        if direct is None:
            return _fetchone_on(cur, sql, params)
        after = () if then is None or then.sent else ((then.sql, then.params),)
        pgresults = direct.pipeline([(sql, params)], commit=True, after=after)
        if after:
            assert then is not None
            then.sent = True
            then.error = direct.first_error(pgresults[2:])
            if then.error is None:
                then.row = direct.first_row(pgresults[2])
        error = direct.first_error(pgresults[:2])
        if error is not None:
            raise error
        if pgresults[1].command_status != b"COMMIT":  # a transaction that had failed before
            raise psycopg.errors.InFailedSqlTransaction("the transaction rolled back at COMMIT")
        return direct.first_row(pgresults[0])


def fetchall_prepared(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """``fetchall`` of a hot static statement, prepared once per connection."""
    wrapper, cur = _ready_cursor()
    with wrapper.wrap_database_errors:
        direct = _direct(cur)
        if direct is not None:
            return direct.fetchall(sql, params)
        _execute(cur, sql, params, prepare=cur.prepare)
        return cur.fetchall()


def execute_prepared(sql: str, params: Any = ()) -> int:
    """``execute`` of a hot static statement, prepared once per connection; its rowcount."""
    wrapper, cur = _ready_cursor()
    with wrapper.wrap_database_errors:
        direct = _direct(cur)
        if direct is not None:
            return direct.execute(sql, params)
        _execute(cur, sql, params, prepare=cur.prepare)
        return cur.rowcount


def _direct(cur: _PreparingCursor) -> direct_statements.Statements | None:
    """The connection's statements on psycopg's libpq layer, where they may run there.

    Only with ``PREPARED_STATEMENTS`` (unprepared statements stay on the
    cursor) and where :func:`direct_statements.runnable` holds.
    """
    if not cur.prepare or not direct_statements.runnable(cur.connection):
        return None
    statements = cur._vertique_direct
    if statements is None:
        statements = cur._vertique_direct = direct_statements.Statements(cur.connection, cur)
    return statements


def send_pipeline(queued: Sequence[tuple[str, Any]], results: list[Any]) -> None:
    """Send ``queued`` (statement, parameters) as one pipeline with one Sync: one wait.

    ``results`` receives one cursor-like object per statement, in order
    (``pgresult``, ``fetchone``, ``fetchall``), before the first error is
    raised (a ``django.db`` error), so the caller can tell from their
    ``pgresult`` which statements ran. Outside a transaction the statements
    are one transaction committed at the Sync; in the caller's transaction
    they join it. On psycopg's libpq layer where :func:`_direct` allows it
    (each statement prepared under our own name), else on the connection's
    reused cursors in a psycopg pipeline (:func:`pipeline_cursors`).
    """
    wrapper, cur = _ready_cursor()
    direct = _direct(cur)
    with wrapper.wrap_database_errors:
        if direct is not None:
            pgresults = direct.pipeline(queued)
            results[:] = [PipelineResult(direct, result) for result in pgresults]
            error = direct.first_error(pgresults)
            if error is not None:
                raise error
            return
        _, raw, cursors = pipeline_cursors(len(queued))
        results[:] = cursors
        with raw.pipeline():
            for cursor, (sql, params) in zip(cursors, queued, strict=True):
                cursor.execute(sql, params, prepare=cursor.prepare)


class PipelineResult:
    """A statement's result of a direct pipeline (:func:`send_pipeline`), read as from a cursor."""

    def __init__(self, statements: direct_statements.Statements, pgresult: Any) -> None:
        self.statements = statements
        self.pgresult = pgresult

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.statements.rows(self.pgresult)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.statements.first_row(self.pgresult)


def fetchall(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def fetchdicts(sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    with cursor() as cur:
        cur.execute(sql, params)
        names = [col.name for col in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def execute(sql: str, params: Sequence[Any] = ()) -> int:
    with cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def load_json(value: Any) -> Any:
    """A jsonb value read by raw SQL: Django's connection hands jsonb back as text."""
    if isinstance(value, (str, bytes, bytearray)):
        return json.loads(value)
    return value


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (Django wraps psycopg's error as __cause__)."""
    for candidate in (exc, exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def is_retryable(exc: BaseException) -> bool:
    if getattr(exc.__cause__, direct_statements.DEALLOCATED, False):
        return True  # our statement was deallocated behind psycopg's back: prepared again
    state = sqlstate(exc)
    if state is None:
        # a lost connection has no SQLSTATE of its own
        return isinstance(exc, DatabaseError) and "connection" in str(exc).lower()
    return state in RETRYABLE_SQLSTATES or state.startswith("08")


def translate(exc: DatabaseError, what: str) -> Exception:
    """The workflow exception for a database error (DESIGN section 9)."""
    state = sqlstate(exc)
    if state == "23505":
        return WorkflowConflict(f"{what}: a conflicting row already exists")
    return WorkflowPersistenceError(
        f"{what}: database error {state or 'unknown'}", retryable=is_retryable(exc)
    )
