"""Human tasks, record side: complete_task (dedup, COMPLETION, reservation), reassign_task,
tasks() queries, can_complete, and what cancel() does to tasks and timers."""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.db import connection, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import connect, history_events, in_threads, table_counts
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowDedup,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.store import commands, db, tasks, timers
from vertique_workflow.store.timers import TimerSpec
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

DECISIONS = {
    "approve": {
        "payloadSchema": {
            "type": "object",
            "required": ["comment"],
            "properties": {"comment": {"type": "string"}},
        }
    },
    "reject": {},
}


def waiting_instance(key: str = "t1", scope: str = "default") -> uuid.UUID:
    ref = wf.start("order", {"amount": 5}, idempotency_key=key, scope=scope)
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    return ref.id


def open_task(workflow_id: uuid.UUID, **kwargs: Any) -> uuid.UUID:
    task_id = uuid.uuid4()
    values: dict[str, Any] = {
        "step_id": "await_payment",
        "name": "Approve expense",
        "assignee": "ann",
        "candidate_users": ["bob"],
        "candidate_groups": ["managers"],
        "decisions_snapshot": DECISIONS,
        "require_version_stability": False,
    }
    values.update(kwargs)
    tasks.insert_open(task_id, workflow_id, **values)
    return task_id


def wait_for_lock_waiters(count: int) -> None:
    """Return once ``count`` sessions wait for an advisory lock (the execution lock).

    PostgreSQL's own lock table says when the racers are queued; a fixed
    wait would not (the guard fails loudly instead).
    """
    guard = time.monotonic() + 120
    with connect(connection.settings_dict["NAME"], autocommit=True) as probe:
        while True:
            row = probe.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            if row[0] >= count:
                return
            assert time.monotonic() < guard, "the racers never queued on the execution lock"
            threading.Event().wait(0.01)


# -- the store -----------------------------------------------------------------


def test_insert_open_takes_the_scope_of_its_instance_and_reads_back():
    workflow_id = waiting_instance(scope="tenant-a")
    task_id = open_task(workflow_id, due_at_delay_seconds=3600)
    row = tasks.get(task_id)
    assert (row.status, row.scope_key, row.assignee) == ("OPEN", "tenant-a", "ann")
    assert (row.candidate_users, row.candidate_groups) == (("bob",), ("managers",))
    assert row.decisions_snapshot == {
        "approve": {**DECISIONS["approve"], "position": 0},
        "reject": {"position": 1},
    }
    assert row.definition_id == "order" and row.instance_status == "WAITING"
    assert row.due_at - row.created_at > datetime.timedelta(minutes=59)
    stored = WorkflowTask.objects.get(pk=task_id)
    assert stored.candidates_json == {"users": ["bob"], "groups": ["managers"]}
    assert [t.id for t in tasks.open_for_step(workflow_id, "await_payment")] == [task_id]
    with pytest.raises(LookupError):
        tasks.insert_open(uuid.uuid4(), uuid.uuid4(), step_id="s", name="n", decisions_snapshot={})


def test_reservation_compare_and_set():
    task_id = open_task(waiting_instance())
    assert tasks.reserve(task_id, 7)
    assert not tasks.reserve(task_id, 8)  # already COMPLETING
    assert not tasks.reopen(task_id, 8)  # not the owner
    assert not tasks.mark_completed(task_id, 8, "approve", {})
    assert tasks.reopen(task_id, 7)
    row = tasks.get(task_id)
    assert (row.status, row.reservation_command_id) == ("OPEN", None)
    assert not tasks.mark_completed(task_id, 7, "approve", {})  # not reserved
    assert tasks.reserve(task_id, 9)
    assert tasks.mark_completed(task_id, 9, "approve", {"comment": "ok"})
    row = tasks.get(task_id)
    assert (row.status, row.decision, row.result) == ("COMPLETED", "approve", {"comment": "ok"})
    assert row.completed_at is not None
    assert tasks.reassign(task_id, "zed") == "COMPLETED"
    assert tasks.reassign(uuid.uuid4(), "zed") == "MISSING"


