"""The hot prepared statements run on psycopg's libpq layer (store/direct_statements.py)."""

from __future__ import annotations

import datetime
import decimal
import threading
import time
import uuid

import psycopg
import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction

from vertique_workflow.store import db, direct_statements

pytestmark = pytest.mark.django_db(transaction=True)

ROW = (
    "SELECT %(number)s::bigint, %(text)s::text, %(nothing)s::text, %(id)s::uuid, "
    "%(flag)s::boolean, %(at)s::timestamptz, %(doc)s::jsonb, %(amount)s::numeric, "
    "%(number)s::bigint + 1"
)
VALUES = {
    "number": 41,
    "text": "ünïcode ' quoted",
    "nothing": None,
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "flag": True,
    "at": datetime.datetime(2026, 12, 6, 15, 0, 1, 234567, tzinfo=datetime.UTC),
    "doc": '{"a": [1, 2]}',
    "amount": decimal.Decimal("12.50"),
}


def ours() -> list[str]:
    """The statements of the session prepared under our own names."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_vwf\\_%%'")
        return sorted(row[0] for row in cursor.fetchall())


def fresh_session() -> None:
    connection.close()
    connection.ensure_connection()


def test_a_direct_statement_reads_what_djangos_cursor_reads():
    fresh_session()
    direct = db.fetchone_prepared(ROW, VALUES)
    with connection.cursor() as cursor:
        cursor.execute(ROW, VALUES)
        assert direct == cursor.fetchone()
    assert direct[-1] == 42  # a name used twice is one parameter
    assert ours() == ["_vwf_1"]  # and it ran on the direct path, prepared under our name
    db.fetchone_prepared(ROW, VALUES)
    assert ours() == ["_vwf_1"]  # prepared once, reused


def test_positional_parameters_rows_and_counts():
    fresh_session()
    rows = db.fetchall_prepared(
        "SELECT g, %s::text FROM generate_series(1, %s) AS g ORDER BY g", ("x", 3)
    )
    assert rows == [(1, "x"), (2, "x"), (3, "x")]
    assert db.fetchall_prepared("SELECT 1 WHERE %s", (False,)) == []
    assert db.fetchone_prepared("SELECT 1 WHERE %s", (False,)) is None
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE direct_t (id int PRIMARY KEY, note text)")
    assert db.execute_prepared("INSERT INTO direct_t SELECT generate_series(1, %s), 'n'", (4,)) == 4
    assert db.execute_prepared("UPDATE direct_t SET note = %s WHERE id > %s", ("m", 1)) == 3
    assert len(ours()) == 4


def test_other_parameter_types_are_another_prepared_statement():
    """As psycopg keys its own: a NULL where a number was sends other parameter types."""
    fresh_session()
    sql = "SELECT %s::bigint IS NULL"
    assert db.fetchone_prepared(sql, (7,)) == (False,)
    assert db.fetchone_prepared(sql, (None,)) == (True,)
    assert db.fetchone_prepared(sql, (8,)) == (False,)
    assert len(ours()) == 2


def test_in_a_transaction_the_statements_share_it():
    fresh_session()
    outside = [db.fetchone_prepared("SELECT txid_current()")[0] for _ in range(2)]
    assert outside[0] != outside[1]  # autocommit: a transaction each
    with transaction.atomic():
        inside = [db.fetchone_prepared("SELECT txid_current()")[0] for _ in range(2)]
        with connection.cursor() as cursor:  # and Django's statements are in it too
            cursor.execute("SELECT txid_current()")
            assert cursor.fetchone()[0] == inside[0]
    assert inside[0] == inside[1]


def test_a_rolled_back_transaction_keeps_none_of_its_writes():
    fresh_session()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE direct_rollback (id int PRIMARY KEY)")
    try:
        with pytest.raises(IntegrityError) as raised, transaction.atomic():
            db.execute_prepared("INSERT INTO direct_rollback VALUES (%s)", (1,))
            db.execute_prepared("INSERT INTO direct_rollback VALUES (%s)", (1,))
        assert isinstance(raised.value.__cause__, psycopg.errors.UniqueViolation)
        assert db.fetchone_prepared("SELECT count(*) FROM direct_rollback") == (0,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE direct_rollback")


def test_a_rollback_that_deallocates_psycopgs_statements_prepares_ours_again():
    """psycopg sends DEALLOCATE ALL when a transaction rolls back while it holds statements."""
    fresh_session()
    assert db.fetchone_prepared("SELECT %s::int + 1", (1,)) == (2,)
    raw = connection.connection
    with psycopg.Cursor(raw) as cursor:  # server-side binding: psycopg prepares it for itself
        cursor.execute("SELECT %s::int", (1,), prepare=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        db.fetchone_prepared("SELECT %s::int + 1", (2,))
        raise RuntimeError("roll back")
    assert ours() == []  # psycopg deallocated ours with its own
    assert db.fetchone_prepared("SELECT %s::int + 1", (3,)) == (4,)
    assert ours() == ["_vwf_2"]  # prepared again, under a new name


def test_a_deallocation_psycopg_never_saw_fails_one_statement():
    fresh_session()
    assert db.fetchone_prepared("SELECT %s::int + 1", (1,)) == (2,)
    raw = connection.connection
    raw.pgconn.exec_(b"DEALLOCATE ALL")  # behind psycopg's back
    with pytest.raises(ProgrammingError) as raised:
        db.fetchone_prepared("SELECT %s::int + 1", (1,))
    assert raised.value.__cause__.sqlstate == "26000"
    assert db.is_retryable(raised.value)  # a segment that meets it restores its attempt
    assert db.fetchone_prepared("SELECT %s::int + 1", (5,)) == (6,)
    with pytest.raises(ProgrammingError) as other:  # any other 26000 is not ours to retry
        db.fetchone_prepared("DEALLOCATE no_such_statement")
    assert other.value.__cause__.sqlstate == "26000"
    assert not db.is_retryable(other.value)


def test_a_stricter_transaction_runs_on_the_cursor():
    """psycopg's cursor opens it at the isolation level set; the direct path would not."""
    fresh_session()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    try:
        with transaction.atomic():
            assert not direct_statements.runnable(raw)
            isolation = "SELECT current_setting('transaction_isolation')"
            assert db.fetchone_prepared(isolation) == ("serializable",)
            assert direct_statements.runnable(raw)  # in the open transaction: anything goes
        assert ours() == []
    finally:
        connection.close()


