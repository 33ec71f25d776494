"""The command log's less travelled paths (issue 15, "behaviours no test covers").

Each test drives one store function of ``store/commands.py`` down a path the
happy-path tests never take: the claim of a command whose instance has
ended, the claim's own dead letter, a dead-lettered signal releasing its
slot, the CLAIM_LOST answers of the failure dispositions, busy locks and
stale tokens, and the settlements of an ended instance's parked and dead
commands. Commands are inserted directly where the record side would refuse
them (a signal to an ended instance is the race the claim settles).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.flows.workflows import Billing
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowHistory,
    WorkflowInstance,
)
from vertique_workflow.store import commands, direct_statements
from vertique_workflow.store.commands import Actor, Head
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]

MAX = 5  # tests/settings.py MAX_ATTEMPTS


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def command(cid: int) -> WorkflowCommand:
    return WorkflowCommand.objects.get(pk=cid)


def entries(workflow_id: Any, event: str) -> list[WorkflowHistory]:
    return list(
        WorkflowHistory.objects.filter(workflow_id=workflow_id, event_type=event).order_by(
            "sequence"
        )
    )


def open_signals(workflow_id: Any) -> int:
    return WorkflowCommandQueue.objects.get(workflow_id=workflow_id).open_signals


def claim(cid: int, workflow_id: Any, *, max_attempts: int = MAX) -> commands.Claim | None:
    with transaction.atomic():
        return commands.claim(
            cid, workflow_id, node_id="n", lease_seconds=30, max_attempts=max_attempts
        )


def record_signal(
    workflow_id: Any, name: str, *, branch: str | None = None, actor: Actor | None = None
) -> int:
    """A SIGNAL as the record side writes it (its open-signal slot taken), bypassing the
    record side's ended-instance refusal (the race the claim settles)."""
    target: dict[str, Any] = {"name": name, **({"branchId": branch} if branch else {})}
    with transaction.atomic():
        assert commands.raise_open_signals(workflow_id, 1000)
        cid, _ = commands.insert(workflow_id, "SIGNAL", payload={}, target=target, actor=actor)
    return cid


def record_timer(workflow_id: Any) -> int:
    """A FIRE timer command (no timer row: the claim reads the command only)."""
    with transaction.atomic():
        cid, _ = commands.insert(workflow_id, "SIGNAL", payload=None)
        WorkflowCommand.objects.filter(pk=cid).update(kind="TIMER", timer_kind="FIRE")
    return cid


def completed_instance() -> Any:
    ref = wf.start("order", {"amount": 0}, idempotency_key=f"k-{uuid.uuid4()}")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    return ref.id


def waiting_instance(definition_id: str = "order", payload: Any = None) -> Any:
    ref = wf.start(definition_id, payload or {"amount": 5}, idempotency_key=f"k-{uuid.uuid4()}")
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    return ref.id


def instance_row(workflow_id: Any) -> tuple[Any, ...]:
    row = WorkflowInstance.objects.get(pk=workflow_id)
    return (row.status, row.current_step_id, row.version, row.error_type, row.completed_at)


def assert_settled_unspent(cid: int, state: str, reason: str) -> WorkflowCommand:
    row = command(cid)
    assert (row.state, row.attempts, row.claim_token, row.lease_until) == (state, 0, None, None)
    assert row.settled_at is not None
    assert row.last_error is not None and row.last_error.startswith(f"{reason}: ")
    return row


def hold_execution_lock(holder: psycopg.Connection, workflow_id: Any) -> None:
    holder.execute(
        f"SELECT pg_advisory_xact_lock({commands.EXECUTION_LOCK_NAMESPACE}, hashtext(%s::text))",
        [str(workflow_id)],
    )


# --------------------------------------------------------------------------
# claim: commands of ended instances
# --------------------------------------------------------------------------


