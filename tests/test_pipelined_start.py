"""A start outside a transaction sends its admission, record and commit as one pipeline.

``store.pipelined_start``: the shared id lock, the id's rows and the record
guarded by the admission rule in SQL, one transaction up to the pipeline's
Sync, in one round trip;
the client judges the rows with the same rule afterwards. These tests hold
what the pipeline must not change: the statements' order, the two spellings
of the rule agreeing, a refusal writing nothing and coming before the
record's own error, the connection left idle and usable, and a session whose
transactions are not READ COMMITTED getting the reference's FOR SHARE
admission in Django's transaction instead.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.test_registry_errors import Plan
from vertique_workflow import context, tables
from vertique_workflow import registry as registry_sync
from vertique_workflow.exceptions import DefinitionUnavailable, WorkflowConflict
from vertique_workflow.store import db, direct_statements, instances, pipelined_start
from vertique_workflow.store import definitions as registry

from .executor_process import wait_until
from .wire import client_trace, client_waits

pytestmark = pytest.mark.django_db(transaction=True)

T = tables.sql_names()


def record_for(
    definition_id: str,
    *,
    business_key: str | None = None,
    version: int = 1,
    plan_hash: str | None = None,
) -> dict[str, Any]:
    return instances.record_start_params(
        uuid.uuid4(),
        scope_key="default",
        definition_id=definition_id,
        idempotency_key=f"key-{uuid.uuid4().hex}",
        fingerprint="f",
        definition_version=version,
        plan_hash=plan_hash or f"hash-{definition_id}-{version}",
        definition_scope_key="default",
        business_key=business_key,
        subject=None,
        metadata={},
        payload={},
        context=None,
        actor=context.stored_actor(None),
    )


def idle_and_usable() -> bool:
    raw = connection.connection
    if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


@pytest.fixture
def registered() -> str:
    definition_id = f"flow-{uuid.uuid4().hex[:8]}"
    registry.upsert_code(Plan(definition_id))
    return definition_id


def test_an_admitted_start_is_recorded_and_committed(registered):
    assert pipelined_start.available()
    record = record_for(registered)
    assert pipelined_start.admit_and_record(record)
    assert idle_and_usable()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM {T['instances']} WHERE id = %s", [record["wf"]])
        assert cursor.fetchone() == ("PENDING",)


@pytest.mark.parametrize(
    "record_sql",
    [
        instances.RECORD_START,
        pipelined_start.RECORD_ADMITTED_START,
        pipelined_start.RECORD_REMEMBERED_START,
    ],
    ids=["record", "admitted", "remembered"],
)
def test_the_records_generic_plan_sets_up_no_subquery_scan(record_sql):
    """The START command's clock comes from the queue row's RETURNING, so PostgreSQL pulls
    the SELECT up into the insert: no subquery scan set up on every execution."""
    query, order = direct_statements.converted(record_sql)
    assert order is not None
    # SET LOCAL and one named statement: the connection's own session setting and
    # prepared statements (store.db, store.direct_statements) are left as they were
    with connection.cursor() as cursor:
        prepared = False
        try:
            with transaction.atomic():
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                cursor.execute(f"PREPARE record_plan AS {query.decode()}")
                prepared = True
                nulls = ", ".join(["NULL"] * len(order))
                cursor.execute(f"EXPLAIN (COSTS OFF) EXECUTE record_plan ({nulls})")
                plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            if prepared:
                cursor.execute("DEALLOCATE record_plan")
    assert plan.count("Insert on") == 4, plan  # key, instance, queue row, command
    assert "Subquery Scan" not in plan, plan


def test_the_start_commands_clock_is_read_when_it_is_recorded(registered):
    """recorded_at is read while the record runs: not before its statement began (the
    instance's created_at), not after now, not before the transaction's start (available_at)."""
    record = record_for(registered)
    assert pipelined_start.admit_and_record(record)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.recorded_at >= i.created_at, c.recorded_at <= clock_timestamp(), "
            f"c.available_at <= c.recorded_at FROM {T['commands']} c "
            f"JOIN {T['instances']} i ON i.id = c.workflow_id WHERE c.workflow_id = %s",
            [record["wf"]],
        )
        assert cursor.fetchone() == (True, True, True)


@pytest.mark.parametrize(
    ("version", "plan_hash", "reason"),
    [(1, "another-hash", "drift"), (2, None, "the registry has no such version")],
)
def test_a_refused_admission_rolls_the_sent_record_back(registered, version, plan_hash, reason):
    record = record_for(registered, version=version, plan_hash=plan_hash)
    before = table_counts()
    with pytest.raises(DefinitionUnavailable, match=f"INVALID_TRANSITION.*{reason}"):
        pipelined_start.admit_and_record(record)
    assert table_counts() == before
    assert idle_and_usable()


def test_a_refusal_comes_before_the_records_own_error(registered):
    """As when the record ran only after the rule: the business-key conflict is not seen."""
    first = record_for(registered, business_key="taken")
    assert pipelined_start.admit_and_record(first)
    clash = record_for(registered, business_key="taken")
    drifted = {**clash, "plan_hash": "another-hash"}
    before = table_counts()
    with pytest.raises(DefinitionUnavailable, match="drift"):
        pipelined_start.admit_and_record(drifted)
    # admitted, the same record is the unique violation, rolled back as well
    with pytest.raises(IntegrityError) as failed:
        pipelined_start.admit_and_record(clash)
    assert db.sqlstate(failed.value) == "23505"
    assert table_counts() == before
    assert idle_and_usable()


def test_a_business_key_conflict_of_a_start_is_the_conflict_and_writes_nothing():
    wf.start("order", {"amount": 1}, idempotency_key="bk-1", business_key="same")
    before = table_counts()
    with pytest.raises(WorkflowConflict, match="business key already used"):
        wf.start("order", {"amount": 1}, idempotency_key="bk-2", business_key="same")
    assert table_counts() == before
    assert idle_and_usable()


@pytest.fixture
def repeatable_read_session() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_isolation = 'repeatable read'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_isolation")
        if hasattr(connection.connection, "_vertique_stricter_isolation"):
            del connection.connection._vertique_stricter_isolation


def test_a_session_defaulting_to_repeatable_read_starts_in_djangos_transaction(
    repeatable_read_session,
):
    """The pipeline's rows are not read FOR SHARE: at that level the start falls back."""
    with pytest.raises(DefinitionUnavailable, match="REPEATABLE READ transaction"):
        # no registry row of "order" yet: refused at that level (the reference), not admitted
        wf.start("order", {"amount": 1}, idempotency_key="rr-unregistered")
    registry_sync.sync_code_definitions()
    wf.start("order", {"amount": 1}, idempotency_key="rr-warm")
    assert not pipelined_start.available()  # learnt once per connection
    started = []
    waits = client_waits(
        lambda: started.append(wf.start("order", {"amount": 1}, idempotency_key="rr"))
    )
    assert waits == ['Query "BEGIN"', "Sync", "Sync", "Sync", "Sync", 'Query "COMMIT"'], waits
    assert started[0].created and wf.get(started[0].id).status == "PENDING"


def test_a_session_defaulting_to_repeatable_read_is_told_apart_by_the_lock_statement(
    registered, repeatable_read_session
):
    before = table_counts()
    with pytest.raises(pipelined_start.StricterIsolation):
        pipelined_start.admit_and_record(record_for(registered))
    assert table_counts() == before
    assert idle_and_usable()


@pytest.mark.parametrize(
    ("level", "read_only", "offered"),
    [
        (None, None, True),
        (psycopg.IsolationLevel.READ_COMMITTED, None, True),
        (psycopg.IsolationLevel.REPEATABLE_READ, None, False),
        (psycopg.IsolationLevel.SERIALIZABLE, None, False),
        (None, True, False),
    ],
)
def test_only_a_plain_read_committed_connection_is_offered_the_pipeline(level, read_only, offered):
    connection.ensure_connection()
    raw = connection.connection
    saved = raw.isolation_level, raw.read_only
    # what Django's OPTIONS "isolation_level" (and a read-only option) set
    raw.isolation_level, raw.read_only = level, read_only
    try:
        assert pipelined_start.available() is offered
    finally:
        raw.isolation_level, raw.read_only = saved


def test_a_pipelines_statements_are_one_transaction_holding_the_lock_to_the_sync():
    """What the module relies on: no Sync between the statements, so no commit in between."""
    connection.ensure_connection()
    raw = connection.connection
    first, second = raw.cursor(), raw.cursor()
    with raw.pipeline():
        first.execute(registry.ADMIT_LOCK_SHARED, ["1000ms", "some-id"])
        second.execute(
            "SELECT count(*) FROM pg_locks "
            "WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted"
        )
    assert second.fetchone() == (1,)  # still held by the next statement
    assert raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed at Sync
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        )
        assert cursor.fetchone() == (0,)