# -- complete_task ---------------------------------------------------------------


def test_complete_task_writes_dedup_command_and_reservation():
    workflow_id = waiting_instance()
    task_id = open_task(workflow_id)
    receipt = wf.complete_task(
        task_id,
        "approve",
        {"comment": "fine"},
        idempotency_key="c1",
        actor=wf.Actor.user("ann"),
        subject_version=3,
    )
    assert (receipt.task_id, receipt.instance_id, receipt.decision, receipt.duplicate) == (
        task_id,
        workflow_id,
        "approve",
        False,
    )
    command = WorkflowCommand.objects.get(pk=receipt.command_id)
    assert (command.kind, command.state, command.task_id, command.dedup_key) == (
        "COMPLETION",
        "PENDING",
        task_id,
        "c1",
    )
    assert command.payload_json == {"comment": "fine"}
    assert command.target_json == {
        "decision": "approve",
        "subjectVersion": 3,
        "actor": {"kind": "USER", "id": "ann"},
    }
    assert (command.actor_kind, command.actor_id) == ("USER", "ann")
    task = tasks.get(task_id)
    assert (task.status, task.reservation_command_id) == ("COMPLETING", receipt.command_id)
    key = WorkflowDedup.objects.get(kind="TASK_COMPLETION", dedup_namespace=str(task_id))
    assert (key.key, key.scope_key, key.workflow_id) == ("c1", "default", workflow_id)


def test_a_committed_completion_key_answers_its_receipt_whatever_the_payload():
    task_id = open_task(waiting_instance())
    first = wf.complete_task(task_id, "approve", {"comment": "a"}, idempotency_key="c1")
    before = table_counts()
    again = wf.complete_task(task_id, "approve", {"comment": "a"}, idempotency_key="c1")
    other = wf.complete_task(task_id, "reject", {"anything": 1}, idempotency_key="c1")
    assert again.duplicate and other.duplicate
    assert again.command_id == other.command_id == first.command_id
    assert other.decision == "approve"
    assert table_counts() == before


@override_settings(VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "LOCK_TIMEOUT_MS": 120_000})
def test_a_racer_with_the_same_key_and_another_payload_is_a_conflict():
    task_id = open_task(waiting_instance())
    with transaction.atomic():
        first = wf.complete_task(task_id, "approve", {"comment": "a"}, idempotency_key="c1")
        racers = []

        def racer(payload: Any, decision: str = "approve") -> Callable[[], Any]:
            return lambda: wf.complete_task(task_id, decision, payload, idempotency_key="c1")

        thread = threading.Thread(
            target=lambda: racers.extend(
                in_threads(racer({"comment": "b"}), racer({"comment": "a"}), raise_errors=False)
            )
        )
        thread.start()
        # both racers read no committed key and block on the execution lock
        wait_for_lock_waiters(2)
    thread.join(60)
    different, same = racers
    assert isinstance(different, wf.WorkflowConflict)
    assert "different completion" in str(different)
    assert isinstance(same, wf.TaskCompletionReceipt)
    assert same.duplicate and same.command_id == first.command_id
    assert WorkflowCommand.objects.filter(kind="COMPLETION").count() == 1


def test_two_users_completing_one_task_concurrently_one_wins():
    task_id = open_task(waiting_instance())
    barrier = threading.Barrier(2)

    def user(key: str, decision: str) -> Callable[[], Any]:
        def complete() -> Any:
            barrier.wait()
            return wf.complete_task(task_id, decision, {"comment": key}, idempotency_key=key)

        return complete

    results = in_threads(user("ann-1", "approve"), user("bob-1", "reject"), raise_errors=False)
    won = [r for r in results if isinstance(r, wf.TaskCompletionReceipt)]
    lost = [r for r in results if isinstance(r, wf.WorkflowConflict)]
    assert len(won) == 1 and len(lost) == 1, results
    assert "being completed" in str(lost[0])
    assert WorkflowCommand.objects.filter(kind="COMPLETION").count() == 1
    assert WorkflowDedup.objects.filter(kind="TASK_COMPLETION").count() == 1
    assert tasks.get(task_id).reservation_command_id == won[0].command_id