def test_a_signal_to_a_completed_instance_is_rejected_without_spending_an_attempt():
    workflow_id = completed_instance()
    before = instance_row(workflow_id)
    cid = record_signal(workflow_id, "paid", actor=Actor("USER", "ann", None, None, "ASSERTED"))
    assert open_signals(workflow_id) == 1
    settled = claim(cid, workflow_id)
    assert settled is not None and (settled.outcome, settled.token) == ("SETTLED", None)
    assert_settled_unspent(cid, "REJECTED", "INSTANCE_ENDED")
    (entry,) = entries(workflow_id, "COMMAND_REJECTED")
    assert entry.command_id == cid
    assert entry.payload_json["commandId"] == cid and entry.payload_json["signal"] == "paid"
    assert entry.payload_json["reason"].startswith("INSTANCE_ENDED: ")
    assert (entry.actor_kind, entry.actor_id) == ("USER", "ann")  # the command's actor
    assert open_signals(workflow_id) == 0  # the slot is released
    assert instance_row(workflow_id) == before  # the instance is left as it is
    assert claim(cid, workflow_id) is None  # settled: no longer claimable, nothing written


def test_a_timer_and_a_branch_signal_of_an_ended_instance_are_settled_stale():
    workflow_id = completed_instance()
    timer = record_timer(workflow_id)
    branch_signal = record_signal(workflow_id, "paid", branch="b1")
    for cid in (timer, branch_signal):
        settled = claim(cid, workflow_id)
        assert settled is not None and settled.outcome == "SETTLED"
        assert_settled_unspent(cid, "STALE", "INSTANCE_ENDED")
    stale = entries(workflow_id, "COMMAND_STALE")
    assert [(e.command_id, e.payload_json["kind"]) for e in stale] == [
        (timer, "TIMER"),
        (branch_signal, "SIGNAL"),
    ]
    assert entries(workflow_id, "COMMAND_REJECTED") == []
    assert open_signals(workflow_id) == 0


def test_any_command_of_a_cancelled_instance_is_settled_cancelled():
    workflow_id = waiting_instance()
    assert wf.cancel(workflow_id, reason="customer left")
    before = instance_row(workflow_id)
    signal, timer = record_signal(workflow_id, "paid"), record_timer(workflow_id)
    cancelled_before = len(entries(workflow_id, "COMMAND_CANCELLED"))
    for cid in (signal, timer):
        settled = claim(cid, workflow_id)
        assert settled is not None and settled.outcome == "SETTLED"
        assert_settled_unspent(cid, "CANCELLED", "INSTANCE_CANCELLED")
    new = entries(workflow_id, "COMMAND_CANCELLED")[cancelled_before:]
    assert [e.command_id for e in new] == [signal, timer]
    assert all(e.payload_json["reason"].startswith("INSTANCE_CANCELLED: ") for e in new)
    assert open_signals(workflow_id) == 0
    assert instance_row(workflow_id) == before


def test_a_command_recorded_before_actors_were_logged_settles_with_no_actor():
    workflow_id = completed_instance()
    cid = record_signal(workflow_id, "paid")
    WorkflowCommand.objects.filter(pk=cid).update(actor_kind=None, attribution_status=None)
    claim(cid, workflow_id)
    (entry,) = entries(workflow_id, "COMMAND_REJECTED")
    assert (entry.actor_kind, entry.attribution_status) == ("NONE", "ABSENT")


# --------------------------------------------------------------------------
# claim: busy lock, dead letter at the claim
# --------------------------------------------------------------------------


def test_a_claim_whose_execution_lock_is_busy_writes_nothing(holder):
    workflow_id = waiting_instance()
    cid = record_signal(workflow_id, "paid", actor=None)
    hold_execution_lock(holder, workflow_id)
    before = table_counts()
    assert claim(cid, workflow_id) is None
    assert table_counts() == before
    assert (command(cid).state, command(cid).attempts) == ("PENDING", 0)


