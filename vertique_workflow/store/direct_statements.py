"""The hot prepared statements, run on psycopg's libpq layer instead of its cursor.

A psycopg cursor spends about 15 µs of Python on a prepared statement besides
the round trip itself: the query's conversion and cache lookups, the prepare
manager's bookkeeping, result and row-maker set-up, each on every execution.
The executor runs five such statements a segment. Here a statement is
converted to PostgreSQL's ``$n`` placeholders once per text, prepared once
per connection and parameter types under a name of its own (``_vwf_N``, never
one of psycopg's ``_pg3_N``), and run with ``PGconn.exec_prepared`` — libpq's
call, which releases the interpreter lock while it waits; the parameters
are dumped and the row loaded by the connection's own adapters (psycopg's
``Transformer``, in C with psycopg's binary package). Measured on one local
connection: 7 against 15 µs of CPU for ``SELECT $1::int + 1``.

Used only where it gives what the cursor would: a connection outside
psycopg's pipeline mode, and, when a transaction must be opened first, a
plain READ COMMITTED one (``BEGIN`` is then sent here, as psycopg would send
it before the cursor's first statement). Anything else takes the cursor
(:func:`runnable` is false). Errors are psycopg's own exceptions, raised
from the statement's result, so callers see what the cursor would raise.

psycopg deallocates every prepared statement of the session (``DEALLOCATE
ALL``) when a transaction in which it holds prepared statements of its own
rolls back, and after ``DROP``, ``ALTER`` or ``DISCARD ALL``: ours go with
them. psycopg's prepare manager is watched for it before each statement (its
count of prepared names fell short of what it added since the last look),
and then this connection's names are forgotten and its statements prepared
again under new names. A ``DEALLOCATE ALL`` psycopg never saw (sent while it
held none of its own) fails the next statement with SQLSTATE 26000, which
forgets the names too, so only that one statement fails. A psycopg without
that prepare manager runs every statement on the cursor (:func:`runnable`).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

_IDLE = pq.TransactionStatus.IDLE
_PIPELINE_OFF = pq.PipelineStatus.OFF
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_UNDEFINED_PREPARED_STATEMENT = "26000"

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%|%")


def plain_transaction(raw: Any) -> bool:
    """Whether a transaction psycopg opens on ``raw`` is a plain ``BEGIN`` at READ COMMITTED.

    No read-only or deferrable option, and no isolation level or READ
    COMMITTED (a stricter session default is the caller's to detect).
    """
    if raw.read_only or raw.deferrable:
        return False
    return raw.isolation_level in (None, psycopg.IsolationLevel.READ_COMMITTED)


def runnable(raw: Any) -> bool:
    """Whether a statement on ``raw`` may be run here rather than on a cursor."""
    if _manager_counts(raw) is None:
        return False
    pgconn = raw.pgconn
    if pgconn.pipeline_status != _PIPELINE_OFF:
        return False
    if raw.autocommit or pgconn.transaction_status != _IDLE:
        return True
    return plain_transaction(raw)


class Statements:
    """One connection's converted and prepared hot statements."""

    def __init__(self, raw: Any, context: Any) -> None:
        self.raw = raw
        self.pgconn = raw.pgconn
        # the adapters of ``context`` (the connection's reused cursor: its loaders)
        self.transformer = Transformer(context)
        self.names: dict[tuple[str, Any], bytes] = {}
        self.prepared = 0  # names ever given: a forgotten name is never reused
        self.seen = _manager_counts(raw)

    def _forget_if_deallocated(self) -> None:
        """Forget our names when psycopg may have deallocated every prepared statement."""
        seen = _manager_counts(self.raw)
        if seen != self.seen:
            if seen is None or self.seen is None or seen[1] < self.seen[1] + seen[0] - self.seen[0]:
                self.names.clear()
            self.seen = seen

    def run(self, sql: str, params: Any) -> Any:
        """The result of ``sql`` with ``params`` (a sequence or a mapping); errors raised."""
        tx = self.transformer
        if params:
            query, order = converted(sql)
            if order is not None:
                params = [params[name] for name in order]
            values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
            types, formats = tx.types, tx.formats
        else:  # sent as written, as psycopg sends a statement without parameters
            query, values, types, formats = sql.encode(), None, None, None
        self._forget_if_deallocated()
        key = (sql, types)
        name = self.names.get(key)
        pgconn = self.pgconn
        with self.raw.lock:
            if not self.raw.autocommit and pgconn.transaction_status == _IDLE:
                self._check(pgconn.exec_(b"BEGIN"))
            if name is None:
                self.prepared += 1
                name = b"_vwf_%d" % self.prepared
                self._check(pgconn.prepare(name, query, param_types=types))
                self.names[key] = name
            return self._check(pgconn.exec_prepared(name, values, param_formats=formats))

    def _check(self, result: Any) -> Any:
        status = result.status
        if status in (_TUPLES_OK, _COMMAND_OK):
            return result
        if (
            status == _FATAL_ERROR
            and (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            == _UNDEFINED_PREPARED_STATEMENT
        ):
            self.names.clear()
        raise errors.error_from_result(result, encoding=self.raw.info.encoding)

    def fetchone(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        result = self.run(sql, params)
        if not result.ntuples:
            return None
        tx = self.transformer
        tx.set_pgresult(result)
        return tx.load_row(0, tuple)  # type: ignore[no-any-return]

    def fetchall(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        result = self.run(sql, params)
        tx = self.transformer
        tx.set_pgresult(result)
        return tx.load_rows(0, result.ntuples, tuple)  # type: ignore[no-any-return]

    def execute(self, sql: str, params: Any) -> int:
        result = self.run(sql, params)
        count = result.command_tuples
        return -1 if count is None else int(count)


def _manager_counts(raw: Any) -> tuple[int, int] | None:
    """(names psycopg's prepare manager ever gave, names it holds now); None without one."""
    manager = getattr(raw, "_prepared", None)
    given = getattr(manager, "_prepared_idx", None)
    held = getattr(manager, "_names", None)
    if not isinstance(given, int) or held is None:
        return None
    return given, len(held)


_converted: dict[str, tuple[bytes, tuple[str, ...] | None]] = {}


def converted(sql: str) -> tuple[bytes, tuple[str, ...] | None]:
    """``sql`` with ``$n`` placeholders, and the parameter names in order (None: positional).

    ``%(name)s`` placeholders (a name used twice is one parameter) or ``%s``
    ones, not both; ``%%`` is a literal ``%``.
    """
    found = _converted.get(sql)
    if found is not None:
        return found
    names: list[str] = []
    positional = 0

    def placeholder(match: re.Match[str]) -> str:
        nonlocal positional
        text = match.group(0)
        if text == "%%":
            return "%"
        if text == "%":
            raise ValueError(f"a lone % in a prepared statement: {sql[:80]!r}")
        if text == "%s":
            positional += 1
            return f"${positional}"
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    query = _PLACEHOLDER.sub(placeholder, sql)
    if names and positional:
        raise ValueError(f"named and positional placeholders mixed: {sql[:80]!r}")
    found = (query.encode(), tuple(names) if names else None)
    _converted[sql] = found
    return found
