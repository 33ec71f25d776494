"""Issue 15 items 1-4: the start context on the instance, the explicit carrier of a
signal, declared signal names from the registry row, and the schema fill after a
node's first plan resolution."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.flows.context import TENANT
from vertique_workflow import pins, registry
from vertique_workflow.context import register_durable, unregister_durable
from vertique_workflow.definitions import catalog
from vertique_workflow.executor.segment import run_next
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.store import db
from vertique_workflow.store import definitions as store_definitions
from vertique_workflow.testing import run_until_idle


def _definitions_table() -> str:
    return db.T["definitions"]


@pytest.fixture
def tenant() -> Iterator[None]:
    register_durable(TENANT)
    try:
        yield
    finally:
        unregister_durable("tenant")


@pytest.fixture
def fresh_fill() -> Iterator[None]:
    """Each test sees its plans as never resolved by this process."""
    pins._reset_filled()
    yield
    pins._reset_filled()


def _record(definition_id: str) -> None:
    """The CODE row of the plan, as an executor's sync writes it."""
    plan = catalog.get(definition_id, 1)
    assert plan is not None
    registry.sync_code_definitions([plan])


def _set_signal_names(definition_id: str, value: str | None) -> None:
    """Rewrite the row's schema columns (NULL both: a row from before the columns)."""
    with connection.cursor() as cursor:
        if value is None:
            cursor.execute(
                f"UPDATE {_definitions_table()} SET signal_names_json = NULL, "
                "start_schema_json = NULL WHERE definition_id = %s",
                [definition_id],
            )
        else:
            cursor.execute(
                f"UPDATE {_definitions_table()} SET signal_names_json = %s::jsonb "
                "WHERE definition_id = %s",
                [value, definition_id],
            )


def _signal_names(definition_id: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT signal_names_json::text, start_schema_json IS NULL "
            f"FROM {_definitions_table()} WHERE definition_id = %s",
            [definition_id],
        )
        row = cursor.fetchone()
    return row


