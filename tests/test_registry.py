"""The definition registry: CODE rows, activations, selection, pin admission, lifecycle.

Everything runs against the real PostgreSQL of the suite. Tests that need
committed rows or real lock waits use ``transactional_db`` and their own
connections (worker threads, or a raw psycopg connection holding a lock).
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings

from vertique_workflow import registry, tables
from vertique_workflow.conf import workflow_settings
from vertique_workflow.exceptions import (
    ContractMismatch,
    WorkflowConflict,
    WorkflowDefinitionError,
    WorkflowNotFound,
    WorkflowPersistenceError,
    WorkflowValidationError,
)
from vertique_workflow.models import (
    WorkflowDefinition,
    WorkflowDefinitionActivation,
    WorkflowInstance,
)
from vertique_workflow.store import dedup
from vertique_workflow.store import definitions as store
from vertique_workflow.store.definitions import (
    Activation,
    DefinitionRow,
    SelectionResult,
    select_version,
)

from .wire import client_waits

T = tables.sql_names()
LOCK_KEY = "SELECT {}(hashtextextended('vertique_workflow.definition:' || %s, 0))"


@dataclass(frozen=True)
class FakePlan:
    """The attributes the registry reads of a plan, without the DSL."""

    id: str
    version: int
    contract: str = "thing.v1"
    state_type_name: str = "dict"
    structure: str = "a"
    signals: dict[str, Any] = field(default_factory=lambda: {"go": {"type": "object"}})
    start_schema: dict[str, Any] | None = field(default_factory=lambda: {"type": "object"})

    @property
    def plan_hash(self) -> str:
        text = f"{self.id}|{self.version}|{self.contract}|{self.state_type_name}|{self.structure}"
        return hashlib.sha256(text.encode()).hexdigest()


def new_id() -> str:
    return f"flow-{uuid.uuid4().hex[:8]}"


def row(definition_id: str, version: int, scope: str = "default") -> WorkflowDefinition:
    return WorkflowDefinition.objects.get(
        scope_key=scope, definition_id=definition_id, definition_version=version
    )


def rows(definition_id: str) -> list[tuple[str, int, str]]:
    return list(
        WorkflowDefinition.objects.filter(definition_id=definition_id)
        .order_by("scope_key", "definition_version")
        .values_list("scope_key", "definition_version", "status")
    )


def activation(definition_id: str, scope: str = "default") -> tuple[str, int] | None:
    return (
        WorkflowDefinitionActivation.objects.filter(scope_key=scope, definition_id=definition_id)
        .values_list("target_scope_key", "definition_version")
        .first()
    )


def row_versions(definition_id: str) -> list[str]:
    """xmin of every row of the id and of its activations: changes on any write."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT xmin::text FROM {T['definitions']} WHERE definition_id = %s "
            f"UNION ALL SELECT xmin::text FROM {T['definition_activations']} "
            "WHERE definition_id = %s",
            [definition_id, definition_id],
        )
        return sorted(value for (value,) in cursor.fetchall())


def document_row(
    definition_id: str,
    version: int,
    scope: str = "tenant",
    *,
    contract: str = "thing.v1",
    status: str = "AVAILABLE",
    plan_hash: str = "doc-hash",
    signals: dict[str, Any] | None = None,
) -> WorkflowDefinition:
    text = f"id: {definition_id}\nversion: {version}\n"
    return WorkflowDefinition.objects.create(
        scope_key=scope,
        definition_id=definition_id,
        definition_version=version,
        kind="DOCUMENT",
        status=status,
        contract_name=contract,
        state_type_name="dict",
        plan_hash=plan_hash,
        document_text=text,
        document_digest=hashlib.sha256(text.encode()).hexdigest(),
        document_format="yaml",
        signal_names_json=signals,
    )


def pinned_instance(
    definition_id: str, version: int, status: str, scope: str = "default", **fields: Any
) -> WorkflowInstance:
    return WorkflowInstance.objects.create(
        id=uuid.uuid4(),
        definition_id=definition_id,
        definition_version=version,
        plan_hash="h",
        status=status,
        definition_scope_key=scope,
        **fields,
    )


def lock_timeout(ms: int) -> override_settings:
    return override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "DEFINITION_LOCK_TIMEOUT_MS": ms}
    )


