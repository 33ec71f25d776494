"""A start judged on a remembered selection: one wait, never stale.

``store.pipelined_start``: after a first start of an id has read its
selection (and the digest of its rows), a later start judges on what it
remembered and sends only the admission lock and a record guarded by the
admission rule and by the digest of the selection as read under that lock.
In the caller's transaction the same pipeline
writes under a savepoint of its own and commits nothing. These tests hold
what that must not change: a start is recorded exactly as
a fresh read would record it (version, payload schema, refusal), a replay is
still a replay, a registry change committed while the start waits for the
lock is seen, and nothing is written when the remembered judgement is stale.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.test_registry_errors import LOCK_KEY, Plan, short_lock_timeout
from vertique_workflow import registry as registry_sync
from vertique_workflow import tables
from vertique_workflow.exceptions import (
    DefinitionUnavailable,
    WorkflowConflict,
    WorkflowPersistenceError,
    WorkflowValidationError,
)
from vertique_workflow.store import definitions as registry
from vertique_workflow.store import pipelined_start

from .test_pipelined_start import start_racing_a_deprecation
from .wire import client_trace, client_waits

pytestmark = pytest.mark.django_db(transaction=True)

T = tables.sql_names()


@pytest.fixture
def registered() -> str:
    """An id with one registry row and no plan on this node: starts validate with the row."""
    definition_id = f"flow-{uuid.uuid4().hex[:8]}"
    registry.upsert_code(Plan(definition_id))
    return definition_id


def remembered_digest(definition_id: str) -> str | None:
    remembered = pipelined_start.remembered("default", definition_id)
    return None if remembered is None else remembered[1]


def sql(statement: str, params: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_a_later_start_of_an_id_waits_on_the_server_once():
    first = wf.start("order", {"amount": 1}, idempotency_key="first")
    assert remembered_digest("order") is not None
    started = []
    waits = client_waits(
        lambda: started.append(wf.start("order", {"amount": 1}, idempotency_key="next"))
    )
    assert waits == ["Sync"], waits
    (ref,) = started
    assert ref.created and ref.id != first.id
    assert (ref.definition_version, wf.get(ref.id).status) == (1, "PENDING")


def test_the_one_pipeline_is_the_lock_then_the_guarded_record_without_begin_or_commit():
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    connection.close()  # a new session: every statement is parsed, with its text, in the trace
    trace = client_trace(lambda: wf.start("order", {"amount": 1}, idempotency_key="traced"))
    assert len(re.findall(r"^F\t\d+\tSync", trace, re.M)) == 1, trace
    assert "BEGIN" not in trace and "COMMIT" not in trace, trace
    at = [
        trace.find(mark) for mark in ("pg_advisory_xact_lock_shared", f"INSERT INTO {T['dedup']}")
    ]
    assert -1 not in at and at == sorted(at), (at, trace)
    assert "selection_digest" not in trace  # sent as a parameter, compared in the statement
    assert "ctid::text || xmin::text" in trace[at[1] :]  # the guard reads the versions


def test_a_replay_through_a_remembered_selection_is_the_first_instance_and_writes_nothing():
    first = wf.start("order", {"amount": 2}, idempotency_key="same")
    before = table_counts()
    wf.start("order", {"amount": 2}, idempotency_key="same")  # prepares the replay's reads
    waits = client_waits(lambda: wf.start("order", {"amount": 2}, idempotency_key="same"))
    # the guarded record (nothing written: the key exists), the key + selection read,
    # the instance read
    assert waits == ["Sync", "Sync", "Sync"], waits
    again = wf.start("order", {"amount": 2}, idempotency_key="same")
    assert (again.id, again.created) == (first.id, False)
    assert table_counts() == before


def test_a_start_schema_changed_after_it_was_remembered_refuses_the_payload(registered):
    """The admission rule still admits the pin; only the digest sees the change."""
    wf.start(registered, {}, idempotency_key="remember")
    remembered = remembered_digest(registered)
    sql(
        f"UPDATE {T['definitions']} SET start_schema_json = %s::jsonb WHERE definition_id = %s",
        [json.dumps({"type": "object", "required": ["must"]}), registered],
    )
    before = table_counts()
    with pytest.raises(WorkflowValidationError, match="must"):
        wf.start(registered, {}, idempotency_key="stale")
    assert table_counts() == before
    # read afresh, and the new selection remembered
    assert remembered_digest(registered) not in (None, remembered)
    assert wf.start(registered, {"must": 1}, idempotency_key="fresh").created


def test_a_remembered_selection_that_refuses_is_judged_again_on_a_fresh_read(registered):
    sql(
        f"UPDATE {T['definitions']} SET start_schema_json = %s::jsonb WHERE definition_id = %s",
        [json.dumps({"type": "object", "required": ["must"]}), registered],
    )
    wf.start(registered, {"must": 1}, idempotency_key="remember")
    sql(
        f"UPDATE {T['definitions']} SET start_schema_json = NULL WHERE definition_id = %s",
        [registered],
    )
    ref = wf.start(registered, {}, idempotency_key="now-admitted")
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_a_version_registered_after_the_selection_was_remembered_is_the_one_started(registered):
    assert wf.start(registered, {}, idempotency_key="v1").definition_version == 1
    registry.upsert_code(Plan(registered, 2))
    fresh = registry.selection_read("default", registered)
    expected = registry.select_version(fresh, "default", None).version
    assert expected == 2  # what a fresh read selects
    ref = wf.start(registered, {}, idempotency_key="v2")
    assert (ref.created, ref.definition_version, wf.get(ref.id).definition_version) == (True, 2, 2)


@pytest.mark.parametrize(
    ("change", "changes_the_digest"),
    [
        ("UPDATE {definitions} SET status = 'DEPRECATED' WHERE definition_id = %(id)s", True),
        ("UPDATE {definitions} SET plan_hash = 'another' WHERE definition_id = %(id)s", True),
        (
            "UPDATE {definitions} SET signal_names_json = '{{\"paid\": null}}' "
            "WHERE definition_id = %(id)s",
            True,
        ),
        (
            "INSERT INTO {definitions} (scope_key, definition_id, definition_version, kind, "
            "status, contract_name, state_type_name, plan_hash, created_at, updated_at) "
            "SELECT scope_key, definition_id || 'z', definition_version, kind, status, "
            "contract_name, state_type_name, plan_hash, created_at, updated_at "
            "FROM {definitions} WHERE definition_id = %(id)s",
            False,
        ),
        (
            "UPDATE {definitions} SET updated_at = now() + interval '1 day' "
            "WHERE definition_id <> %(id)s",
            False,
        ),
        # a new version of a selected row, even of a column the selection does not read
        (
            "UPDATE {definitions} SET updated_at = now() + interval '1 day' "
            "WHERE definition_id = %(id)s",
            True,
        ),
        ("UPDATE {activations} SET activated_at = now() WHERE definition_id = %(id)s", True),
        # a change rolled back leaves the visible rows, and the digest, as they were
        (
            "BEGIN; UPDATE {definitions} SET status = 'RETIRED' WHERE definition_id = %(id)s; "
            "ROLLBACK",
            False,
        ),
        (
            "DELETE FROM {activations} WHERE definition_id = %(id)s",
            True,
        ),
    ],
)
def test_the_digest_follows_the_selected_rows_only(registered, change, changes_the_digest):
    """Every new version of a selected row changes the digest; other rows and rollbacks do not."""
    _, _, before = registry.start_read_with_digest("default", registered, "k")
    names = {"definitions": T["definitions"], "activations": T["definition_activations"]}
    sql(change.format(**names), {"id": registered})
    _, _, after = registry.start_read_with_digest("default", registered, "k")
    assert (after != before) is changes_the_digest


def test_an_activation_of_the_start_scope_changes_the_digest(registered):
    registry.upsert_code(Plan(registered, 2))
    _, _, before = registry.start_read_with_digest("eu", registered, "k")
    sql(
        f"INSERT INTO {T['definition_activations']} "
        "(scope_key, definition_id, target_scope_key, definition_version, activated_at) "
        "VALUES ('eu', %s, 'default', 1, now())",
        [registered],
    )
    _, _, after = registry.start_read_with_digest("eu", registered, "k")
    _, _, other_scope = registry.start_read_with_digest("us", registered, "k")
    assert after != before and other_scope == before


def test_a_version_deprecated_while_a_remembered_start_waits_for_the_lock_is_refused(holder):
    """The fence holds on this path too: the guard's reads run after the lock is granted."""
    registry_sync.sync_code_definitions()
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    assert remembered_digest("order") is not None
    outcome = start_racing_a_deprecation(holder, "raced")
    assert isinstance(outcome.get("error"), DefinitionUnavailable), outcome
    assert "DEPRECATED" in str(outcome["error"])
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {T['dedup']} WHERE key = 'raced'")
        assert cursor.fetchone() == (0,)