def test_a_signal_out_of_attempts_is_dead_lettered_by_the_claim_and_frees_its_slot():
    workflow_id = waiting_instance()
    cid = record_signal(workflow_id, "paid")
    WorkflowCommand.objects.filter(pk=cid).update(
        attempts=MAX, last_error="TRANSIENT_FAILURE: step 'ship' failed"
    )
    dead = claim(cid, workflow_id)
    assert dead is not None and dead.outcome == "DEAD"
    row = command(cid)
    assert (row.state, row.attempts, row.claim_token, row.settled_at) == ("DEAD", MAX, None, None)
    assert row.last_error.startswith("ATTEMPTS_EXHAUSTED: ")
    (entry,) = entries(workflow_id, "COMMAND_DEAD_LETTERED")
    assert entry.command_id == cid and entry.payload_json["reason"] == row.last_error
    assert open_signals(workflow_id) == 0
    assert wf.get(workflow_id).status == "WAITING"  # only a START fails its instance


def test_a_start_out_of_attempts_is_dead_lettered_by_the_claim_and_fails_its_instance():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-start")
    (head,) = commands.peek(10)
    WorkflowCommand.objects.filter(pk=head.id).update(attempts=MAX)
    dead = claim(head.id, ref.id)
    assert dead is not None and dead.outcome == "DEAD"
    assert command(head.id).state == "DEAD"
    instance = WorkflowInstance.objects.get(pk=ref.id)
    assert (instance.status, instance.error_type) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    assert instance.completed_at is not None
    history = WorkflowHistory.objects.filter(workflow_id=ref.id).order_by("sequence")
    assert [e.event_type for e in history][-2:] == [
        "COMMAND_DEAD_LETTERED",
        "FAILED",
    ]


def test_a_dead_start_of_an_instance_already_failed_adds_no_second_failure():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-failed")
    (head,) = commands.peek(10)
    WorkflowInstance.objects.filter(pk=ref.id).update(status="FAILED", error_type="EARLIER")
    WorkflowCommand.objects.filter(pk=head.id).update(attempts=MAX)
    assert claim(head.id, ref.id).outcome == "DEAD"
    assert WorkflowInstance.objects.get(pk=ref.id).error_type == "EARLIER"
    assert entries(ref.id, "FAILED") == []
    assert len(entries(ref.id, "COMMAND_DEAD_LETTERED")) == 1


def test_claim_next_without_resident_plans_claims_nothing():
    wf.start("order", {"amount": 5}, idempotency_key="k-none")
    before = table_counts()
    assert (
        commands.claim_next(
            node_id="n", lease_seconds=30, max_attempts=MAX, resident=[], kinds=["START"]
        )
        is None
    )
    assert table_counts() == before


def test_claim_next_claims_only_a_resident_pin_of_a_kind_it_runs():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-pins")
    before = table_counts()

    def claim(resident, kinds=("START",)):
        return commands.claim_next(
            node_id="n", lease_seconds=30, max_attempts=MAX, resident=resident, kinds=kinds
        )

    # another version, another scope, another id, another kind: nothing claimed or written
    assert claim([("default", "order", 2)]) is None
    assert claim([("tenant", "order", 1)]) is None
    assert claim([("default", "billing", 1), ("default", 'quo"ted \u00e9', 1)]) is None
    assert claim([("default", "order", 1)], kinds=("SIGNAL", "TIMER")) is None
    assert table_counts() == before
    claimed = claim([("default", "billing", 1), ("default", "order", 1)], kinds=("SIGNAL", "START"))
    assert claimed is not None
    assert (claimed.workflow_id, claimed.kind) == (ref.id, "START")
    assert (claimed.definition_id, claimed.definition_version) == ("order", 1)