def hold(holder: psycopg.Connection, definition_id: str, *, shared: bool = False) -> None:
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    holder.execute(LOCK_KEY.format(function), [definition_id])


# --------------------------------------------------------------------------
# upsert_code
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_insert_writes_code_row_and_default_activation():
    plan = FakePlan(new_id(), 1, signals={"go": {"type": "object"}, "stop": None})
    assert store.upsert_code(plan) == "INSERTED"
    stored = row(plan.id, 1)
    assert (stored.kind, stored.status, stored.scope_key) == ("CODE", "AVAILABLE", "default")
    assert (stored.contract_name, stored.state_type_name, stored.plan_hash) == (
        "thing.v1",
        "dict",
        plan.plan_hash,
    )
    assert stored.name_binding == {}
    assert stored.signal_names_json == {"go": {"type": "object"}, "stop": None}
    assert stored.start_schema_json == {"type": "object"}
    assert stored.document_text is None and stored.document_digest is None
    assert activation(plan.id) == ("default", 1)


@pytest.mark.django_db
def test_second_upsert_is_unchanged_and_writes_nothing():
    plan = FakePlan(new_id(), 1)
    store.upsert_code(plan)
    before = row_versions(plan.id)
    assert store.upsert_code(plan) == "UNCHANGED"
    assert row_versions(plan.id) == before


@pytest.mark.django_db
def test_unchanged_fills_signal_schemas_recorded_by_an_older_release():
    plan = FakePlan(new_id(), 1)
    store.upsert_code(plan)
    WorkflowDefinition.objects.filter(definition_id=plan.id).update(
        signal_names_json=None, start_schema_json=None
    )
    assert store.upsert_code(plan) == "UNCHANGED"
    stored = row(plan.id, 1)
    assert stored.signal_names_json == {"go": {"type": "object"}}
    assert stored.start_schema_json == {"type": "object"}


@pytest.mark.django_db
def test_changed_hash_is_rehashed_in_place():
    plan = FakePlan(new_id(), 1)
    store.upsert_code(plan)
    changed = FakePlan(
        plan.id,
        1,
        contract="thing.v2",
        state_type_name="app.State",
        structure="b",
        signals={},
        start_schema=None,
    )
    assert store.upsert_code(changed) == "REHASHED"
    stored = row(plan.id, 1)
    assert (stored.plan_hash, stored.contract_name, stored.state_type_name) == (
        changed.plan_hash,
        "thing.v2",
        "app.State",
    )
    assert stored.signal_names_json == {}
    assert stored.start_schema_json is None
    assert stored.status == "AVAILABLE"
    assert activation(plan.id) == ("default", 1)


@pytest.mark.django_db
def test_lower_version_after_higher_does_not_move_the_activation():
    definition_id = new_id()
    assert store.upsert_code(FakePlan(definition_id, 2)) == "INSERTED"
    assert store.upsert_code(FakePlan(definition_id, 1)) == "INSERTED"
    assert activation(definition_id) == ("default", 2)
    assert store.upsert_code(FakePlan(definition_id, 3)) == "INSERTED"
    assert activation(definition_id) == ("default", 3)


@pytest.mark.django_db
def test_restart_never_undoes_an_operator_choice():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.upsert_code(FakePlan(definition_id, 2))
    store.put_activation("default", definition_id, "default", 1)
    for version in (1, 2):
        assert store.upsert_code(FakePlan(definition_id, version)) == "UNCHANGED"
    assert activation(definition_id) == ("default", 1)


@pytest.mark.django_db
def test_activate_default_false_writes_no_activation():
    plan = FakePlan(new_id(), 1)
    assert store.upsert_code(plan, activate_default=False) == "INSERTED"
    assert activation(plan.id) is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changed", "rule"),
    [
        ({"contract": "other.contract"}, store.CONTRACT_RULE),
        ({"state_type_name": "app.Other"}, store.STATE_TYPE_RULE),
    ],
)
def test_contract_and_state_type_rules_refuse_and_write_nothing(changed, rule):
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    before = row_versions(definition_id)
    with pytest.raises(WorkflowDefinitionError, match=rule) as refused:
        store.upsert_code(FakePlan(definition_id, 2, **changed))
    message = str(refused.value)
    assert definition_id in message and "default" in message and "v2" in message
    assert refused.value.definition_id == definition_id
    assert row_versions(definition_id) == before
    # a rehash that would change the contract of a version is refused the same way
    store.upsert_code(FakePlan(definition_id, 2))
    before = row_versions(definition_id)
    with pytest.raises(WorkflowDefinitionError, match=rule):
        store.upsert_code(FakePlan(definition_id, 2, structure="b", **changed))
    assert row_versions(definition_id) == before


