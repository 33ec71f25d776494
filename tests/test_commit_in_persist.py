"""The segment's COMMIT sent in its persist's pipeline, and where it must not be.

A segment whose persist is its last statement sends the transaction's COMMIT
in the same pipeline (one wait less a segment). That is right only when the
transaction is one outermost ``atomic`` block's; the persist must fail itself
when it wrote nothing, so the COMMIT never runs after it; a COMMIT that fails
(a deferred constraint) must leave the segment as a failed one; and a segment
that writes after its persist (parked commands settle) commits as before.
"""

from __future__ import annotations

import dataclasses

import pytest
from django.db import DatabaseError, connection, transaction

import vertique_workflow as wf
from tests.flows.models import Shipment
from vertique_workflow.executor.segment import run_next
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.store import db, history, instances
from vertique_workflow.store import segment as segment_store
from vertique_workflow.tables import sql_names
from vertique_workflow.testing import run_until_idle

from .conftest import connect
from .wire import client_messages

pytestmark = pytest.mark.django_db(transaction=True)

SHIPMENTS = Shipment._meta.db_table
T = sql_names()


def shipment_seen_elsewhere(pk: int) -> tuple[str, str] | None:
    """The shipment as another session sees it (committed data only)."""
    with connect(connection.settings_dict["NAME"]) as other:
        row = other.execute(
            f"SELECT order_ref, created_by_step FROM {SHIPMENTS} WHERE id = %s", [pk]
        ).fetchone()
    return None if row is None else (row[0], row[1])


def test_a_statement_carrying_the_commit_commits_before_its_block_ends():
    shipment = Shipment.objects.create(order_ref="a", created_by_step="s")
    hooks: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: hooks.append("ran"))
        Shipment.objects.filter(pk=shipment.pk).update(order_ref="b")
        db.fetchone_prepared("SELECT 1")  # the connection's libpq-layer statements exist
        assert db.owns_transaction()
        row = db.fetchone_prepared_then_commit(
            f"UPDATE {SHIPMENTS} SET created_by_step = %s WHERE id = %s RETURNING id",
            ("t", shipment.pk),
        )
        assert row == (shipment.pk,)
        assert shipment_seen_elsewhere(shipment.pk) == ("b", "t")  # committed already
        assert hooks == []  # Django's callbacks wait for the block's end, as always
    assert hooks == ["ran"]
    # the block's own commit found nothing to do; the connection goes on
    assert Shipment.objects.get(pk=shipment.pk).created_by_step == "t"


@pytest.mark.parametrize("inside", ["an outer block", "a rollback asked for", "autocommit"])
def test_no_commit_is_carried_where_the_transaction_is_not_the_block_s_own(inside):
    Shipment.objects.create(order_ref="a", created_by_step="s")
    if inside == "autocommit":
        db.fetchone_prepared("SELECT 1")
        assert not db.owns_transaction()
        return
    with transaction.atomic():
        if inside == "an outer block":
            with transaction.atomic():
                db.fetchone_prepared("SELECT 1")
                assert not db.owns_transaction()
        else:
            db.fetchone_prepared("SELECT 1")
            assert db.owns_transaction()
            transaction.set_rollback(True)
            assert not db.owns_transaction()


def test_a_segment_inside_the_caller_s_block_leaves_the_commit_to_that_block():
    ref = wf.start("order", {"amount": 0}, idempotency_key="nested")
    with transaction.atomic():
        outcome = run_next("n1")
        assert outcome is not None and outcome.result == "COMPLETED"
        with connect(connection.settings_dict["NAME"]) as other:
            seen = other.execute(
                f"SELECT status FROM {T['instances']} WHERE id = %s", [ref.id]
            ).fetchone()
        assert seen == ("PENDING",)  # not committed by the segment
        transaction.set_rollback(True)
    assert wf.get(ref.id).status == "PENDING"
    assert WorkflowCommand.objects.get(workflow_id=ref.id).state == "PENDING"