def test_the_claim_writes_its_kinds_and_pins_into_its_statement():
    # constants of the statement's text, parsed once per prepared statement: ids with
    # quotes, a percent sign, a placeholder's spelling, the dollar quote's own tag and a
    # backslash neither break the statement nor match another pin
    odd = 'it\'s 100% $vwf$ \\ %(kinds)s "x"'
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-constants")
    resident = [("default", odd, 1), ("default", "order", 1)]
    text = commands.claim_statement(commands.CLAIM_NEXT, resident, ("START",))
    _, names = direct_statements.converted(text)
    assert names is not None and {"kinds", "resident"}.isdisjoint(names)
    assert commands.claim_statement(commands.CLAIM_NEXT, resident, ("START",)) is text
    assert commands.claim_statement(commands.CLAIM_NEXT, resident[:1], ("START",)) != text
    before = table_counts()

    def claim(pins):
        return commands.claim_next(
            node_id="n", lease_seconds=30, max_attempts=MAX, resident=pins, kinds=("START",)
        )

    assert claim(resident[:1]) is None
    assert table_counts() == before
    claimed = claim(resident)
    assert claimed is not None and claimed.workflow_id == ref.id


# --------------------------------------------------------------------------
# a dead-lettered signal releases its slot
# --------------------------------------------------------------------------


def test_a_dead_lettered_signal_releases_its_open_signal_slot():
    with override_settings(VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "OPEN_SIGNALS_CAP": 1}):
        ref = wf.start("billing", {}, idempotency_key="k1")
        run_until_idle()
        Billing.fail_times = 100
        wf.signal(ref.id, "charge", None, dedup_key="c1")
        assert open_signals(ref.id) == 1
        with pytest.raises(wf.WorkflowConflict, match="OPEN_SIGNALS_CAP"):
            wf.signal(ref.id, "note", None, dedup_key="n1")  # at the cap
        run_until_idle()
        dead = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
        assert (dead.state, dead.claim_token, dead.settled_at) == ("DEAD", None, None)
        assert dead.last_error.startswith("ATTEMPTS_EXHAUSTED: ")
        (entry,) = entries(ref.id, "COMMAND_DEAD_LETTERED")
        assert (entry.command_id, entry.payload_json["signal"]) == (dead.id, "charge")
        assert open_signals(ref.id) == 0
        # the slot is free again: a new signal is accepted at the cap
        receipt = wf.signal(ref.id, "note", None, dedup_key="n1")
        assert not receipt.duplicate and open_signals(ref.id) == 1


# --------------------------------------------------------------------------
# failure dispositions: CLAIM_LOST
# --------------------------------------------------------------------------


def claimed_start() -> tuple[Any, commands.Claim]:
    ref = wf.start("order", {"amount": 5}, idempotency_key=f"k-{uuid.uuid4()}")
    (head,) = commands.peek(10)
    claimed = claim(head.id, ref.id)
    assert claimed is not None and claimed.outcome == "CLAIMED"
    return ref.id, claimed


@pytest.mark.parametrize("disposition", ["fail", "dead_letter"])
def test_a_failure_disposition_with_a_lost_claim_answers_claim_lost_and_writes_nothing(
    disposition: str,
):
    workflow_id, claimed = claimed_start()

    def dispose(cid: int, token: Any) -> str:
        with transaction.atomic():
            if disposition == "fail":
                return commands.fail(cid, token, "BOOM", "BOOM: step failed", "reserve")
            return commands.dead_letter(cid, token, "ATTEMPTS_EXHAUSTED: x", "reserve")

    before = table_counts()
    command_before = command(claimed.command_id)
    assert dispose(claimed.command_id, uuid.uuid4()) == "CLAIM_LOST"  # another claim's token
    assert dispose(10**12, claimed.token) == "CLAIM_LOST"  # no such command
    assert commands.release(claimed.command_id, claimed.token) == 1
    assert dispose(claimed.command_id, claimed.token) == "CLAIM_LOST"  # no longer CLAIMED
    assert table_counts() == before
    after = command(claimed.command_id)
    assert (after.state, after.last_error) == ("PENDING", command_before.last_error)
    assert WorkflowInstance.objects.get(pk=workflow_id).status == "PENDING"