def _without_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record as a node that holds no plan for the pin."""
    monkeypatch.setattr(pins, "exact_plan", lambda *args, **kwargs: None)


# -- item 1: the start context on the instance ------------------------------


@pytest.mark.django_db
def test_start_stores_the_captured_context_as_the_instance_metadata(tenant):
    token = TENANT.set("acme")
    try:
        ref = wf.start("context-flow", {}, idempotency_key="k1")
    finally:
        TENANT.reset(token)
    instance = WorkflowInstance.objects.get(pk=ref.id)
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert instance.metadata == {"context": {"tenant": "acme"}}
    assert command.context_json == instance.metadata, "one capture for both"


@pytest.mark.django_db
def test_start_without_context_stores_empty_metadata(tenant):
    ref = wf.start("context-flow", {}, idempotency_key="k1")
    assert WorkflowInstance.objects.get(pk=ref.id).metadata == {}
    assert WorkflowCommand.objects.get(workflow_id=ref.id).context_json is None


# -- item 2: the explicit carrier of a signal --------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_explicit_carrier_reaches_the_action_instead_of_the_captured_context(tenant):
    token = TENANT.set("caller-tenant")
    try:
        ref = wf.start("signal-context-flow", {}, idempotency_key="k1")
        run_until_idle()
        receipt = wf.signal(ref.id, "go", None, dedup_key="s1", carrier={"tenant": "carried"})
    finally:
        TENANT.reset(token)
    command = WorkflowCommand.objects.get(pk=receipt.command_id)
    assert command.explicit_carrier_json == {"context": {"tenant": "carried"}}
    assert command.context_json == {"context": {"tenant": "caller-tenant"}}
    run_until_idle()
    state = wf.get(ref.id).state
    assert state == {"at_start": "caller-tenant", "after_go": "carried"}
    assert TENANT.get() is None


@pytest.mark.django_db(transaction=True)
def test_without_a_carrier_the_signal_binds_the_captured_context(tenant):
    ref = wf.start("signal-context-flow", {}, idempotency_key="k1")
    run_until_idle()
    token = TENANT.set("signaller")
    try:
        receipt = wf.signal(ref.id, "go", None, dedup_key="s1")
    finally:
        TENANT.reset(token)
    assert WorkflowCommand.objects.get(pk=receipt.command_id).explicit_carrier_json is None
    run_until_idle()
    assert wf.get(ref.id).state == {"at_start": None, "after_go": "signaller"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "carrier",
    [
        {"no-such-name": "x"},
        {"identity": {"user": "SECRET-USER"}},
        {"tenant": "ok", "other": 1},
        {"tenant": "SECRET-VALUE\x00"},
        ["tenant"],
    ],
)
def test_a_carrier_with_an_unknown_name_or_bad_value_is_refused_writing_nothing(tenant, carrier):
    ref = wf.start("signal-context-flow", {}, idempotency_key="k1")
    run_until_idle()
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError) as caught:
        wf.signal(ref.id, "go", None, dedup_key="s1", carrier=carrier)
    assert "SECRET" not in str(caught.value), "messages never carry values"
    assert table_counts() == before


# -- item 3: declared signal names come from the pinned registry row ---------


@pytest.fixture(params=["with the plan", "without the plan"])
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "without the plan":
        _without_the_plan(monkeypatch)
    return str(request.param)


@pytest.mark.django_db
def test_the_registry_row_decides_which_names_are_admitted_on_every_node(node, fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    # the row declares "refund" only: "paid", declared by the code plan, is refused
    _set_signal_names("order", '{"refund": null}')
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError, match="declares no signal 'paid'"):
        wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    assert table_counts() == before
    assert wf.signal(ref.id, "refund", {}, dedup_key="s2").command_id


@pytest.mark.django_db
def test_a_null_signal_names_column_admits_every_name_on_every_node(node, fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    _set_signal_names("order", None)
    plan = catalog.get("order", 1)
    assert plan is not None
    pins._filled.add(("default", "order", 1, plan.plan_hash))  # this node filled it already
    receipt = wf.signal(ref.id, "refund", {}, dedup_key="s1")
    assert receipt.command_id and not receipt.duplicate


@pytest.mark.django_db
def test_the_resident_plan_still_checks_the_payload_of_a_name_it_declares(fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    with pytest.raises(wf.WorkflowValidationError, match="amount_paid"):
        wf.signal(ref.id, "paid", {"amount": 5}, dedup_key="s1")


# -- item 4: the guarded fill after a node's first plan resolution -----------


@pytest.mark.django_db(transaction=True)
def test_a_record_path_fills_null_schema_columns_then_refuses_undeclared_names(fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    _set_signal_names("order", None)
    pins._reset_filled()
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError, match="declares no signal 'refund'"):
        wf.signal(ref.id, "refund", {}, dedup_key="s1")
    assert table_counts() == before
    names, _ = _signal_names("order")
    assert names is not None and "paid" in names


@pytest.mark.django_db(transaction=True)
def test_the_fill_commits_on_its_own_even_when_the_callers_transaction_rolls_back(fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    _set_signal_names("order", None)
    pins._reset_filled()
    with pytest.raises(RuntimeError), transaction.atomic():
        wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
        raise RuntimeError("the view failed")
    assert WorkflowCommand.objects.filter(workflow_id=ref.id, kind="SIGNAL").count() == 0
    names, _ = _signal_names("order")
    assert names is not None and "paid" in names


@pytest.mark.django_db(transaction=True)
def test_the_executor_claim_path_fills_null_schema_columns(fresh_fill):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    _set_signal_names("order", None)
    pins._reset_filled()
    # the claim resolves the pin's plan: this process's first resolution (no sync runs)
    outcome = run_next("test:fill-node")
    assert outcome is not None and outcome.kind == "START"
    names, _ = _signal_names("order")
    assert names is not None and "paid" in names
    with pytest.raises(wf.WorkflowValidationError, match="declares no signal 'refund'"):
        wf.signal(ref.id, "refund", {}, dedup_key="s1")


@pytest.mark.django_db(transaction=True)
def test_the_fill_runs_once_per_plan_and_process(fresh_fill, monkeypatch):
    _record("order")
    calls: list[str] = []
    real = store_definitions.fill_signal_schemas

    def counted(plan: Any) -> int | None:
        calls.append(plan.id)
        return real(plan)

    monkeypatch.setattr(store_definitions, "fill_signal_schemas", counted)
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    run_until_idle()
    assert calls == ["order"]


@pytest.mark.django_db(transaction=True)
def test_a_fill_blocked_by_the_callers_own_lock_gives_up_and_runs_at_the_next_resolution(
    fresh_fill,
):
    _record("order")
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    _set_signal_names("order", None)
    pins._reset_filled()
    plan = catalog.get("order", 1)
    assert plan is not None
    with transaction.atomic():
        with connection.cursor() as cursor:  # the caller's transaction holds the row
            cursor.execute(
                f"SELECT 1 FROM {_definitions_table()} WHERE definition_id = %s FOR UPDATE",
                ["order"],
            )
        # the fill cannot take the row: the NULL column admits the name, nothing hangs
        assert wf.signal(ref.id, "refund", {}, dedup_key="s1").command_id
    assert ("default", "order", 1, plan.plan_hash) not in pins._filled
    assert _signal_names("order")[0] is None
    with pytest.raises(wf.WorkflowValidationError, match="declares no signal 'refund'"):
        wf.signal(ref.id, "refund", {}, dedup_key="s2")
    assert _signal_names("order")[0] is not None
