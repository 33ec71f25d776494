"""The branch token and join state stores, the branch filters of timers, tasks and parked
signals, and ``wf.branches``: one statement per operation, guarded updates, metadata
written once."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction
from django.test.utils import CaptureQueriesContext

import vertique_workflow as wf
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowTimer,
)
from vertique_workflow.store import branches, commands, db, joins, tasks, timers
from vertique_workflow.store.branches import BranchChange, BranchConflict, NewBranch
from vertique_workflow.store.joins import JoinConflict
from vertique_workflow.store.timers import TimerSpec
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

CONTEXT = {"context": {"tenant": "acme"}}


def waiting_instance(key: str = "b1", definition: str = "order") -> uuid.UUID:
    payload: dict[str, Any] = {"amount": 5} if definition == "order" else {}
    ref = wf.start(definition, payload, idempotency_key=key)
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    return ref.id


def new_branch(branch_id: str, **kwargs: Any) -> NewBranch:
    values: dict[str, Any] = {
        "token_id": uuid.uuid4(),
        "fork_step_id": "fork",
        "branch_id": branch_id,
        "status": "RUNNING",
        "current_step_id": "charge",
        "state": {"n": 0},
        "item": None,
        "metadata": CONTEXT,
    }
    values.update(kwargs)
    return NewBranch(**values)


def metadata_of(token_id: Any) -> Any:
    return WorkflowBranchToken.objects.get(pk=token_id).metadata


# -- branch tokens -----------------------------------------------------------


def test_create_writes_a_fan_out_in_one_statement_and_reads_it_back_in_fork_order():
    workflow_id = waiting_instance()
    fan_out = [
        new_branch(str(i), item={"sku": f"s{i}", "qty": i}, state={"i": i}) for i in range(200)
    ]
    with transaction.atomic(using=db.alias()), CaptureQueriesContext(db.connection()) as q:
        branches.create(workflow_id, fan_out)
    assert len(q.captured_queries) == 1, "one insert for the whole fan-out"
    rows = branches.for_instance(workflow_id)
    assert [r.id for r in rows] == [b.token_id for b in fan_out], "the fork's order"
    assert [r.branch_id for r in rows] == [str(i) for i in range(200)]
    first = rows[7]
    assert (first.status, first.current_step_id, first.fork_step_id) == (
        "RUNNING",
        "charge",
        "fork",
    )
    assert (first.state, first.item, first.metadata) == ({"i": 7}, {"sku": "s7", "qty": 7}, CONTEXT)
    assert first.live and first.parent_token_id is None and first.attempts == 0
    stored = WorkflowBranchToken.objects.get(pk=fan_out[7].token_id)
    assert stored.state_json == {"state": {"i": 7}, "item": {"sku": "s7", "qty": 7}}
    assert stored.metadata == CONTEXT
    assert branches.get(fan_out[7].token_id) == first


def test_a_fixed_branch_stores_a_null_item_and_empty_metadata():
    workflow_id = waiting_instance()
    token = new_branch("left", state=None, metadata=None)
    branches.create(workflow_id, [token])
    stored = WorkflowBranchToken.objects.get(pk=token.token_id)
    assert stored.state_json == {"state": None, "item": None}
    assert stored.metadata == {}
    assert branches.get(uuid.uuid4()) is None


def test_scoped_keys_round_trip_and_name_the_parent_branch():
    parent = uuid.uuid4()
    assert branches.scoped_key("inner", None) == "inner"
    assert branches.scoped_key("inner", parent) == f"inner@{parent}"
    assert branches.scoped_key("inner", str(parent)) == f"inner@{parent}"
    assert branches.split_key(f"inner@{parent}") == ("inner", parent)
    assert branches.split_key("inner") == ("inner", None)
    assert branches.split_key("mail@home") == ("mail@home", None), "only a token id scopes"
    assert branches.split_key(branches.scoped_key("a@b", parent)) == ("a@b", parent)
    workflow_id = waiting_instance()
    nested = new_branch("x", fork_step_id=branches.scoped_key("inner", parent))
    branches.create(workflow_id, [nested, new_branch("y")])
    assert branches.get(nested.token_id).parent_token_id == parent
    in_branch = branches.for_instance(workflow_id, fork_key=f"inner@{parent}")
    assert [r.id for r in in_branch] == [nested.token_id]
    assert [r.branch_id for r in branches.for_instance(workflow_id, fork_key="fork")] == ["y"]


def test_addressed_reads_the_branch_an_event_names_and_the_branches_enclosing_it():
    workflow_id = waiting_instance()
    outer = new_branch("east", fork_step_id="outer")
    sibling = new_branch("west", fork_step_id="outer")
    inner = new_branch("x", fork_step_id=branches.scoped_key("inner", outer.token_id))
    other = new_branch("x", fork_step_id=branches.scoped_key("inner", sibling.token_id))
    odd = new_branch("x", fork_step_id="inner@home")  # a step id with "@": not scoped
    plain = new_branch("x", fork_step_id="inner")
    branches.create(workflow_id, [outer, sibling, inner, other, odd, plain])

    def ids(**address: Any) -> set[uuid.UUID]:
        with CaptureQueriesContext(db.connection()) as q:
            found = branches.addressed(workflow_id, **address)
        assert len(q.captured_queries) == 1
        return {r.id for r in found}

    by_step = ids(fork_step_id="inner", branch_id="x")
    assert by_step == {
        inner.token_id,
        other.token_id,
        plain.token_id,
        outer.token_id,
        sibling.token_id,
    }, "every x of the fork step inner, plain or scoped, and their parents; not inner@home"
    scoped = branches.scoped_key("inner", outer.token_id)
    assert ids(fork_step_id=scoped, branch_id="x") == {inner.token_id, outer.token_id}
    assert ids(token_id=inner.token_id) == {inner.token_id, outer.token_id}
    assert ids(fork_step_id="inner@home", branch_id="x") == {odd.token_id}
    assert ids(fork_step_id="outer", branch_id="north") == set()
    assert ids(token_id=uuid.uuid4()) == set()


def test_update_changes_status_step_and_state_in_one_statement_and_keeps_item_and_metadata():
    workflow_id = waiting_instance()
    a, b = new_branch("a", item={"sku": "A"}), new_branch("b", item={"sku": "B"})
    branches.create(workflow_id, [a, b])
    changes = [
        BranchChange(a.token_id, "WAITING", "await_fraud", {"n": 1}),
        BranchChange(b.token_id, "COMPLETED", None, None),
    ]
    with CaptureQueriesContext(db.connection()) as q:
        branches.update(workflow_id, changes)
    assert len(q.captured_queries) == 1
    ra, rb = branches.get(a.token_id), branches.get(b.token_id)
    assert (ra.status, ra.current_step_id, ra.state, ra.item) == (
        "WAITING",
        "await_fraud",
        {"n": 1},
        {"sku": "A"},
    )
    assert (rb.status, rb.current_step_id, rb.state, rb.item) == (
        "COMPLETED",
        None,
        None,
        {"sku": "B"},
    )
    assert metadata_of(a.token_id) == metadata_of(b.token_id) == CONTEXT
    assert [r.id for r in branches.for_instance(workflow_id, live_only=True)] == [a.token_id]


@pytest.mark.parametrize("ended", ["COMPLETED", "FAILED", "SUPERSEDED", "missing", "other"])
def test_update_of_a_token_that_is_not_live_raises_a_transient_conflict(ended: str):
    workflow_id = waiting_instance()
    live, target = new_branch("live"), new_branch("target")
    branches.create(workflow_id, [live, target])
    token_id = target.token_id
    if ended == "SUPERSEDED":
        branches.supersede(workflow_id, [token_id])
    elif ended == "missing":
        token_id = uuid.uuid4()
    elif ended == "other":  # a live token of another instance
        other = waiting_instance("b2")
        foreign = new_branch("foreign")
        branches.create(other, [foreign])
        token_id = foreign.token_id
    else:
        branches.update(workflow_id, [BranchChange(token_id, ended, None, {"done": True})])
    before = branches.get(token_id)
    with pytest.raises(BranchConflict) as raised, transaction.atomic(using=db.alias()):
        branches.update(
            workflow_id,
            [
                BranchChange(live.token_id, "WAITING", "w", {"n": 9}),
                BranchChange(token_id, "RUNNING", "again", {"n": 9}),
            ],
        )
    assert db.sqlstate(raised.value) == "40001" and db.is_retryable(raised.value)
    assert branches.get(live.token_id).status == "RUNNING", "the statement rolled back"
    assert branches.get(token_id) == before


def test_a_token_named_twice_or_an_unwritable_status_is_refused():
    workflow_id = waiting_instance()
    token = new_branch("a")
    branches.create(workflow_id, [token])
    with pytest.raises(ValueError, match="twice"):
        branches.update(workflow_id, [BranchChange(token.token_id, "WAITING", "w", {})] * 2)
    with pytest.raises(ValueError, match="SUPERSEDED"):
        branches.update(workflow_id, [BranchChange(token.token_id, "SUPERSEDED", "w", {})])
    with pytest.raises(ValueError):
        branches.create(workflow_id, [new_branch("b", status="RETRY_SCHEDULED")])


def test_supersede_moves_only_live_tokens_in_one_statement_and_keeps_their_metadata():
    workflow_id = waiting_instance()
    running, waiting, completed, failed = (new_branch(b) for b in ("r", "w", "c", "f"))
    branches.create(workflow_id, [running, waiting, completed, failed])
    branches.update(
        workflow_id,
        [
            BranchChange(waiting.token_id, "WAITING", "await", {"n": 1}),
            BranchChange(completed.token_id, "COMPLETED", None, {"n": 2}),
            BranchChange(failed.token_id, "FAILED", "charge", {"n": 3}),
        ],
    )
    everyone = [failed.token_id, running.token_id, completed.token_id, waiting.token_id]
    with CaptureQueriesContext(db.connection()) as q:
        superseded = branches.supersede(workflow_id, everyone)
    assert len(q.captured_queries) == 1
    assert superseded == [running.token_id, waiting.token_id], "live ones, in the caller's order"
    statuses = {r.branch_id: r.status for r in branches.for_instance(workflow_id)}
    assert statuses == {"r": "SUPERSEDED", "w": "SUPERSEDED", "c": "COMPLETED", "f": "FAILED"}
    assert branches.get(waiting.token_id).current_step_id == "await", "where it stood is kept"
    assert all(metadata_of(t) == CONTEXT for t in everyone)
    assert branches.supersede(workflow_id, everyone) == []
    assert branches.supersede(workflow_id, []) == []


def test_no_statement_but_the_insert_names_the_metadata_column():
    """Metadata immutability: the update statements cannot write it, whatever they are given."""
    for statement in (branches.UPDATE, branches.SUPERSEDE):
        assert "metadata" not in statement
    assert "metadata" in branches.CREATE


# -- join states ---------------------------------------------------------------


def arrival(token: NewBranch, status: str = "COMPLETED") -> dict[str, Any]:
    return {"branchId": token.branch_id, "tokenId": str(token.token_id), "status": status}


def test_a_join_opens_collects_arrivals_in_order_and_decides_once():
    workflow_id = waiting_instance()
    a, b, c = new_branch("a"), new_branch("b"), new_branch("c")
    joins.open(workflow_id, "join", "fork", 3)
    opened = joins.get(workflow_id, "join")
    assert (opened.fork_key, opened.expected, opened.arrived, opened.decided) == (
        "fork",
        3,
        [],
        False,
    )
    with CaptureQueriesContext(db.connection()) as q:
        after = joins.arrive(workflow_id, "join", [arrival(b), arrival(a, "FAILED")])
    assert len(q.captured_queries) == 1
    assert after.arrived == [arrival(b), arrival(a, "FAILED")]
    again = joins.arrive(workflow_id, "join", [arrival(a), arrival(c)])
    assert again.arrived == [arrival(b), arrival(a, "FAILED"), arrival(c)], "a token counts once"
    joins.decide(workflow_id, "join")
    assert joins.get(workflow_id, "join", lock=True).decided
    with pytest.raises(JoinConflict) as raised:
        joins.decide(workflow_id, "join")
    assert db.sqlstate(raised.value) == "40001"
    # a loop entering the fork again opens a new join over the same key
    joins.open(workflow_id, "join", "fork", 2)
    reset = joins.get(workflow_id, "join")
    assert (reset.expected, reset.arrived, reset.decided) == (2, [], False)
    joins.decide(workflow_id, "join")


def test_joins_are_per_instance_and_key_and_refuse_what_they_cannot_record():
    workflow_id, other = waiting_instance(), waiting_instance("b2")
    parent = uuid.uuid4()
    inner = branches.scoped_key("inner_join", parent)
    joins.open(workflow_id, "join", "fork", 2)
    joins.open(workflow_id, inner, branches.scoped_key("inner_fork", parent), 1)
    assert [j.join_key for j in joins.for_instance(workflow_id)] == ["join", inner]
    assert joins.get(other, "join") is None and joins.for_instance(other) == []
    with pytest.raises(JoinConflict):
        joins.arrive(other, "join", [arrival(new_branch("a"))])
    with pytest.raises(JoinConflict):
        joins.decide(other, "join")
    with pytest.raises(ValueError):
        joins.arrive(
            workflow_id, "join", [{"branchId": "a", "tokenId": str(parent), "status": "X"}]
        )
    with pytest.raises(ValueError):
        token = new_branch("a")
        joins.arrive(workflow_id, "join", [arrival(token), arrival(token)])
    assert joins.get(workflow_id, "join").arrived == []


# -- branch filters of timers and tasks -------------------------------------


def timer_spec(token: Any, branch_id: str | None) -> TimerSpec:
    return TimerSpec(
        timer_id=uuid.uuid4(),
        step_id="sleep",
        purpose="STEP",
        delay_seconds=3600,
        branch_token_id=token,
        fork_step_id=None if token is None else "fork",
        branch_id=branch_id,
    )


def test_timers_carry_their_branch_and_cancel_only_the_named_branches():
    workflow_id = waiting_instance()
    left, right = uuid.uuid4(), uuid.uuid4()
    specs = [timer_spec(left, "left"), timer_spec(right, "right"), timer_spec(None, None)]
    recorded = timers.record(workflow_id, specs)
    row = timers.get(specs[0].timer_id)
    assert (row.branch_token_id, row.fork_step_id, row.branch_id) == (left, "fork", "left")
    assert timers.get(specs[2].timer_id).branch_token_id is None
    assert timers.cancel_scheduled(workflow_id, branch_token_ids=[]) == 0
    cancelled: list[dict[str, Any]] = []
    count = timers.cancel_scheduled(
        workflow_id, branch_token_ids=[left], cancelled_commands=cancelled
    )
    assert count == 1
    assert [c["id"] for c in cancelled] == [recorded[0][0]]
    statuses = {
        t.branch_id: t.status for t in WorkflowTimer.objects.filter(workflow_id=workflow_id)
    }
    assert statuses["left"] == "CANCELLED"
    assert statuses["right"] == "SCHEDULED" and statuses[None] == "SCHEDULED"
    states = [WorkflowCommand.objects.get(pk=cid).state for cid, _ in recorded]
    assert states == ["CANCELLED", "PENDING", "PENDING"]


def test_tasks_carry_their_branch_and_cancel_only_the_named_branches_open_and_completing():
    workflow_id = waiting_instance()
    left, right = uuid.uuid4(), uuid.uuid4()
    ids = {name: uuid.uuid4() for name in ("left", "left_reserved", "right", "instance")}
    for name, task_id in ids.items():
        token = {"left": left, "left_reserved": left, "right": right}.get(name)
        tasks.insert_open(
            task_id,
            workflow_id,
            step_id="review",
            name="Review",
            decisions_snapshot={"ok": None},
            branch_token_id=token,
            fork_step_id=None if token is None else "fork",
            branch_id=None if token is None else name.split("_")[0],
        )
    assert tasks.reserve(ids["left_reserved"], 4242)
    row = tasks.get(ids["left"])
    assert (row.branch_token_id, row.fork_step_id, row.branch_id) == (left, "fork", "left")
    assert tasks.cancel_open(workflow_id, branch_token_ids=[]) == 0
    assert tasks.cancel_open(workflow_id, branch_token_ids=[left]) == 2
    statuses = {name: tasks.get(task_id).status for name, task_id in ids.items()}
    assert statuses == {
        "left": "CANCELLED",
        "left_reserved": "CANCELLED",
        "right": "OPEN",
        "instance": "OPEN",
    }
    assert tasks.cancel_open(workflow_id, task_ids=[ids["right"]]) == 1, "old calls still work"


# -- parked branch-addressed signals -------------------------------------------


def open_signals(workflow_id: Any) -> int:
    return WorkflowCommandQueue.objects.get(workflow_id=workflow_id).open_signals


def parked_branch_signals(workflow_id: Any) -> dict[str, int]:
    sent = {
        "left_first": wf.signal(
            workflow_id, "first", None, dedup_key="lf", branch=("fork", "left")
        ),
        "left_second": wf.signal(
            workflow_id, "second", None, dedup_key="ls", branch=("fork", "left")
        ),
        "right_first": wf.signal(
            workflow_id, "first", None, dedup_key="rf", branch=("fork", "right")
        ),
        "other_fork": wf.signal(workflow_id, "first", None, dedup_key="of", branch=("f2", "left")),
    }
    run_until_idle()
    ids = {name: receipt.command_id for name, receipt in sent.items()}
    assert {WorkflowCommand.objects.get(pk=cid).state for cid in ids.values()} == {"PARKED"}
    return ids


def state_of(command_id: int) -> str:
    return WorkflowCommand.objects.get(pk=command_id).state


def test_requeue_parked_for_branch_offers_only_that_branch_and_those_names_again():
    workflow_id = waiting_instance(definition="two-waits")
    ids = parked_branch_signals(workflow_id)
    assert commands.requeue_parked(workflow_id, ["first", "second"]) == 0, "instance waits only"
    count = commands.requeue_parked_for_branch(workflow_id, "fork", "left", ["first"])
    assert count == 1
    assert {name: state_of(cid) for name, cid in ids.items()} == {
        "left_first": "PENDING",
        "left_second": "PARKED",
        "right_first": "PARKED",
        "other_fork": "PARKED",
    }
    assert open_signals(workflow_id) == 4, "a move between open states keeps the count"


def test_settle_parked_for_branches_settles_stale_and_lowers_open_signals():
    workflow_id = waiting_instance(definition="two-waits")
    ids = parked_branch_signals(workflow_id)
    assert commands.settle_parked_for_branches(workflow_id, []) == []
    assert open_signals(workflow_id) == 4
    with CaptureQueriesContext(db.connection()) as q:
        settled = commands.settle_parked_for_branches(
            workflow_id, [("fork", "left"), ("gone", "x")]
        )
    assert len(q.captured_queries) == 1
    assert [s["id"] for s in settled] == sorted([ids["left_first"], ids["left_second"]])
    assert {s["kind"] for s in settled} == {"SIGNAL"}
    assert settled[0]["seq"] == WorkflowCommand.objects.get(pk=settled[0]["id"]).seq
    assert settled[0]["target"]["branchId"] == "left"
    for name in ("left_first", "left_second"):
        command = WorkflowCommand.objects.get(pk=ids[name])
        assert command.state == "STALE" and command.settled_at is not None
        assert command.last_error.startswith("BRANCH_SUPERSEDED: ")
    assert state_of(ids["right_first"]) == state_of(ids["other_fork"]) == "PARKED"
    assert open_signals(workflow_id) == 2


# -- wf.branches -----------------------------------------------------------------


def test_wf_branches_lists_the_tokens_with_their_parent_and_refuses_an_unknown_instance():
    workflow_id = waiting_instance()
    assert wf.branches(workflow_id) == []
    outer = [new_branch("pay"), new_branch("stock", item={"sku": "A"})]
    branches.create(workflow_id, outer)
    inner_key = branches.scoped_key("inner", outer[0].token_id)
    inner = new_branch("fraud", fork_step_id=inner_key, current_step_id="review")
    branches.create(workflow_id, [inner])
    branches.update(workflow_id, [BranchChange(outer[1].token_id, "COMPLETED", None, {"ok": 1})])
    views = wf.branches(str(workflow_id))
    assert [v.token_id for v in views] == [outer[0].token_id, outer[1].token_id, inner.token_id]
    pay, stock, fraud = views
    assert isinstance(pay, wf.BranchView) and pay.instance_id == workflow_id
    assert (pay.fork_step_id, pay.fork_key, pay.parent_token_id) == ("fork", "fork", None)
    assert (stock.status, stock.current_step, stock.state, stock.item) == (
        "COMPLETED",
        None,
        {"ok": 1},
        {"sku": "A"},
    )
    assert (fraud.fork_step_id, fraud.fork_key, fraud.parent_token_id) == (
        "inner",
        inner_key,
        outer[0].token_id,
    )
    assert (fraud.branch_id, fraud.status, fraud.current_step) == ("fraud", "RUNNING", "review")
    assert fraud.created_at is not None and fraud.updated_at is not None
    assert not hasattr(fraud, "metadata"), "the durable context is not shown"
    with pytest.raises(wf.WorkflowNotFound):
        wf.branches(uuid.uuid4())
    with pytest.raises(wf.WorkflowNotFound):
        wf.branches("not-a-uuid")
    assert "branches" in wf.__all__ and "BranchView" in wf.__all__