def test_a_remembered_start_in_a_repeatable_read_session_starts_in_djangos_transaction():
    registry_sync.sync_code_definitions()
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_isolation = 'repeatable read'")
    try:
        ref = wf.start("order", {"amount": 1}, idempotency_key="rr")
        assert not pipelined_start.available()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_isolation")
        del connection.connection._vertique_stricter_isolation
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_the_remembered_selections_are_bounded():
    for i in range(pipelined_start.REMEMBERED_LIMIT + 5):
        pipelined_start.remember("default", f"id-{i}", None, "d")  # type: ignore[arg-type]
    assert len(pipelined_start._remembered) <= pipelined_start.REMEMBERED_LIMIT


# --------------------------------------------------------------------------
# in the caller's transaction
# --------------------------------------------------------------------------


def test_a_remembered_start_in_the_callers_transaction_commits_and_rolls_back_with_it():
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    with transaction.atomic():
        kept = wf.start("order", {"amount": 1}, idempotency_key="kept")
    before = table_counts()
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = wf.start("order", {"amount": 1}, idempotency_key="lost")
        assert lost.created and wf.get(lost.id) is not None  # visible in the transaction
        raise RuntimeError("the caller's transaction fails")
    assert table_counts() == before
    assert wf.get(kept.id).status == "PENDING"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {T['instances']} WHERE id = %s", [lost.id])
        assert cursor.fetchone() == (0,)