def test_a_persist_that_writes_nothing_fails_before_its_commit_runs():
    """A stale version: the statement raises 40001, so the COMMIT in its pipeline never
    runs and the transaction's earlier write rolls back with it."""
    ref = wf.start("order", {"amount": 5}, idempotency_key="stale")
    run_until_idle()
    row = instances.get(ref.id)
    assert row is not None
    stale = dataclasses.replace(row, version=row.version - 1)
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        Shipment.objects.create(order_ref="earlier-write", created_by_step="s")
        db.fetchone_prepared("SELECT 1")
        assert db.owns_transaction()
        segment_store.persist(
            instance=stale,
            command_id=0,
            token=None,
            status="COMPLETED",
            current_step=None,
            state={},
            error_type=None,
            error_message=None,
            ended=True,
            subject=None,
            entries=[],
            common={},
            actor=history.NO_ACTOR,
            new_version=row.version + 1,
            legacy_baseline=False,
            commit=True,
        )
    assert db.sqlstate(raised.value) == "40001"
    assert not Shipment.objects.filter(order_ref="earlier-write").exists()
    assert WorkflowInstance.objects.get(pk=ref.id).version == row.version
    assert wf.get(ref.id).status == "WAITING"


@pytest.fixture
def refused_at_commit():
    """A deferred constraint trigger on the shipments: ``refused-at-commit`` fails at COMMIT."""
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION test_refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.order_ref = 'refused-at-commit' THEN "
            "RAISE EXCEPTION USING ERRCODE = '23514', MESSAGE = 'refused at commit'; END IF; "
            "RETURN NULL; END $$"
        )
        cur.execute(
            f"CREATE CONSTRAINT TRIGGER test_refuse_at_commit AFTER INSERT ON {SHIPMENTS} "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_refuse_at_commit()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TRIGGER test_refuse_at_commit ON {SHIPMENTS}")
            cur.execute("DROP FUNCTION test_refuse_at_commit()")


def test_a_commit_that_fails_fails_the_segment_and_keeps_none_of_it(refused_at_commit):
    """The action's ORM write breaks a deferred constraint: the pipelined COMMIT fails, the
    segment counts as a step that raised (its attempt spent), and nothing of it stays."""
    ref = wf.start("shipment", {"ref": "refused-at-commit"}, idempotency_key="refused")
    messages: list[tuple[str, str]] = []
    outcome = None

    def run() -> None:
        nonlocal outcome
        outcome = run_next("n1")

    messages = client_messages(run)
    assert outcome is not None and outcome.result == "RETRIED"
    in_pipelines = [text.strip() for kind, text in messages if kind == "Parse"]
    assert '"" "COMMIT" 0' in in_pipelines  # the COMMIT that failed was the persist's
    assert not Shipment.objects.filter(order_ref="refused-at-commit").exists()
    assert wf.get(ref.id).status == "PENDING"
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("PENDING", 1)
    assert command.last_error.startswith("STEP_FAILED")
    assert not WorkflowCommand.objects.filter(workflow_id=ref.id, state="COMPLETE").exists()


def test_a_segment_that_settles_parked_commands_commits_after_them():
    """Parked commands settle after the persist, in the same transaction: no COMMIT in the
    persist's pipeline, the block's own COMMIT last."""
    ref = wf.start("two-waits", {}, idempotency_key="parked")
    run_until_idle()
    wf.signal(ref.id, "second", None, dedup_key="early")  # parked: the instance waits for first
    assert run_until_idle().outcomes == ["PARKED"]
    wf.signal(ref.id, "first", None, dedup_key="first")
    messages = client_messages(lambda: run_next("n1"))
    waits = [
        kind if kind == "Sync" else text.strip()
        for kind, text in messages
        if kind in ("Sync", "Query")
    ]
    assert waits[-1] == '"COMMIT"', messages
    assert '"" "COMMIT" 0' not in [text.strip() for kind, text in messages if kind == "Parse"]
    # the parked "second" was put back by that segment and now runs
    assert WorkflowCommand.objects.get(workflow_id=ref.id, dedup_key="early").state == "PENDING"
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