def test_fail_of_an_instance_already_failed_settles_the_command_only():
    workflow_id, claimed = claimed_start()
    WorkflowInstance.objects.filter(pk=workflow_id).update(status="FAILED", error_type="EARLIER")
    with transaction.atomic():
        assert commands.fail(claimed.command_id, claimed.token, "BOOM", "BOOM: x", None) == "FAILED"
    row = command(claimed.command_id)
    assert (row.state, row.claim_token, row.last_error) == ("FAILED", None, "BOOM: x")
    assert WorkflowInstance.objects.get(pk=workflow_id).error_type == "EARLIER"
    assert entries(workflow_id, "FAILED") == []


# --------------------------------------------------------------------------
# fenced single-command writes with a stale token
# --------------------------------------------------------------------------


def test_fenced_writes_with_a_stale_token_change_nothing():
    _workflow_id, claimed = claimed_start()
    stale = uuid.uuid4()
    before = table_counts()
    snapshot = command(claimed.command_id)
    with transaction.atomic():
        assert commands.park(claimed.command_id, stale) == 0
        assert commands.release(claimed.command_id, stale) == 0
        assert commands.retry_after_error(claimed.command_id, stale, 1.0, "X: y") == 0
        assert commands.retry_transient(claimed.command_id, stale, "X: y", base_ms=1, max_ms=1) == 0
        assert commands.reject(claimed.command_id, stale, "X: y") is None
    after = command(claimed.command_id)
    assert (after.state, after.attempts, after.claim_token, after.last_error) == (
        "CLAIMED",
        snapshot.attempts,
        claimed.token,
        snapshot.last_error,
    )
    assert table_counts() == before
    # the claim's own token does settle it: REJECTED with the reason
    with transaction.atomic():
        assert commands.reject(claimed.command_id, claimed.token, "X: y") == "START"
    assert (command(claimed.command_id).state, command(claimed.command_id).claim_token) == (
        "REJECTED",
        None,
    )


def test_raise_open_signals_refuses_at_the_cap():
    workflow_id = waiting_instance()
    assert commands.raise_open_signals(workflow_id, 2)
    assert commands.raise_open_signals(workflow_id, 2)
    assert not commands.raise_open_signals(workflow_id, 2)
    assert open_signals(workflow_id) == 2


# --------------------------------------------------------------------------
# defer: busy lock, changed pin, the second deferral
# --------------------------------------------------------------------------


def deferrable_head() -> Head:
    wf.start("order", {"amount": 5}, idempotency_key=f"k-{uuid.uuid4()}")
    (head,) = commands.peek(10)
    return head


def test_defer_with_a_busy_lock_or_a_changed_pin_writes_nothing(holder):
    head = deferrable_head()
    before = table_counts()
    changed = dataclasses.replace(head, plan_hash="another-hash")
    with transaction.atomic():
        assert commands.defer(head.id, changed, "no plan") == 0
    hold_execution_lock(holder, head.workflow_id)
    with transaction.atomic():
        assert commands.defer(head.id, head, "no plan") == 0
    assert table_counts() == before
    assert (command(head.id).state, command(head.id).deferral_count) == ("PENDING", 0)


def test_a_second_deferral_counts_without_a_second_history_entry():
    head = deferrable_head()
    with transaction.atomic():
        assert commands.defer(head.id, head, "no plan") == 1
    # a deferred command is not claimable again before its time
    with transaction.atomic():
        assert commands.defer(head.id, head, "no plan") == 0
    WorkflowCommand.objects.filter(pk=head.id).update(available_at="2000-01-01T00:00:00Z")
    with transaction.atomic():
        assert commands.defer(head.id, head, "no plan") == 2
    row = command(head.id)
    assert (row.state, row.deferral_count, row.attempts) == ("DEFERRED", 2, 0)
    assert row.last_error.startswith("NOT_RUNNABLE: ")
    assert len(entries(head.workflow_id, "COMMAND_DEFERRED")) == 1


