"""start / signal / cancel on the record side: idempotency, refusals that write nothing."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import table_counts
from vertique_workflow.models import WorkflowCommand, WorkflowCommandQueue, WorkflowDedup
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db


def test_start_records_a_pending_instance_its_queue_and_start_command():
    ref = wf.start(
        "order",
        {"amount": 5},
        idempotency_key="k1",
        business_key="B1",
        actor=wf.Actor.user("ann", reason="checkout"),
    )
    assert ref.created and ref.definition_version == 1
    instance = wf.get(ref.id)
    assert (instance.status, instance.state, instance.current_step) == ("PENDING", None, None)
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.seq, command.kind, command.state) == (1, "START", "PENDING")
    assert command.payload_json == {"amount": 5}
    assert command.dedup_key == "k1"
    assert (
        command.actor_kind,
        command.actor_id,
        command.actor_reason,
        command.attribution_status,
    ) == ("USER", "ann", "checkout", "ASSERTED")
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).next_seq == 2
    assert WorkflowDedup.objects.filter(kind="START", dedup_namespace="order", key="k1").exists()


def test_same_key_same_payload_returns_the_same_instance():
    first = wf.start("order", {"amount": 5}, idempotency_key="k1")
    before = table_counts()
    again = wf.start("order", {"amount": 5}, idempotency_key="k1")
    assert again.id == first.id and not again.created
    assert table_counts() == before


def test_same_key_other_payload_is_a_conflict_and_writes_nothing():
    wf.start("order", {"amount": 5}, idempotency_key="k1")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="idempotency key"):
        wf.start("order", {"amount": 6}, idempotency_key="k1")
    assert table_counts() == before


def test_duplicate_business_key_in_scope_is_a_conflict():
    wf.start("order", {"amount": 5}, idempotency_key="k1", business_key="B1")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="business key"):
        wf.start("order", {"amount": 5}, idempotency_key="k2", business_key="B1")
    assert table_counts() == before
    # another scope may reuse it
    other = wf.start(
        "order", {"amount": 5}, idempotency_key="k3", business_key="B1", scope="tenant-b"
    )
    assert other.created


def test_start_schema_failure_writes_nothing():
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError, match="missing required 'amount'"):
        wf.start("expense-approval", {"note": "no amount"}, idempotency_key="k1")
    with pytest.raises(wf.WorkflowValidationError) as caught:
        wf.start("expense-approval", {"amount": -5}, idempotency_key="k2")
    assert "-5" not in str(caught.value), "messages never carry payload values"
    assert table_counts() == before


def test_unknown_definition_and_bad_arguments_are_refused():
    with pytest.raises(wf.WorkflowNotFound):
        wf.start("no-such-flow", {}, idempotency_key="k1")
    with pytest.raises(wf.WorkflowValidationError):
        wf.start("order", {}, idempotency_key="")
    with pytest.raises(wf.WorkflowValidationError):
        wf.start("order", ["not", "an", "object"], idempotency_key="k")  # type: ignore[arg-type]
    with pytest.raises(wf.WorkflowValidationError):
        wf.start("order", {"when": object()}, idempotency_key="k")


def test_start_joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        wf.start("order", {"amount": 5}, idempotency_key="k1")
        raise RuntimeError("the view failed")
    assert all(count == 0 for count in table_counts().values())


@pytest.mark.django_db(transaction=True)
def test_signal_is_recorded_deduplicated_and_conflicts_on_reuse():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    receipt = wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    assert not receipt.duplicate and receipt.command_id
    command = WorkflowCommand.objects.get(pk=receipt.command_id)
    assert (command.kind, command.seq, command.target_json) == ("SIGNAL", 2, {"name": "paid"})
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 1
    before = table_counts()
    replay = wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="s1")
    assert replay.duplicate
    with pytest.raises(wf.WorkflowConflict, match="dedup key"):
        wf.signal(ref.id, "paid", {"amount_paid": 6}, dedup_key="s1")
    assert table_counts() == before


@pytest.mark.django_db(transaction=True)
def test_undeclared_signal_and_schema_failure_write_nothing():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError, match="declares no signal 'refund'"):
        wf.signal(ref.id, "refund", {}, dedup_key="s1")
    with pytest.raises(wf.WorkflowValidationError, match="amount_paid"):
        wf.signal(ref.id, "paid", {"amount": 5}, dedup_key="s2")
    assert table_counts() == before


@pytest.mark.django_db(transaction=True)
def test_signal_to_an_ended_instance_is_refused():
    ref = wf.start("order", {"amount": 0}, idempotency_key="k1")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="has ended"):
        wf.signal(ref.id, "paid", {"amount_paid": 1}, dedup_key="s1")
    assert table_counts() == before


def test_signal_to_unknown_instance_is_not_found():
    with pytest.raises(wf.WorkflowNotFound):
        wf.signal("7d4f5a8e-0000-0000-0000-000000000000", "paid", {}, dedup_key="s1")
    with pytest.raises(wf.WorkflowNotFound):
        wf.signal("not-a-uuid", "paid", {}, dedup_key="s1")


@override_settings(VERTIQUE_WORKFLOW={"OPEN_SIGNALS_CAP": 2})
def test_open_signal_cap_refuses_and_writes_nothing():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    wf.signal(ref.id, "extra", None, dedup_key="s1")
    wf.signal(ref.id, "extra", None, dedup_key="s2")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="OPEN_SIGNALS_CAP"):
        wf.signal(ref.id, "extra", None, dedup_key="s3")
    assert table_counts() == before
    assert WorkflowCommandQueue.objects.get(workflow_id=ref.id).open_signals == 2