def test_a_start_in_a_transaction_is_not_offered_the_pipeline():
    from django.db import transaction

    with transaction.atomic():
        assert not pipelined_start.available()


def test_the_pipeline_sends_lock_rows_and_record_in_that_order_and_no_begin_or_commit():
    connection.close()  # a new session: every statement is parsed, with its text, in the trace
    trace = client_trace(lambda: wf.start("order", {"amount": 1}, idempotency_key="order"))
    *_, read_sync, pipeline_sync = [m.start() for m in re.finditer(r"^F\t\d+\tSync", trace, re.M)]
    pipeline = trace[read_sync:pipeline_sync]
    marks = [
        "pg_advisory_xact_lock_shared",
        "SELECT scope_key, definition_version, status, plan_hash",
        f"INSERT INTO {T['dedup']}",
    ]
    assert "BEGIN" not in pipeline and "COMMIT" not in pipeline, pipeline
    at = [pipeline.find(mark) for mark in marks]
    assert -1 not in at and at == sorted(at), (at, pipeline)


STATUSES = ("AVAILABLE", "DEPRECATED", "RETIRED", "CANDIDATE")

# the id's rows: (version, status, hash matches the pin's) per version present
ROWS = st.dictionaries(
    st.integers(1, 3), st.tuples(st.sampled_from(STATUSES), st.booleans()), max_size=3
)