# --------------------------------------------------------------------------
# settlement of an ended instance's parked and dead commands; cancel_all
# --------------------------------------------------------------------------


def parked_and_dead_signals() -> tuple[Any, int, int]:
    """A waiting two-waits instance with one PARKED and one DEAD signal."""
    workflow_id = waiting_instance("two-waits", {})
    wf.signal(workflow_id, "second", None, dedup_key="early")  # parked: it waits for "first"
    run_until_idle()
    parked = WorkflowCommand.objects.get(workflow_id=workflow_id, kind="SIGNAL")
    assert parked.state == "PARKED"
    dead = record_signal(workflow_id, "extra")
    with transaction.atomic():
        commands._settle(dead, "DEAD", "ATTEMPTS_EXHAUSTED: x")  # releases its slot
    assert open_signals(workflow_id) == 1
    # one more slot that no command holds: what the statements lower stays visible
    # (a count lowered too far would stop at zero and hide the mistake)
    assert commands.raise_open_signals(workflow_id, 1000)
    return workflow_id, parked.id, dead


@pytest.mark.parametrize("cancelled", [False, True])
def test_settle_ended_settles_parked_and_dead_commands_and_lowers_parked_slots_only(
    cancelled: bool,
):
    workflow_id, parked, dead = parked_and_dead_signals()
    status = "CANCELLED" if cancelled else "COMPLETED"
    WorkflowInstance.objects.filter(pk=workflow_id).update(status=status)
    with transaction.atomic():
        assert commands.settle_ended(workflow_id, cancelled=cancelled) == 2
    state, event, reason = (
        ("CANCELLED", "COMMAND_CANCELLED", "INSTANCE_CANCELLED")
        if cancelled
        else ("REJECTED", "COMMAND_REJECTED", "INSTANCE_ENDED")
    )
    for cid in (parked, dead):
        row = command(cid)
        assert (row.state, row.claim_token, row.lease_until) == (state, None, None)
        assert row.settled_at is not None and row.last_error.startswith(f"{reason}: ")
    assert [e.command_id for e in entries(workflow_id, event)][-2:] == [parked, dead]
    assert open_signals(workflow_id) == 1  # the parked slot only: the dead one was free


def test_cancel_releases_open_signal_slots_but_not_those_of_dead_signals():
    workflow_id, parked, dead = parked_and_dead_signals()
    pending = record_signal(workflow_id, "extra")
    assert open_signals(workflow_id) == 3
    assert wf.cancel(workflow_id, reason="stop")
    for cid in (parked, dead, pending):
        assert command(cid).state == "CANCELLED"
        assert command(cid).last_error.startswith("INSTANCE_CANCELLED: SIGNAL command")
    assert open_signals(workflow_id) == 1  # parked and pending lowered it; the dead one not


def test_requeue_parked_takes_back_named_instance_level_signals_only():
    workflow_id, parked, _dead = parked_and_dead_signals()
    branch = record_signal(workflow_id, "second", branch="b1")
    WorkflowCommand.objects.filter(pk=branch).update(state="PARKED")
    with transaction.atomic():
        assert commands.requeue_parked(workflow_id, ["first"]) == 0
        assert commands.requeue_parked(workflow_id, ["second"]) == 1
    assert command(parked).state == "PENDING" and command(parked).last_error is None
    assert command(branch).state == "PARKED"  # a branch-addressed signal stays parked


def test_supersede_dead_start_leaves_a_start_in_any_other_state_alone():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-sup")
    (head,) = commands.peek(10)
    with transaction.atomic():
        assert commands.supersede_dead_start(ref.id) is None
    assert command(head.id).state == "PENDING"
    assert commands.health(ref.id) == (0, 0)
    assert commands.retry_needed(ref.id) == (False, None)
