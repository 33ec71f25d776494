"""Workflow events: the events recorder, consumers in (txid, id) order, the Django signal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import in_threads
from vertique_workflow.models import WorkflowEvent
from vertique_workflow.side_effects import events as workflow_events
from vertique_workflow.side_effects.signals import workflow_event
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

RECORDERS = [
    "vertique_workflow.side_effects.outbox.ServiceOutboxRecorder",
    "vertique_workflow.side_effects.events.EventsRecorder",
]


@pytest.fixture
def recorded() -> Iterator[None]:
    """The events recorder installed (on top of the test settings)."""
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "RECORDERS": RECORDERS}
    ):
        yield


@pytest.fixture
def heard() -> Iterator[list[Any]]:
    """A ``workflow_event`` receiver; the events it received, in order."""
    received: list[Any] = []

    def receiver(sender: Any, event: Any, **_: Any) -> None:
        received.append(event)

    workflow_event.connect(receiver, weak=False, dispatch_uid="test-events")
    try:
        yield received
    finally:
        workflow_event.disconnect(dispatch_uid="test-events")


def types_of(instance_id: Any) -> list[str]:
    rows = WorkflowEvent.objects.filter(workflow_id=instance_id).order_by("txid", "id")
    return [row.event_type for row in rows]


def drain(consumer: str) -> list[Any]:
    """Read and acknowledge until nothing is left; every event read, in order."""
    seen: list[Any] = []
    while batch := wf.events(consumer, limit=7):
        seen.extend(batch)
        assert wf.ack_events(consumer, batch[-1])
    return seen


def test_a_run_records_one_event_per_transition_fact_in_order(recorded):
    instance = wf.start("order", {"amount": 5}, idempotency_key="e1").id
    run_until_idle()
    assert types_of(instance) == [
        "WORKFLOW_STARTED",
        "STEP_ENTERED",
        "STEP_ENTERED",
        "STEP_ENTERED",
        "WORKFLOW_WAITING",
    ]
    wf.signal(instance, "paid", {"amount_paid": 5}, dedup_key="paid-1")
    run_until_idle()
    assert types_of(instance)[5:] == [
        "SIGNAL_APPLIED",
        "STEP_ENTERED",
        "STEP_ENTERED",
        "WORKFLOW_COMPLETED",
    ], "the wait the signal ends is left, not entered"
    steps = [
        r.step_id
        for r in WorkflowEvent.objects.filter(
            workflow_id=instance, event_type="STEP_ENTERED"
        ).order_by("txid", "id")
    ]
    assert steps == ["reserve", "route", "await_payment", "ship", "done"]
    waiting = WorkflowEvent.objects.get(workflow_id=instance, event_type="WORKFLOW_WAITING")
    assert (waiting.step_id, waiting.data_json) == ("await_payment", {"waiting": ["paid"]})
    assert set(types_of(instance)) <= set(wf.EVENT_TYPES)


def test_a_consumer_gets_each_event_once_and_an_ack_never_moves_back(recorded):
    first = wf.start("order", {"amount": 0}, idempotency_key="e2").id
    run_until_idle()
    seen = drain("billing")
    assert [e.event_type for e in seen] == types_of(first)
    assert all(e.workflow_id == first for e in seen)
    assert wf.events("billing") == []
    assert not wf.ack_events("billing", seen[0]), "an older ack changes nothing"
    second = wf.start("order", {"amount": 0}, idempotency_key="e3").id
    run_until_idle()
    later = wf.events("billing")
    assert [e.workflow_id for e in later] == [second] * len(types_of(second))
    assert [e.event_type for e in drain("audit")] == types_of(first) + types_of(second)


def test_no_events_are_recorded_when_the_recorder_is_not_installed():
    instance = wf.start("order", {"amount": 0}, idempotency_key="e4").id
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"
    assert WorkflowEvent.objects.count() == 0
    assert not workflow_events.listening()


def test_a_rolled_back_segment_leaves_no_events(recorded, monkeypatch):
    from vertique_workflow.executor import effects as executor_effects

    real = executor_effects.persist
    broken = {"left": 1}

    def persist_then_fail(*args: Any, **kwargs: Any) -> Any:
        entries = real(*args, **kwargs)
        assert WorkflowEvent.objects.exists(), "the events were inserted in the segment"
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("the segment fails after recording its events")
        return entries

    monkeypatch.setattr(executor_effects, "persist", persist_then_fail)
    instance = wf.start("order", {"amount": 0}, idempotency_key="e5").id
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"
    assert broken["left"] == 0
    assert types_of(instance).count("WORKFLOW_STARTED") == 1, "the rolled-back events never exist"
    assert types_of(instance).count("WORKFLOW_COMPLETED") == 1


def test_the_signal_is_sent_after_commit_and_not_on_rollback(heard):
    instance = wf.start("order", {"amount": 5}, idempotency_key="e6").id
    run_until_idle()
    assert heard[0].event_type == "WORKFLOW_STARTED"
    assert heard[-1].event_type == "WORKFLOW_WAITING"
    assert all(e.id is None for e in heard), "no recorder: the signal alone carries them"
    assert WorkflowEvent.objects.count() == 0
    heard.clear()
    with transaction.atomic():
        workflow_events.emit(
            [workflow_events.EmitEvent("WORKFLOW_WAITING", "await_payment")],
            instance,
            None,
            "order",
            1,
        )
        assert heard == [], "nothing is sent before the commit"
    assert [e.event_type for e in heard] == ["WORKFLOW_WAITING"]
    heard.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        workflow_events.emit(
            [workflow_events.EmitEvent("WORKFLOW_WAITING", "await_payment")],
            instance,
            None,
            "order",
            1,
        )
        raise RuntimeError("roll back")
    assert heard == []


def test_a_raising_receiver_does_not_disturb_the_others(heard, caplog):
    def broken(sender: Any, event: Any, **_: Any) -> None:
        raise ValueError("secret=hunter2")

    workflow_event.connect(broken, weak=False, dispatch_uid="test-broken")
    try:
        instance = wf.start("order", {"amount": 0}, idempotency_key="e7").id
        run_until_idle()
    finally:
        workflow_event.disconnect(dispatch_uid="test-broken")
    assert wf.get(instance).status == "COMPLETED"
    assert heard[-1].event_type == "WORKFLOW_COMPLETED"
    ours = [r for r in caplog.records if r.name == "vertique_workflow.events"]
    assert ours and all("ValueError" in r.getMessage() for r in ours)
    assert not any("hunter2" in r.getMessage() for r in ours), "never the exception's text"


def test_recorded_events_reach_the_signal_with_their_position(recorded, heard):
    instance = wf.start("order", {"amount": 0}, idempotency_key="e8").id
    run_until_idle()
    stored = list(WorkflowEvent.objects.filter(workflow_id=instance).order_by("txid", "id"))
    assert [(e.id, e.txid) for e in heard] == [(r.id, r.txid) for r in stored]


def test_cancel_emits_workflow_cancelled(recorded, heard):
    instance = wf.start("order", {"amount": 5}, idempotency_key="e9").id
    run_until_idle()
    heard.clear()
    assert wf.cancel(instance, reason="customer left")
    assert types_of(instance)[-1] == "WORKFLOW_CANCELLED"
    cancelled = WorkflowEvent.objects.get(workflow_id=instance, event_type="WORKFLOW_CANCELLED")
    assert cancelled.data_json == {"reason": "customer left"}
    assert [e.event_type for e in heard] == ["WORKFLOW_CANCELLED"]


def test_a_late_committing_event_is_not_skipped(recorded):
    held = wf.start("order", {"amount": 5}, idempotency_key="e10").id
    run_until_idle()
    drain("late")
    opened = threading.Event()
    release = threading.Event()

    def hold_open() -> int:
        with transaction.atomic():
            workflow_events.emit(
                [workflow_events.EmitEvent("WORKFLOW_WAITING", "held")], held, None, "order", 1
            )
            opened.set()
            assert release.wait(60)
            return WorkflowEvent.objects.filter(step_id="held").get().id

    def holder_thread() -> None:
        try:
            results.append(hold_open())
        finally:
            connections.close_all()

    holder = threading.Thread(target=holder_thread)
    results: list[int] = []
    holder.start()
    try:
        assert opened.wait(60)
        with transaction.atomic():
            workflow_events.emit(
                [workflow_events.EmitEvent("WORKFLOW_WAITING", "later")], held, None, "order", 1
            )
        # the later event committed; the held one (smaller id) has not
        assert wf.events("late") == [], "nothing past a transaction still running"
    finally:
        release.set()
        holder.join(60)
    [held_id] = results
    seen = drain("late")
    assert [e.step_id for e in seen] == ["held", "later"]
    assert seen[0].id == held_id and seen[0].id < seen[1].id


def test_concurrent_executors_deliver_every_event_once_in_instance_order(recorded):
    instances = [
        wf.start("order", {"amount": 0 if n % 2 else 5}, idempotency_key=f"c{n}").id
        for n in range(24)
    ]
    done = threading.Event()
    from vertique_workflow.executor.segment import run_next

    def executor(node: str) -> int:
        ran = 0
        while run_next(node) is not None:
            ran += 1
        return ran

    def consumer() -> list[Any]:
        seen: list[Any] = []
        while True:
            finished = done.is_set()  # read before the last batch: nothing is missed
            batch = wf.events("concurrent", limit=5)
            if batch:
                seen.extend(batch)
                assert wf.ack_events("concurrent", batch[-1])
            elif finished:
                return seen

    reader: list[Any] = []

    def consumer_thread() -> None:
        try:
            reader.append(consumer())
        finally:
            connections.close_all()

    thread = threading.Thread(target=consumer_thread)
    thread.start()
    try:
        in_threads(*[lambda n=n: executor(f"node-{n}") for n in range(3)])
    finally:
        done.set()
        thread.join(120)
    [seen] = reader
    ids = [e.id for e in seen]
    assert len(ids) == len(set(ids)), "no event delivered twice"
    stored = list(WorkflowEvent.objects.order_by("txid", "id").values_list("id", flat=True))
    assert sorted(ids) == sorted(stored), "every event delivered"
    for instance in instances:
        mine = [e for e in seen if e.workflow_id == instance]
        assert [e.event_type for e in mine] == types_of(instance)
        assert mine[0].event_type == "WORKFLOW_STARTED"


def events_of(instance_id: Any) -> list[WorkflowEvent]:
    return list(WorkflowEvent.objects.filter(workflow_id=instance_id).order_by("txid", "id"))


def test_a_task_emits_opened_then_completed(recorded):
    from vertique_workflow.models import WorkflowTask

    instance = wf.start("review", {"manager": "ann"}, idempotency_key="t1").id
    run_until_idle()
    task = WorkflowTask.objects.get(workflow_id=instance)
    [opened] = [e for e in events_of(instance) if e.event_type == "TASK_OPENED"]
    assert (opened.step_id, opened.data_json["taskId"]) == ("review", str(task.id))
    wf.complete_task(task.id, "approve", idempotency_key="c1")
    run_until_idle()
    [completed] = [e for e in events_of(instance) if e.event_type == "TASK_COMPLETED"]
    assert completed.data_json == {"taskId": str(task.id), "decision": "approve"}
    assert types_of(instance)[-1] == "WORKFLOW_COMPLETED"


def test_a_service_step_emits_service_dispatched(recorded):
    instance = wf.start("svc-charge", {"amount": 5}, idempotency_key="s1").id
    run_until_idle(services=False)
    [dispatched] = [e for e in events_of(instance) if e.event_type == "SERVICE_DISPATCHED"]
    assert dispatched.step_id == "pay"
    assert dispatched.data_json["dispatchKey"].startswith(f"vertique.service:{instance}:")


def test_branch_steps_carry_the_branch_identity(recorded):
    instance = wf.start("parallel", {}, idempotency_key="b1").id
    run_until_idle()
    entered = {
        (e.step_id, e.fork_step_id, e.branch_id)
        for e in events_of(instance)
        if e.event_type == "STEP_ENTERED"
    }
    assert {("run_a", "split", "a"), ("wait_b", "split", "b"), ("wait_c", "split", "c")} <= entered
    assert ("split", None, None) in entered
    wf.signal(instance, "go", None, dedup_key="go-b", branch=("split", "b"))
    run_until_idle()
    [applied] = [e for e in events_of(instance) if e.event_type == "SIGNAL_APPLIED"]
    assert applied.data_json == {"signal": "go", "forkStepId": "split", "branchId": "b"}
    after = [e for e in events_of(instance) if e.txid == applied.txid]
    assert ("finish_b", "split", "b") in {(e.step_id, e.fork_step_id, e.branch_id) for e in after}
    assert ("wait_b", "split", "b") not in {
        (e.step_id, e.fork_step_id, e.branch_id) for e in after if e.event_type == "STEP_ENTERED"
    }, "the wait the signal ends is left, not entered"


def test_a_failed_step_emits_workflow_failed(recorded, heard):
    from tests.flows.workflows import Billing

    Billing.non_retryable = True
    instance = wf.start("billing", {}, idempotency_key="f1").id
    run_until_idle()
    wf.signal(instance, "charge", None, dedup_key="charge-1")
    run_until_idle()
    assert wf.get(instance).status == "FAILED"
    [failed] = [e for e in events_of(instance) if e.event_type == "WORKFLOW_FAILED"]
    from vertique_workflow.models import WorkflowInstance

    stored = WorkflowInstance.objects.get(id=instance)
    assert (failed.step_id, failed.data_json) == ("charge", {"errorType": stored.error_type})
    assert stored.error_type
    assert heard[-1].event_type == "WORKFLOW_FAILED"
