"""Child workflows (``call``): started in the parent's segment, outcome back as a command."""

from __future__ import annotations

from typing import Any

import pytest

import vertique_workflow as wf
from tests.conftest import history_events
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def start(definition: str, payload: Any = None, key: str = "k1") -> Any:
    ref = wf.start(definition, payload or {}, idempotency_key=key)
    run_until_idle()
    return ref.id


def test_a_call_starts_the_child_and_the_parent_takes_on_completed_with_its_result():
    parent = start("parent", {"n": 3})
    [child] = wf.children(parent)
    assert (child.definition_id, child.status, child.state) == (
        "child",
        "WAITING",
        {"n": 3, "fail": False},
    )
    metadata = WorkflowInstance.objects.get(pk=child.id).metadata
    assert metadata["parent"] == {"id": str(parent), "stepId": "delegate"}
    assert wf.get(parent).current_step == "delegate"
    wf.signal(child.id, "finish", {"finished": True}, dedup_key="f1")
    run_until_idle()
    view = wf.get(parent)
    assert (view.status, view.state["child_status"], view.state["child_finished"]) == (
        "COMPLETED",
        "COMPLETED",
        True,
    )
    assert "CHILD_ENDED" in history_events(parent)


def test_a_failed_child_takes_the_parents_on_failed_path():
    parent = start("parent", {"fail": True})
    [child] = wf.children(parent)
    assert child.status == "FAILED"
    view = wf.get(parent)
    assert (view.status, view.state["recovered"], view.state["child_status"]) == (
        "COMPLETED",
        True,
        "FAILED",
    )


def test_cancelling_the_parent_cancels_its_live_children():
    parent = start("parent")
    [child] = wf.children(parent)
    assert wf.cancel(parent, reason="no longer needed")
    assert wf.get(child.id).status == "CANCELLED"
    assert wf.get(parent).status == "CANCELLED"
    assert run_until_idle().outcomes in ([], ["SETTLED"])
    outcome = WorkflowCommand.objects.get(workflow_id=parent, kind="SIGNAL")
    assert outcome.state == "CANCELLED", "the child's end reached a parent already cancelled"


def test_a_child_is_started_once_per_call_and_its_outcome_recorded_once():
    parent = start("parent")
    [child] = wf.children(parent)
    wf.signal(child.id, "finish", None, dedup_key="f1")
    run_until_idle()
    outcomes = WorkflowCommand.objects.filter(workflow_id=parent, kind="SIGNAL")
    assert outcomes.count() == 1
    assert WorkflowInstance.objects.filter(definition_id="child").count() == 1


def test_a_fan_out_of_child_workflows_joins_when_every_child_has_ended():
    parent = start("fan-call", {"items": [1, 2, 3]})
    children = wf.children(parent)
    assert sorted(c.state["n"] for c in children) == [1, 2, 3]
    for child in children:
        wf.signal(child.id, "finish", None, dedup_key=f"f-{child.id}")
    run_until_idle()
    assert wf.get(parent).status == "COMPLETED"
    branches = {b.branch_id: b.status for b in wf.branches(parent)}
    assert branches == {"0": "COMPLETED", "1": "COMPLETED", "2": "COMPLETED"}


def test_the_reserved_child_signal_name_cannot_be_sent():
    parent = start("parent")
    with pytest.raises(wf.WorkflowValidationError, match="reserved"):
        wf.signal(parent, "vertique.child_ended", {}, dedup_key="x")


def test_a_child_whose_start_is_dead_lettered_takes_the_parents_on_failed():
    parent = start("exhausted-parent")
    [child] = wf.children(parent)
    assert (child.status, child.error_type) == ("FAILED", "ATTEMPTS_EXHAUSTED")
    view = wf.get(parent)
    assert (view.status, view.state) == ("COMPLETED", {"fell_back": True})


def test_a_child_failed_by_a_non_retryable_error_fails_a_parent_without_on_failed():
    parent = start("refused-parent")
    [child] = wf.children(parent)
    assert (child.status, child.error_type) == ("FAILED", "OUT_OF_STOCK")
    view = wf.get(parent)
    assert (view.status, view.error_type) == ("FAILED", "CHILD_FAILED")