@pytest.fixture
def template(registered: str) -> Iterator[str]:
    """A copy of the registered row, for the examples to insert in its place."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE template AS "
            f"SELECT * FROM {T['definitions']} WHERE definition_id = %s",
            [registered],
        )
    yield registered
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE template")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS, pin_version=st.integers(1, 3), pin_scope=st.sampled_from(["default", "eu"]))
def test_the_records_guard_and_the_admission_rule_agree(template, rows, pin_version, pin_scope):
    """``ADMITTED_AT_READ_COMMITTED`` admits exactly the pins ``check_admission`` admits."""
    definition_id, pin_hash = template, "pin-hash"
    with connection.cursor() as cursor:
        for table in ("definition_activations", "definitions"):
            cursor.execute(f"DELETE FROM {T[table]} WHERE definition_id = %s", [definition_id])
        for version, (status, matches) in rows.items():
            cursor.execute(
                "UPDATE template SET definition_version = %s, status = %s, plan_hash = %s",
                [version, status, pin_hash if matches else "another-hash"],
            )
            cursor.execute(f"INSERT INTO {T['definitions']} SELECT * FROM template")
        cursor.execute(
            f"SELECT {registry.ADMITTED_AT_READ_COMMITTED}",
            {
                "definition": definition_id,
                "definition_scope": pin_scope,
                "version": pin_version,
                "plan_hash": pin_hash,
            },
        )
        (guard,) = cursor.fetchone()
        cursor.execute(registry.PIN_ROWS, [definition_id])
        read = cursor.fetchall()
    try:
        registry.check_admission(
            read, "read committed", pin_scope, definition_id, pin_version, pin_hash
        )
        rule = True
    except DefinitionUnavailable:
        rule = False
    assert guard is rule, (rows, pin_scope, pin_version)


def test_the_records_guard_admits_nothing_outside_read_committed(registered):
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(
            f"SELECT {registry.ADMITTED_AT_READ_COMMITTED}",
            {
                "definition": registered,
                "definition_scope": "default",
                "version": 1,
                "plan_hash": f"hash-{registered}-1",
            },
        )
        assert cursor.fetchone() == (False,)


def test_a_version_deprecated_while_the_start_waits_for_the_lock_is_refused(holder):
    """The reference's fence: the rows are read after the lock, so the pipeline sees the change.

    The selection read (before the pipeline) still saw the version AVAILABLE;
    the deprecation, holding the exclusive id lock, commits while the
    pipelined start waits for the shared one.
    """
    registry_sync.sync_code_definitions()
    outcome = start_racing_a_deprecation(holder, "raced")
    error = outcome.get("error")
    assert isinstance(error, DefinitionUnavailable), outcome
    assert "the version is DEPRECATED" in str(error)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {T['dedup']} WHERE key = 'raced'")
        assert cursor.fetchone() == (0,)


def start_racing_a_deprecation(holder: psycopg.Connection, key: str) -> dict[str, Any]:
    """Start "order" in a thread while ``holder`` deprecates its version 1 under the id lock.

    The deprecation commits once the start waits for the shared lock; the
    start's ``ref`` or ``error``.
    """
    from django.db import connections

    holder.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('vertique_workflow.definition:' || %s, 0))",
        ["order"],
    )
    holder.execute(
        f"UPDATE {T['definitions']} SET status = 'DEPRECATED' "
        "WHERE scope_key = 'default' AND definition_id = 'order' AND definition_version = 1"
    )
    outcome: dict[str, Any] = {}

    def start() -> None:
        try:
            outcome["ref"] = wf.start("order", {"amount": 1}, idempotency_key=key)
        except Exception as exc:  # the caller's assertion names it
            outcome["error"] = exc
        finally:
            connections.close_all()

    racing = threading.Thread(target=start)
    racing.start()
    wait_until(lambda: lock_waiters() >= 1, what="the start queued on the id lock")
    holder.commit()
    racing.join(60)
    assert not racing.is_alive()
    return outcome


def lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone()[0]