@pytest.mark.django_db
def test_retired_versions_and_other_scopes_take_no_part_in_the_rules():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    document_row(definition_id, 7, scope="tenant", contract="tenant.contract")
    store.remove_activation("default", definition_id)
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    store.retire("default", definition_id, 1)
    assert store.upsert_code(FakePlan(definition_id, 2, contract="thing.v2")) == "INSERTED"


@pytest.mark.django_db
def test_a_document_row_under_the_key_refuses_the_code_row():
    definition_id = new_id()
    document_row(definition_id, 1, scope="default")
    with pytest.raises(WorkflowDefinitionError, match="DOCUMENT"):
        store.upsert_code(FakePlan(definition_id, 1))
    assert row(definition_id, 1).kind == "DOCUMENT"


def run_threads(
    count: int, target: Callable[[int], Any]
) -> tuple[list[threading.Thread], list[Any], list[BaseException]]:
    """Run ``target(i)`` in ``count`` threads, each on its own Django connection."""
    results: list[Any] = []
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            results.append(target(index))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections[workflow_settings.DATABASE].close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, results, errors


def waiting_advisory_locks(holder: psycopg.Connection) -> int:
    cur = holder.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    (count,) = cur.fetchone()
    return int(count)


def release_when_all_wait(holder: psycopg.Connection, count: int) -> None:
    """Release the holder's lock once ``count`` sessions queue behind it."""
    deadline = time.monotonic() + 120  # a hang guard, not a timing assumption
    while waiting_advisory_locks(holder) < count:
        assert time.monotonic() < deadline, "the workers never queued on the id lock"
        time.sleep(0.02)
    holder.rollback()


