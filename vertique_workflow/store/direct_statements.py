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

Several statements sent together (``start()``'s admission lock and record,
``signal()``'s lock and write) go as one libpq pipeline with one Sync
(:meth:`Statements.pipeline`): one wait, sent without the interpreter lock
(``pipeline_sync.py``) and read back while the thread waits in ``poll``
without it. psycopg's own pipeline context cost
a start more Python than the round trips it saved.

psycopg deallocates every prepared statement of the session (``DEALLOCATE
ALL``) when a transaction in which it holds prepared statements of its own
rolls back, and after ``DROP``, ``ALTER`` or ``DISCARD ALL``: ours go with
them. psycopg's prepare manager is watched for it before each statement (its
count of prepared names fell short of what it added since the last look),
and then this connection's names are forgotten and its statements prepared
again under new names. A ``DEALLOCATE ALL`` psycopg never saw (sent while it
held none of its own) fails the next statement with SQLSTATE 26000, which
forgets the names too, so only that one statement fails; its error is
marked (``DEALLOCATED``) and counted as transient (``db.is_retryable``). A psycopg without
that prepare manager runs every statement on the cursor (:func:`runnable`).
"""

from __future__ import annotations

import contextlib
import re
import select
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

from . import pipeline_sync

_IDLE = pq.TransactionStatus.IDLE
_PIPELINE_OFF = pq.PipelineStatus.OFF
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_PIPELINE_SYNC = pq.ExecStatus.PIPELINE_SYNC
_UNDEFINED_PREPARED_STATEMENT = "26000"

# set on the exception of a statement whose prepared name the session no longer had
DEALLOCATED = "_vertique_deallocated"

_HAS_POLL = hasattr(select, "poll")  # not on Windows: the cursor there

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
    if not _HAS_POLL or _manager_counts(raw) is None:
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

    def _bind(self, sql: str, params: Any) -> tuple[tuple[str, Any], bytes, Any, Any, Any]:
        """(cache key, query, dumped values, types, formats) of ``sql`` with ``params``."""
        tx = self.transformer
        if params:
            query, order = converted(sql)
            if order is not None:
                params = [params[name] for name in order]
            values = tx.dump_sequence(params, [PyFormat.AUTO] * len(params))
            return (sql, tx.types), query, values, tx.types, tx.formats
        # sent as written, as psycopg sends a statement without parameters
        return (sql, None), sql.encode(), None, None, None

    def _new_name(self) -> bytes:
        self.prepared += 1
        return b"_vwf_%d" % self.prepared

    def _opens_transaction(self) -> bool:
        """Whether psycopg would send ``BEGIN`` before the next statement."""
        return not self.raw.autocommit and self.pgconn.transaction_status == _IDLE

    def run(self, sql: str, params: Any) -> Any:
        """The result of ``sql`` with ``params`` (a sequence or a mapping); errors raised."""
        key, query, values, types, formats = self._bind(sql, params)
        self._forget_if_deallocated()
        name = self.names.get(key)
        pgconn = self.pgconn
        with self.raw.lock:
            if self._opens_transaction():
                self._check(pgconn.exec_(b"BEGIN"))
            if name is None:
                name = self._new_name()
                self._check(pgconn.prepare(name, query, param_types=types))
                self.names[key] = name
            return self._check(pgconn.exec_prepared(name, values, param_formats=formats))

    def pipeline(
        self,
        statements: Sequence[tuple[str, Any]],
        *,
        commit: bool = False,
        after: Sequence[tuple[str, Any]] = (),
    ) -> list[Any]:
        """The results of ``statements`` sent as one pipeline with one Sync: one wait.

        Outside a transaction the statements up to the Sync are one
        transaction, committed at it and rolled back by an error; where
        psycopg would open a transaction, ``BEGIN`` goes first. A statement
        after a failed one does not run (its result is PIPELINE_ABORTED).
        Errors are returned, not raised (:func:`first_error`), so the caller
        can tell which statement failed.

        ``commit``: ``COMMIT`` follows the statements, before the Sync, and
        its result is the last one. After a failed statement it does not run
        either, so the transaction is left failed for its owner to roll
        back; a ``COMMIT`` that fails (a deferred constraint) has ended the
        transaction, and :func:`first_error` gives its error.

        ``after``: statements sent behind the Sync, with a Sync of their own,
        in the same wait; their results follow (``COMMIT``'s, then theirs).
        With ``commit`` they run once the transaction has committed, as an
        implicit transaction of their own committed at their Sync; when the
        statements or the ``COMMIT`` failed, the transaction is left open
        and failed, and they fail without running (SQLSTATE 25P02).
        """
        bound = [self._bind(sql, params) for sql, params in statements]
        bound_after = [self._bind(sql, params) for sql, params in after]
        self._forget_if_deallocated()
        pgconn = self.pgconn
        preparing: list[tuple[tuple[str, Any], bytes]] = []  # (key, name) prepared here
        with self.raw.lock:
            opens = self._opens_transaction()
            pgconn.enter_pipeline_mode()
            try:
                if opens:
                    pgconn.send_query_params(b"BEGIN", None)
                self._send(bound, preparing)
                if commit:
                    pgconn.send_query_params(b"COMMIT", None)
                pipeline_sync.sync(pgconn)  # the send, without the interpreter lock
                if bound_after:
                    self._send(bound_after, preparing)
                    pipeline_sync.sync(pgconn)
                results = self._read_until_sync()
                if bound_after:
                    results += self._read_until_sync()
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # a broken connection: keep its error
                    pgconn.exit_pipeline_mode()
                raise
            pgconn.exit_pipeline_mode()
        if opens and results[0].status != _COMMAND_OK:
            for key, _ in preparing:
                self.names.pop(key, None)
            raise self.error(results[0])
        # the results in order: BEGIN, then each PREPARE before its statement
        in_order = iter(results[int(opens) :])
        pending = {key for key, _ in preparing}
        out = self._results_of(bound, pending, in_order)
        if commit:
            out.append(next(in_order))
        out.extend(self._results_of(bound_after, pending, in_order))
        return out  # a 26000 among them forgets our names when first_error raises it

    def _send(self, bound: list[Any], preparing: list[tuple[tuple[str, Any], bytes]]) -> None:
        """Queue the bound statements, each prepared first where this session lacks its name."""
        pgconn = self.pgconn
        for key, query, values, types, formats in bound:
            name = self.names.get(key)
            if name is None:
                name = self._new_name()
                pgconn.send_prepare(name, query, param_types=types)
                preparing.append((key, name))
                self.names[key] = name  # undone in _results_of unless its PREPARE succeeds
            pgconn.send_query_prepared(name, values, param_formats=formats)

    def _results_of(self, bound: list[Any], pending: set[Any], results: Any) -> list[Any]:
        """The results of ``bound`` taken from ``results``, each PREPARE's checked and skipped."""
        out = []
        for key, _, _, _, _ in bound:
            if key in pending:
                pending.discard(key)
                if next(results).status != _COMMAND_OK:
                    self.names.pop(key, None)
            out.append(next(results))
        return out

    def _read_until_sync(self) -> list[Any]:
        """Every result up to the pipeline's Sync, waiting on the socket without the GIL."""
        pgconn = self.pgconn
        while pgconn.flush():
            _wait(pgconn.socket, select.POLLOUT)
        results = []
        while True:
            if pgconn.is_busy():
                _wait(pgconn.socket, select.POLLIN)
                pgconn.consume_input()
                continue
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results
            if result.status == _PIPELINE_SYNC:
                return results
            results.append(result)

    def _forget_if_undefined(self, result: Any) -> bool:
        """Forget our names when ``result`` says one of them is gone (26000, ``_vwf_N``)."""
        if (
            result.status == _FATAL_ERROR
            and (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            == _UNDEFINED_PREPARED_STATEMENT
            and b"_vwf_" in (result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"")
        ):
            self.names.clear()
            return True
        return False

    def _check(self, result: Any) -> Any:
        status = result.status
        if status in (_TUPLES_OK, _COMMAND_OK):
            return result
        raise self.error(result)

    def error(self, result: Any) -> Exception:
        """psycopg's exception for a failed result.

        One of our prepared statements gone behind psycopg's back (26000) is
        marked ``DEALLOCATED``: the names are forgotten, so running the work
        again prepares them again (``db.is_retryable`` says so).
        """
        error = errors.error_from_result(result, encoding=self.raw.info.encoding)
        if self._forget_if_undefined(result):
            setattr(error, DEALLOCATED, True)
        return error

    def first_error(self, results: Sequence[Any]) -> Exception | None:
        """The exception of the first failed result of :meth:`pipeline`, if one failed."""
        for result in results:
            if result.status not in (_TUPLES_OK, _COMMAND_OK):
                if result.status == _FATAL_ERROR:
                    return self.error(result)
                return errors.OperationalError(f"unexpected result status {result.status}")
        return None

    def rows(self, result: Any) -> list[tuple[Any, ...]]:
        """The rows of a successful result."""
        tx = self.transformer
        tx.set_pgresult(result)
        return tx.load_rows(0, result.ntuples, tuple)  # type: ignore[no-any-return]

    def first_row(self, result: Any) -> tuple[Any, ...] | None:
        """The first row of a successful result; None when it has none."""
        if not result.ntuples:
            return None
        tx = self.transformer
        tx.set_pgresult(result)
        return tx.load_row(0, tuple)  # type: ignore[no-any-return]

    def fetchone(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        return self.first_row(self.run(sql, params))

    def fetchall(self, sql: str, params: Any) -> list[tuple[Any, ...]]:
        return self.rows(self.run(sql, params))

    def execute(self, sql: str, params: Any) -> int:
        result = self.run(sql, params)
        count = result.command_tuples
        return -1 if count is None else int(count)


def _wait(fileno: int, event: int) -> None:
    """Block until the socket is readable (POLLIN) or writable (POLLOUT), without the GIL.

    ``poll``, not ``select``: a process with more than 1,024 open files (a busy
    web server) has sockets ``select`` cannot watch.
    """
    poller = select.poll()
    poller.register(fileno, event | select.POLLERR | select.POLLHUP)
    poller.poll()


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