def test_undeclared_decision_is_refused_naming_the_declared_ones():
    task_id = open_task(waiting_instance())
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError) as raised:
        wf.complete_task(task_id, "escalate", None, idempotency_key="c1")
    assert "approve, reject" in str(raised.value)
    assert table_counts() == before
    assert tasks.get(task_id).status == "OPEN"


def test_payload_failing_the_decision_schema_is_refused_without_its_value():
    task_id = open_task(waiting_instance())
    before = table_counts()
    with pytest.raises(wf.WorkflowValidationError) as raised:
        wf.complete_task(task_id, "approve", {"comment": 4242}, idempotency_key="c1")
    message = str(raised.value)
    assert "$.comment" in message and "'type'" in message
    assert "4242" not in message
    assert table_counts() == before


def test_unknown_task_is_not_found_and_writes_nothing():
    waiting_instance()
    before = table_counts()
    with pytest.raises(wf.WorkflowNotFound):
        wf.complete_task(uuid.uuid4(), "approve", None, idempotency_key="c1")
    with pytest.raises(wf.WorkflowNotFound):
        wf.complete_task("not-a-uuid", "approve", None, idempotency_key="c1")
    with pytest.raises(wf.WorkflowNotFound):
        wf.reassign_task(uuid.uuid4(), assignee="zed", idempotency_key="r1")
    assert table_counts() == before


def test_completing_and_completed_tasks_are_refused():
    task_id = open_task(waiting_instance())
    wf.complete_task(task_id, "reject", None, idempotency_key="c1")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="being completed"):
        wf.complete_task(task_id, "reject", None, idempotency_key="c2")
    assert table_counts() == before
    command_id = tasks.get(task_id).reservation_command_id
    assert tasks.mark_completed(task_id, command_id, "reject", None)
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="COMPLETED"):
        wf.complete_task(task_id, "reject", None, idempotency_key="c3")
    assert table_counts() == before


def test_a_task_of_an_ended_instance_is_refused():
    workflow_id = waiting_instance()
    task_id = open_task(workflow_id)
    WorkflowInstance.objects.filter(pk=workflow_id).update(status="COMPLETED")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="instance has ended"):
        wf.complete_task(task_id, "reject", None, idempotency_key="c1")
    with pytest.raises(wf.WorkflowConflict, match="instance has ended"):
        wf.reassign_task(task_id, assignee="zed", idempotency_key="r1")
    assert table_counts() == before


def test_a_claim_that_finds_the_instance_ended_cancels_the_reserved_task():
    workflow_id = waiting_instance()
    task_id = open_task(workflow_id)
    receipt = wf.complete_task(task_id, "reject", None, idempotency_key="c1")
    WorkflowInstance.objects.filter(pk=workflow_id).update(status="COMPLETED")
    with transaction.atomic():
        claim = commands.claim(
            receipt.command_id, workflow_id, node_id="n", lease_seconds=30, max_attempts=5
        )
    assert claim.outcome == "SETTLED"
    assert WorkflowCommand.objects.get(pk=receipt.command_id).state == "REJECTED"
    assert tasks.get(task_id).status == "CANCELLED"


def test_settling_an_ended_instance_cancels_the_task_a_dead_completion_reserves():
    workflow_id = waiting_instance()
    task_id = open_task(workflow_id)
    receipt = wf.complete_task(task_id, "reject", None, idempotency_key="c1")
    WorkflowCommand.objects.filter(pk=receipt.command_id).update(state="DEAD")
    WorkflowInstance.objects.filter(pk=workflow_id).update(status="COMPLETED")
    with transaction.atomic():
        assert commands.settle_ended(workflow_id, cancelled=False) == 1
    assert WorkflowCommand.objects.get(pk=receipt.command_id).state == "REJECTED"
    assert tasks.get(task_id).status == "CANCELLED"