def finish(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_boots_write_one_row_and_one_activation(holder):
    plan = FakePlan(new_id(), 1)
    hold(holder, plan.id)
    # the first worker's lock wait spans the others' start-up: no 30 s default
    with lock_timeout(120_000):
        threads, results, errors = run_threads(4, lambda _: store.upsert_code(plan))
        release_when_all_wait(holder, 4)
        finish(threads)
    assert errors == []
    assert sorted(results) == ["INSERTED", "UNCHANGED", "UNCHANGED", "UNCHANGED"]
    assert rows(plan.id) == [("default", 1, "AVAILABLE")]
    assert activation(plan.id) == ("default", 1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_boots_of_several_versions_activate_the_highest(holder):
    definition_id = new_id()
    hold(holder, definition_id)
    # the first worker's lock wait spans the others' start-up: no 30 s default
    with lock_timeout(120_000):
        threads, results, errors = run_threads(
            4, lambda index: store.upsert_code(FakePlan(definition_id, index + 1))
        )
        release_when_all_wait(holder, 4)
        finish(threads)
    assert errors == []
    assert results == ["INSERTED"] * 4
    assert activation(definition_id) == ("default", 4)


@pytest.mark.django_db(transaction=True)
def test_mutations_run_at_read_committed_in_their_own_transaction():
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_isolation = 'serializable'")
    try:
        plan = FakePlan(new_id(), 1)
        assert store.upsert_code(plan) == "INSERTED"  # its own transaction: READ COMMITTED
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone() == ("serializable",)
            with pytest.raises(WorkflowPersistenceError, match="READ COMMITTED"):
                store.upsert_code(plan)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_lock_wait_over_the_timeout_is_a_retryable_error_naming_the_id(holder):
    plan = FakePlan(new_id(), 1)
    store.upsert_code(plan)
    hold(holder, plan.id)
    with lock_timeout(100), pytest.raises(WorkflowPersistenceError) as failed:
        store.transition("default", plan.id, 1, "AVAILABLE", "DEPRECATED")
    assert failed.value.retryable is True
    assert plan.id in str(failed.value)
    assert failed.value.__cause__ is not None
    # inside a caller's transaction only the registry's savepoint rolls back
    with transaction.atomic():
        with lock_timeout(100), pytest.raises(WorkflowPersistenceError):
            store.transition("default", plan.id, 1, "AVAILABLE", "DEPRECATED")
        assert row(plan.id, 1).status == "AVAILABLE"


# --------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------


def sel_row(scope: str, version: int, status: str = "AVAILABLE") -> DefinitionRow:
    return DefinitionRow(scope, "f", version, status, "CODE", "c", "dict", f"h{scope}{version}")


def selection(*rows: DefinitionRow, activations: tuple[Activation, ...] = ()) -> SelectionResult:
    return SelectionResult("f", "tenant", tuple(rows), activations)


def test_select_version_prefers_the_start_scope_activation():
    result = selection(
        sel_row("default", 1),
        sel_row("default", 2),
        sel_row("tenant", 1),
        activations=(
            Activation("default", "f", "default", 2),
            Activation("tenant", "f", "tenant", 1),
        ),
    )
    assert select_version(result, "tenant").key == ("tenant", "f", 1)


def test_select_version_falls_back_to_the_default_activation_then_the_highest():
    with_default = selection(
        sel_row("default", 1),
        sel_row("default", 2),
        sel_row("tenant", 3),
        activations=(Activation("default", "f", "default", 1),),
    )
    assert select_version(with_default, "tenant").key == ("default", "f", 1)
    no_records = selection(
        sel_row("default", 5),
        sel_row("tenant", 2),
        sel_row("tenant", 3),
        sel_row("tenant", 4, "DEPRECATED"),
    )
    assert select_version(no_records, "tenant").key == ("tenant", "f", 3)
    default_only = selection(
        sel_row("default", 1), sel_row("default", 2), sel_row("default", 3, "RETIRED")
    )
    assert select_version(default_only, "tenant").key == ("default", "f", 2)


def test_select_version_with_a_requested_version():
    result = selection(
        sel_row("default", 1),
        sel_row("default", 2),
        sel_row("tenant", 1),
        sel_row("tenant", 3, "DEPRECATED"),
        activations=(Activation("default", "f", "default", 2),),
    )
    assert select_version(result, "tenant", 1).key == ("tenant", "f", 1)
    assert select_version(result, "tenant", 2).key == ("default", "f", 2)
    with pytest.raises(WorkflowConflict, match="version not available"):
        select_version(result, "tenant", 3)
    with pytest.raises(WorkflowNotFound, match="version 9"):
        select_version(result, "tenant", 9)


def test_select_version_not_found_and_nothing_available():
    with pytest.raises(WorkflowNotFound, match="'f'"):
        select_version(selection(), "tenant")
    with pytest.raises(WorkflowNotFound, match="'f'"):
        select_version(selection(), "tenant", 1)
    with pytest.raises(WorkflowConflict, match="no AVAILABLE version"):
        select_version(selection(sel_row("default", 1, "DEPRECATED")), "tenant")
    deprecated_target = selection(
        sel_row("tenant", 1, "DEPRECATED"), activations=(Activation("tenant", "f", "tenant", 1),)
    )
    with pytest.raises(WorkflowConflict, match="version not available"):
        select_version(deprecated_target, "tenant")


@pytest.mark.django_db
def test_selection_read_returns_both_scopes_and_their_activations():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.upsert_code(FakePlan(definition_id, 2))
    document_row(definition_id, 1, signals={"go": None})
    document_row(definition_id, 3, status="DEPRECATED", signals={"go": None})
    document_row(definition_id, 1, scope="elsewhere")
    store.put_activation("tenant", definition_id, "tenant", 1)
    store.put_activation("elsewhere", definition_id, "elsewhere", 1)
    WorkflowDefinition.objects.filter(
        definition_id=definition_id, scope_key="tenant", definition_version=1
    ).update(failure_reason="MADE_UP")
    store.selection_read("tenant", definition_id)  # the first run prepares it (Parse, Sync)
    read = []
    assert client_waits(lambda: read.append(store.selection_read("tenant", definition_id))) == [
        "Sync"  # then one round trip: the prepared statement
    ]
    (result,) = read
    assert [r.key for r in result.rows] == [
        ("default", definition_id, 1),
        ("default", definition_id, 2),
        ("tenant", definition_id, 1),
        ("tenant", definition_id, 3),
    ]
    assert [(a.scope_key, a.target_scope_key, a.version) for a in result.activations] == [
        ("default", "default", 2),
        ("tenant", "tenant", 1),
    ]
    tenant_v1, tenant_v3 = result.row("tenant", 1), result.row("tenant", 3)
    assert tenant_v1 is not None and tenant_v3 is not None
    assert tenant_v1.signal_names == {"go": None}
    assert tenant_v1.failure_reason is None  # an unknown reason reads as no failure
    assert (tenant_v3.status, tenant_v3.signal_names, tenant_v3.start_schema) == (
        "DEPRECATED",
        None,
        None,
    )
    default_v2 = result.row("default", 2)
    assert default_v2 is not None and default_v2.start_schema == {"type": "object"}
    assert select_version(result, "tenant").key == ("tenant", definition_id, 1)
    assert select_version(store.selection_read("other", definition_id), "other").key == (
        "default",
        definition_id,
        2,
    )
    assert store.selection_read("tenant", "no-such-id").rows == ()


@pytest.mark.django_db
def test_start_read_returns_the_key_row_and_the_selection_read_in_one_round_trip():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    document_row(definition_id, 2, scope="tenant")
    store.put_activation("tenant", definition_id, "tenant", 2)
    store.start_read("tenant", definition_id, "warm")  # the first run prepares it
    read = []
    assert client_waits(lambda: read.append(store.start_read("tenant", definition_id, "k1"))) == [
        "Sync"
    ]
    ((earlier, selection),) = read
    assert earlier is None  # a new key
    assert selection == store.selection_read("tenant", definition_id)
    assert [r.key for r in selection.rows] == [
        ("default", definition_id, 1),
        ("tenant", definition_id, 2),
    ]
    # a key already used: the dedup row, as dedup.find reads it, with the same selection
    first = uuid.uuid4()
    assert dedup.claim("START", "tenant", definition_id, "k1", first, "fp-1")
    earlier, again = store.start_read("tenant", definition_id, "k1")
    assert earlier == dedup.find("START", "tenant", definition_id, "k1")
    assert earlier is not None and (earlier[0], earlier[1]) == (first, "fp-1")
    assert again == selection
    # the key is scoped: the same key in another scope or of another id is new
    assert store.start_read("default", definition_id, "k1")[0] is None
    assert store.start_read("tenant", new_id(), "k1")[0] is None


@pytest.mark.django_db
def test_start_read_of_an_id_without_rows_still_returns_its_key():
    definition_id = new_id()
    workflow_id = uuid.uuid4()
    assert dedup.claim("START", "default", definition_id, "k", workflow_id, "fp")
    earlier, selection = store.start_read("default", definition_id, "k")
    assert earlier is not None and earlier[:2] == (workflow_id, "fp")
    assert (selection.rows, selection.activations) == ((), ())
    assert store.start_read("default", definition_id, "other") == (
        None,
        store.selection_read("default", definition_id),
    )


# --------------------------------------------------------------------------
# pin admission and declared signals
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_pin_admission():
    plan = FakePlan(new_id(), 1)
    with transaction.atomic():
        store.admit_pin("default", "never-registered", 1, "any-hash")
        store.upsert_code(plan)
        store.admit_pin("default", plan.id, 1, plan.plan_hash)
        with pytest.raises(WorkflowConflict, match=r"INVALID_TRANSITION.*drift"):
            store.admit_pin("default", plan.id, 1, "other-hash")
        with pytest.raises(WorkflowConflict, match="no such version"):
            store.admit_pin("default", plan.id, 2, plan.plan_hash)
        # another scope's pin is judged against that scope's row only
        with pytest.raises(WorkflowConflict, match=f"tenant/{plan.id} v1"):
            store.admit_pin("tenant", plan.id, 1, plan.plan_hash)


@pytest.mark.django_db
def test_deprecated_pins_only_for_resurrection_and_retired_never():
    definition_id = new_id()
    v1 = FakePlan(definition_id, 1)
    store.upsert_code(v1)
    store.upsert_code(FakePlan(definition_id, 2))
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    with pytest.raises(WorkflowConflict, match="DEPRECATED"):
        store.admit_pin("default", definition_id, 1, v1.plan_hash)
    store.admit_pin("default", definition_id, 1, v1.plan_hash, resurrection=True)
    store.retire("default", definition_id, 1)
    with pytest.raises(WorkflowConflict, match="RETIRED"):
        store.admit_pin("default", definition_id, 1, v1.plan_hash, resurrection=True)


@pytest.mark.django_db(transaction=True)
def test_pin_admission_needs_the_callers_transaction():
    with pytest.raises(transaction.TransactionManagementError):
        store.admit_pin("default", "x", 1, "h")


@pytest.mark.django_db(transaction=True)
def test_repeatable_read_refuses_an_id_with_no_visible_row():
    plan = FakePlan(new_id(), 1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(WorkflowConflict, match="REPEATABLE READ"):
            store.admit_pin("default", plan.id, 1, plan.plan_hash)
    store.upsert_code(plan)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        store.admit_pin("default", plan.id, 1, plan.plan_hash)
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND "
            "locktype = 'relation' AND mode = 'RowShareLock' AND relation = %s::regclass",
            [T["definitions"]],
        )
        assert cursor.fetchone() == (1,)  # the rows were read FOR SHARE


@pytest.mark.django_db(transaction=True)
def test_admissions_share_the_id_lock_and_wait_for_a_mutation(holder):
    plan = FakePlan(new_id(), 1)
    store.upsert_code(plan)
    hold(holder, plan.id, shared=True)
    with lock_timeout(100), transaction.atomic():
        store.admit_pin("default", plan.id, 1, plan.plan_hash)
    holder.rollback()
    hold(holder, plan.id)
    # in the caller's transaction: the data-access error (tests/test_registry_errors.py)
    with (
        lock_timeout(100),
        pytest.raises(OperationalError) as failed,
        transaction.atomic(),
    ):
        store.admit_pin("default", plan.id, 1, plan.plan_hash)
    assert store.is_lock_timeout(failed.value)


@pytest.mark.django_db
def test_declared_signal_names():
    plan = FakePlan(new_id(), 1, signals={"go": None, "paid": {"type": "object"}})
    store.upsert_code(plan)
    assert store.declared_signal_names("default", plan.id, 1) == {
        "go": None,
        "paid": {"type": "object"},
    }
    assert store.declared_signal_names("default", plan.id, 2) is None
    document_row(plan.id, 1, signals=None)
    assert store.declared_signal_names("tenant", plan.id, 1) is None


# --------------------------------------------------------------------------
# transitions, retirement, activations
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_unsupported_transition_is_refused_before_any_statement(django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(WorkflowConflict, match="INVALID_TRANSITION"):
        store.transition("default", "x", 1, "AVAILABLE", "RETIRED")
    with django_assert_num_queries(0), pytest.raises(WorkflowConflict):
        store.transition("default", "x", 1, "CANDIDATE", "AVAILABLE")


@pytest.mark.django_db
def test_transitions_and_the_default_current_guard():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    with pytest.raises(WorkflowConflict, match="current default version"):
        store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    store.upsert_code(FakePlan(definition_id, 2))  # the activation moves to 2
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    assert row(definition_id, 1).status == "DEPRECATED"
    with pytest.raises(WorkflowConflict, match="is DEPRECATED, not AVAILABLE"):
        store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    with pytest.raises(WorkflowConflict, match="does not exist"):
        store.transition("default", definition_id, 9, "DEPRECATED", "AVAILABLE")
    store.transition("default", definition_id, 1, "DEPRECATED", "AVAILABLE")
    assert row(definition_id, 1).status == "AVAILABLE"
    # rows of other scopes are not guarded
    document_row(definition_id, 1)
    store.put_activation("tenant", definition_id, "tenant", 1)
    store.transition("tenant", definition_id, 1, "AVAILABLE", "DEPRECATED")


@pytest.mark.django_db
def test_reinstating_a_retired_version_reapplies_the_rules():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.remove_activation("default", definition_id)
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    store.retire("default", definition_id, 1)
    store.upsert_code(FakePlan(definition_id, 2, contract="thing.v2"))
    with pytest.raises(WorkflowDefinitionError, match=store.CONTRACT_RULE):
        store.transition("default", definition_id, 1, "RETIRED", "AVAILABLE")
    assert row(definition_id, 1).status == "RETIRED"


@pytest.mark.django_db
def test_reinstating_a_scope_row_checks_the_default_contract():
    definition_id = new_id()
    document_row(definition_id, 1, contract="tenant.contract", status="RETIRED")
    store.upsert_code(FakePlan(definition_id, 1, contract="thing.v1"))
    with pytest.raises(ContractMismatch):
        store.transition("tenant", definition_id, 1, "RETIRED", "AVAILABLE")


@pytest.mark.django_db
def test_retire_guard():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    with pytest.raises(WorkflowConflict, match="AVAILABLE; only CANDIDATE or DEPRECATED"):
        store.retire("default", definition_id, 1)
    store.upsert_code(FakePlan(definition_id, 2))
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    waiting = pinned_instance(definition_id, 1, "WAITING")
    pinned_instance(definition_id, 1, "COMPLETED")
    pinned_instance(definition_id, 1, "FAILED")
    pinned_instance(definition_id, 2, "RUNNING")
    pinned_instance(definition_id, 1, "RUNNING", scope="tenant")
    with pytest.raises(WorkflowConflict, match="still pins 1 unfinished"):
        store.retire("default", definition_id, 1)
    WorkflowInstance.objects.filter(pk=waiting.pk).update(status="COMPLETED")
    archived = pinned_instance(definition_id, 1, "COMPENSATING")
    WorkflowInstance.objects.filter(pk=archived.pk).update(archived_at="2020-01-01T00:00:00Z")
    with pytest.raises(WorkflowConflict, match="still pins 1 unfinished"):
        store.retire("default", definition_id, 1)
    archived.delete()
    store.retire("default", definition_id, 1)
    assert row(definition_id, 1).status == "RETIRED"
    with pytest.raises(WorkflowConflict, match="RETIRED"):
        store.retire("default", definition_id, 1)


@pytest.mark.django_db
def test_a_candidate_retires_without_the_pin_check():
    definition_id = new_id()
    document_row(definition_id, 1, status="CANDIDATE")
    pinned_instance(definition_id, 1, "WAITING", scope="tenant")
    store.retire("tenant", definition_id, 1)
    assert row(definition_id, 1, "tenant").status == "RETIRED"


@pytest.mark.django_db
def test_activations():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.upsert_code(FakePlan(definition_id, 2))
    with pytest.raises(WorkflowConflict, match=f"default/{definition_id} v9 does not exist"):
        store.put_activation("default", definition_id, "default", 9)
    store.put_activation("default", definition_id, "default", 1)
    store.transition("default", definition_id, 2, "AVAILABLE", "DEPRECATED")
    with pytest.raises(WorkflowConflict, match="is DEPRECATED, not AVAILABLE"):
        store.put_activation("default", definition_id, "default", 2)
    with pytest.raises(WorkflowValidationError):
        store.put_activation("default", definition_id, "tenant", 1)
    with pytest.raises(WorkflowValidationError):
        store.put_activation("tenant", definition_id, "other", 1)
    store.put_activation("tenant", definition_id, "default", 1)
    assert activation(definition_id, "tenant") == ("default", 1)
    listed = store.list_activations(definition_id=definition_id)
    assert [(a.scope_key, a.target_scope_key, a.version) for a in listed] == [
        ("default", "default", 1),
        ("tenant", "default", 1),
    ]
    assert store.remove_activation("tenant", definition_id) is True
    assert store.remove_activation("tenant", definition_id) is False
    assert activation(definition_id, "tenant") is None


@pytest.mark.django_db
def test_a_scope_cannot_follow_a_default_version_of_another_contract():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1, contract="thing.v1"))
    document_row(definition_id, 5, contract="tenant.contract")
    with pytest.raises(ContractMismatch, match=r"tenant\.contract"):
        store.put_activation("tenant", definition_id, "default", 1)
    assert activation(definition_id, "tenant") is None


@pytest.mark.django_db
def test_list_definitions_filters_and_never_reads_documents(django_assert_num_queries):
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.upsert_code(FakePlan(definition_id, 2))
    document_row(definition_id, 1)
    with django_assert_num_queries(1) as captured:
        listed = store.list_definitions(definition_id=definition_id)
    assert "document_text" not in captured.captured_queries[0]["sql"]
    assert [(r.scope_key, r.version, r.kind) for r in listed] == [
        ("default", 1, "CODE"),
        ("default", 2, "CODE"),
        ("tenant", 1, "DOCUMENT"),
    ]
    assert [
        r.version for r in store.list_definitions(scope="tenant", definition_id=definition_id)
    ] == [1]
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    assert [
        (r.scope_key, r.version)
        for r in store.list_definitions(definition_id=definition_id, statuses=["DEPRECATED"])
    ] == [("default", 1)]
    assert store.list_definitions(definition_id=definition_id, statuses=[]) == []


# --------------------------------------------------------------------------
# registry bootstrap
# --------------------------------------------------------------------------


@pytest.fixture
def fresh_sync() -> Iterator[None]:
    registry._reset_sync_state()
    yield
    registry._reset_sync_state()


@pytest.mark.django_db
def test_sync_records_the_catalog_and_logs_each_definition(caplog):
    from vertique_workflow.definitions import catalog

    caplog.set_level(logging.INFO, logger="vertique_workflow.registry")
    outcomes = registry.sync_code_definitions()
    assert outcomes[("order", 1)] == "INSERTED"
    plan = catalog.get("order", 1)
    assert plan is not None
    assert row("order", 1).plan_hash == plan.plan_hash
    assert row("order", 1).signal_names_json == dict(plan.signals)
    line = f"workflow definition order version 1 hash {plan.plan_hash[:12]}: INSERTED"
    assert line in caplog.messages
    assert len(caplog.records) == len(outcomes)
    assert set(registry.sync_code_definitions().values()) == {"UNCHANGED"}


@pytest.mark.django_db
def test_ensure_synced_runs_once_per_process(fresh_sync):
    first = registry.ensure_synced()
    assert first is not None and first[("order", 1)] == "INSERTED"
    assert registry.ensure_synced() is None


@pytest.mark.django_db
def test_a_record_only_node_writes_no_code_rows(fresh_sync):
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "EXECUTOR_ENABLED": False}
    ):
        assert registry.ensure_synced() is None
    assert not WorkflowDefinition.objects.filter(definition_id="order").exists()