def test_a_business_key_conflict_in_the_callers_transaction_leaves_it_usable():
    """The record's error is rolled back to the start's own savepoint, nothing else."""
    wf.start("order", {"amount": 1}, idempotency_key="bk-1", business_key="taken")
    before = table_counts()
    with transaction.atomic():
        mine = wf.start("order", {"amount": 2}, idempotency_key="mine")
        with pytest.raises(WorkflowConflict, match="business key already used"):
            wf.start("order", {"amount": 1}, idempotency_key="bk-2", business_key="taken")
        assert not connection.needs_rollback
        assert wf.get(mine.id).status == "PENDING"  # the caller's transaction goes on
    after = table_counts()
    assert after["instances"] == before["instances"] + 1
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {T['dedup']} WHERE key = 'bk-2'")
        assert cursor.fetchone() == (0,)


def test_a_replay_in_the_callers_transaction_is_the_first_instance():
    first = wf.start("order", {"amount": 3}, idempotency_key="same")
    with transaction.atomic():
        again = wf.start("order", {"amount": 3}, idempotency_key="same")
    assert (again.id, again.created) == (first.id, False)


def test_a_remembered_start_in_a_repeatable_read_transaction_reads_afresh():
    """The guard admits nothing outside READ COMMITTED; the fresh path reads FOR SHARE."""
    registry_sync.sync_code_definitions()
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        started = []
        waits = client_waits(
            lambda: started.append(wf.start("order", {"amount": 1}, idempotency_key="rr"))
        )
    # the guarded record (nothing written), then the fresh path in a Django savepoint
    assert waits[0] == "Sync" and any("SAVEPOINT" in w for w in waits[1:]), waits
    (ref,) = started
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_an_admission_timeout_of_a_remembered_start_in_the_callers_transaction_loses_it(holder):
    """As the reference's admission in the caller's transaction: the data-access error."""
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    holder.execute(LOCK_KEY, ["order"])
    before = table_counts()
    with short_lock_timeout(), transaction.atomic():
        with pytest.raises(OperationalError) as failed:
            wf.start("order", {"amount": 5}, idempotency_key="k-admission")
        assert failed.value.__cause__.sqlstate == "55P03"
        assert connection.needs_rollback  # run it again as a whole
    assert table_counts() == before


def test_an_admission_timeout_of_a_remembered_start_owning_its_transaction_names_the_id(holder):
    wf.start("order", {"amount": 1}, idempotency_key="remember")
    holder.execute(LOCK_KEY, ["order"])
    before = table_counts()
    with short_lock_timeout(), pytest.raises(WorkflowPersistenceError) as failed:
        wf.start("order", {"amount": 5}, idempotency_key="k-own")
    assert (failed.value.retryable, failed.value.definition_id) == (True, "order")
    assert table_counts() == before
    assert pipelined_start.available()  # the connection is idle and offered again