# -- reassign_task ---------------------------------------------------------------


def test_reassign_task_changes_the_assignee_with_a_history_entry():
    workflow_id = waiting_instance()
    task_id = open_task(workflow_id)
    done = wf.reassign_task(
        task_id, assignee="zed", idempotency_key="r1", actor=wf.Actor.user("boss")
    )
    assert (done.previous_assignee, done.assignee, done.duplicate) == ("ann", "zed", False)
    assert tasks.get(task_id).assignee == "zed"
    entry = [e for e in wf.history_of(workflow_id) if e["event_type"] == "TASK_REASSIGNED"]
    assert len(entry) == 1
    assert entry[0]["payload_json"] == {"taskId": str(task_id), "from": "ann", "to": "zed"}
    before = table_counts()
    again = wf.reassign_task(task_id, assignee="zed", idempotency_key="r1")
    assert again.duplicate and (again.previous_assignee, again.assignee) == ("ann", "zed")
    with pytest.raises(wf.WorkflowConflict, match="different reassignment"):
        wf.reassign_task(task_id, assignee="amy", idempotency_key="r1")
    assert table_counts() == before


def test_reassigning_a_completing_task_is_refused():
    task_id = open_task(waiting_instance())
    wf.complete_task(task_id, "reject", None, idempotency_key="c1")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="being completed"):
        wf.reassign_task(task_id, assignee="zed", idempotency_key="r1")
    assert table_counts() == before
    assert tasks.get(task_id).assignee == "ann"


# -- cancel ----------------------------------------------------------------------


def test_cancel_cancels_open_tasks_and_timers_with_their_commands():
    workflow_id = waiting_instance()
    open_id, reserved_id = open_task(workflow_id), open_task(workflow_id)
    completion = wf.complete_task(reserved_id, "reject", None, idempotency_key="c1")
    due = TimerSpec(uuid.uuid4(), "await_payment", "TASK_DUE", 3600, task_id=open_id)
    fired = TimerSpec(uuid.uuid4(), "await_payment", "STEP", 3600)
    (due_cmd, _), (fired_cmd, _) = timers.record(workflow_id, [due, fired])
    timers.mark_fired(fired.timer_id)
    open_commands = WorkflowCommand.objects.filter(
        workflow_id=workflow_id, state__in=["PENDING", "DEFERRED", "CLAIMED", "PARKED", "DEAD"]
    ).count()
    assert wf.cancel(workflow_id, reason="customer left")
    assert tasks.get(open_id).status == "CANCELLED"
    assert tasks.get(reserved_id).status == "CANCELLED"
    assert WorkflowTimer.objects.get(pk=due.timer_id).status == "CANCELLED"
    assert WorkflowTimer.objects.get(pk=fired.timer_id).status == "FIRED"
    for command_id in (due_cmd, fired_cmd, completion.command_id):
        command = WorkflowCommand.objects.get(pk=command_id)
        assert command.state == "CANCELLED"
        assert command.last_error.startswith("INSTANCE_CANCELLED: ")
        assert command.claim_token is None and command.settled_at is not None
    events = history_events(workflow_id)
    # one entry per cancelled command, none twice
    assert events.count("COMMAND_CANCELLED") == open_commands == 3
    assert events[-1] == "WORKFLOW_CANCELLED"


# -- tasks() ---------------------------------------------------------------------