# --------------------------------------------------------------------------
# management command
# --------------------------------------------------------------------------


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("workflow_definitions", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_command_sync_and_list():
    from vertique_workflow.definitions import catalog

    assert "order v1: INSERTED" in run("sync")
    assert "order v1: UNCHANGED" in run("sync")
    plan = catalog.get("order", 1)
    assert plan is not None
    lines = run("list", "--id", "order").splitlines()
    assert lines[0].split() == [
        "SCOPE",
        "ID",
        "VERSION",
        "STATUS",
        "KIND",
        "HASH",
        "LIVE",
        "FAILED",
        "CONTRACT",
        "FAILURE",
    ]
    assert lines[1].split() == [
        "default",
        "order",
        "1",
        "AVAILABLE",
        "CODE",
        plan.plan_hash[:12],
        "0",
        "0",
        plan.contract,
        "-",
    ]
    assert len(run("list", "--status", "RETIRED", "--id", "order").splitlines()) == 1


@pytest.mark.django_db
def test_command_lifecycle_and_errors():
    run("sync")
    with pytest.raises(CommandError, match=r"INVALID_TRANSITION.*current default version"):
        run("deprecate", "order", "1")
    assert "no record to remove" not in run("deactivate", "order")
    assert "order v1 deprecated" in run("deprecate", "order", "1")
    assert row("order", 1).status == "DEPRECATED"
    assert "order v1 reinstated" in run("reinstate", "order", "1")
    assert "now starts default/order v1" in run("activate", "order", "1")
    assert activation("order") == ("default", 1)
    assert "now starts default/order v1" in run(
        "activate", "order", "1", "--scope", "tenant", "--target-scope", "default"
    )
    assert activation("order", "tenant") == ("default", 1)
    with pytest.raises(CommandError, match="AVAILABLE; only CANDIDATE or DEPRECATED"):
        run("retire", "order", "1")
    with pytest.raises(CommandError, match="does not exist"):
        run("reinstate", "order", "7")


@pytest.mark.django_db
def test_command_reinstate_needs_the_code_plan_on_this_node():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    store.upsert_code(FakePlan(definition_id, 2))
    run("deprecate", definition_id, "1")
    assert f"{definition_id} v1 retired" in run("retire", definition_id, "1")
    with pytest.raises(CommandError, match="no code plan"):
        run("reinstate", definition_id, "1")