def test_no_direct_statement_inside_psycopgs_pipeline():
    fresh_session()
    raw = connection.connection
    assert direct_statements.runnable(raw)
    with raw.pipeline():
        assert not direct_statements.runnable(raw)


def test_the_placeholders_are_converted_once():
    sql = "SELECT %(a)s, %(b)s, %(a)s, '100%%'"
    assert direct_statements.converted(sql) == (b"SELECT $1, $2, $1, '100%'", ("a", "b"))
    assert direct_statements.converted(sql) is direct_statements.converted(sql)
    assert direct_statements.converted("SELECT %s, %s") == (b"SELECT $1, $2", None)
    with pytest.raises(ValueError, match="mixed"):
        direct_statements.converted("SELECT %s, %(a)s")
    with pytest.raises(ValueError, match="lone"):
        direct_statements.converted("SELECT '5%' || %s")


# -- pipelines: several statements, one Sync, one wait --------------------------------------


@pytest.fixture
def pipeline_table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE direct_pipe (id int PRIMARY KEY, note text)")
    yield
    connection.close()  # whatever state a test left the session in
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE direct_pipe")


INSERT_PIPE = "INSERT INTO direct_pipe VALUES (%(id)s, %(note)s) RETURNING id, note"


def committed_ids() -> list[int]:
    """The rows another session sees (what the pipeline committed)."""
    with psycopg.connect(**db.connect_kwargs(connection.settings_dict)) as other:
        return [row[0] for row in other.execute("SELECT id FROM direct_pipe ORDER BY id")]


def test_a_pipeline_outside_a_transaction_commits_at_its_sync(pipeline_table):
    results: list = []
    db.send_pipeline(
        [(INSERT_PIPE, {"id": 1, "note": "a"}), (INSERT_PIPE, {"id": 2, "note": None})], results
    )
    assert [r.fetchone() for r in results] == [(1, "a"), (2, None)]
    assert all(isinstance(r, db.PipelineResult) for r in results)  # the direct path ran it
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert committed_ids() == [1, 2]
    assert len([name for name in ours() if name.startswith("_vwf_")]) == 1  # one text, one name


def test_a_failed_statement_rolls_back_the_pipeline_and_is_raised(pipeline_table):
    results: list = []
    with pytest.raises(IntegrityError) as raised:
        db.send_pipeline(
            [
                (INSERT_PIPE, {"id": 5, "note": "kept?"}),
                (INSERT_PIPE, {"id": 5, "note": "duplicate"}),
                ("SELECT %s::int", (1,)),
            ],
            results,
        )
    assert isinstance(raised.value.__cause__, psycopg.errors.UniqueViolation)
    statuses = [r.pgresult.status for r in results]
    assert statuses == [
        psycopg.pq.ExecStatus.TUPLES_OK,
        psycopg.pq.ExecStatus.FATAL_ERROR,
        psycopg.pq.ExecStatus.PIPELINE_ABORTED,
    ]
    assert committed_ids() == []  # the first insert went with the implicit transaction
    assert db.fetchone_prepared("SELECT %s::int + 1", (1,)) == (2,)  # the session goes on


def test_in_a_transaction_the_pipeline_joins_it(pipeline_table):
    with pytest.raises(RuntimeError), transaction.atomic():
        results: list = []
        db.send_pipeline(
            [(INSERT_PIPE, {"id": 7, "note": "x"}), ("SELECT txid_current()", ())], results
        )
        assert db.fetchone_prepared("SELECT txid_current()") == results[1].fetchone()
        assert committed_ids() == []  # not committed at the Sync: the caller's transaction
        raise RuntimeError("roll back")
    assert committed_ids() == []


def test_a_pipeline_waits_without_the_interpreter_lock(pipeline_table):
    """A worker blocked in a pipeline lets the other threads run (as a psycopg wait does)."""
    key = 424242
    with psycopg.connect(**db.connect_kwargs(connection.settings_dict)) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        outcome: list = []

        def blocked() -> None:
            try:
                results: list = []
                db.send_pipeline([("SELECT pg_advisory_xact_lock(%s), 1", (key,))], results)
                outcome.append(results[0].fetchone())
            finally:
                connection.close()

        worker = threading.Thread(target=blocked)
        worker.start()
        # this thread polls the server while the worker waits: it could not, were the
        # worker holding the interpreter lock
        guard = time.monotonic() + 60
        while not holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]:
            assert time.monotonic() < guard, "the worker never queued on the lock"
            threading.Event().wait(0.01)
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        worker.join()
    assert outcome == [("", 1)]