def test_tasks_filters():
    first = waiting_instance("a")
    second = waiting_instance("b", scope="tenant-b")
    mine = open_task(first, assignee="ann", due_at_delay_seconds=60)
    theirs = open_task(first, assignee="bob", candidate_users=["cy"], candidate_groups=["ops"])
    other_scope = open_task(second, assignee="ann", candidate_groups=["finance"])
    done = open_task(first, assignee="ann")
    tasks.reserve(done, 1)
    tasks.mark_completed(done, 1, "reject", None)

    def ids(**filters: Any) -> set[uuid.UUID]:
        return {t.id for t in wf.tasks(**filters).items}

    assert ids() == {mine, theirs, other_scope, done}
    assert ids(assignee="ann") == {mine, other_scope, done}
    assert ids(assignee="ann", status="OPEN") == {mine, other_scope}
    assert ids(status=["OPEN", "COMPLETED"], scope="default") == {mine, theirs, done}
    assert ids(candidate_user="cy") == {theirs}
    assert ids(candidate_groups=["finance", "ops"]) == {theirs, other_scope}
    assert ids(scope="tenant-b") == {other_scope}
    assert ids(definition_id="order") == {mine, theirs, other_scope, done}
    assert ids(definition_id="other") == set()
    horizon = db.fetchone("SELECT now() + interval '1 hour'")[0]
    assert ids(due_before=horizon) == {mine}
    WorkflowInstance.objects.filter(pk=second).update(archived_at=horizon)
    assert ids(assignee="ann", status="OPEN") == {mine}
    assert ids(assignee="ann", status="OPEN", include_archived=True) == {mine, other_scope}
    view = wf.tasks(candidate_user="cy").items[0]
    assert (view.instance_id, view.decisions, view.scope) == (
        first,
        ("approve", "reject"),
        "default",
    )


def test_tasks_keyset_pagination_visits_every_task_once_newest_first():
    workflow_id = waiting_instance()
    created = [open_task(workflow_id) for _ in range(7)]
    # distinct and tied updated_at values
    for index, task_id in enumerate(created):
        WorkflowTask.objects.filter(pk=task_id).update(
            updated_at=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
            + datetime.timedelta(minutes=index // 2)
        )
    seen, cursor, pages = [], None, 0
    while True:
        page = wf.tasks(limit=3, cursor=cursor)
        seen.extend(page.items)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 3
    assert sorted(t.id for t in seen) == sorted(created)
    keys = [(-t.updated_at.timestamp(), str(t.id)) for t in seen]
    assert keys == sorted(keys)
    with pytest.raises(wf.WorkflowValidationError):
        wf.tasks(cursor="garbage")


def test_the_scope_filter_can_use_the_scope_keyset_index():
    workflow_id = waiting_instance()
    open_task(workflow_id)
    open_task(workflow_id)
    first = wf.tasks(scope="default", limit=1)
    assert first.next_cursor is not None
    sql, params, _ = tasks.query_sql(scope="default", cursor=first.next_cursor)
    with transaction.atomic(), connection.cursor() as cur:
        # a planner free of the tiny table's statistics: a scan it may pick is an index scan
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "idx_workflow_tasks_scope_updated_at" in plan


# -- can_complete ----------------------------------------------------------------


def test_can_complete_rules():
    task_id = open_task(waiting_instance(), assignee="ann", candidate_users=["bob"])
    view = wf.get_task(task_id)
    ann = User.objects.create_user("ann")
    bob = User.objects.create_user("bob")
    cat = User.objects.create_user("cat")
    dan = User.objects.create_user("dan")
    eve = User.objects.create_user("eve")
    cat.groups.add(Group.objects.create(name="managers"))
    dan.user_permissions.add(Permission.objects.get(codename="change_workflowtask"))
    dan = User.objects.get(pk=dan.pk)  # permission cache
    assert wf.can_complete(ann, view)  # assignee
    assert wf.can_complete(bob, task_id)  # candidate user, by id
    assert wf.can_complete(cat, tasks.get(task_id))  # candidate group, store row
    assert wf.can_complete(dan, view)  # model permission
    assert not wf.can_complete(eve, view)
    ann.is_active = False
    assert not wf.can_complete(ann, view)
    from django.contrib.auth.models import AnonymousUser

    assert not wf.can_complete(AnonymousUser(), view)
    assert not wf.can_complete(bob, uuid.uuid4())
