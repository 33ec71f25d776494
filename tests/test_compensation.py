"""Compensation: a fail path undoes the recorded steps in reverse order (issue 12)."""

from __future__ import annotations

from typing import Any

import pytest

import vertique_workflow as wf
from tests.flows.models import HandlerCall
from vertique_workflow.definitions import Workflow, action, end, fail
from vertique_workflow.exceptions import WorkflowDefinitionError
from vertique_workflow.models import WorkflowHistory
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def start(definition: str, payload: Any, key: str = "k1") -> Any:
    return wf.start(definition, payload, idempotency_key=key).id


def decisions(instance_id: Any) -> list[tuple[str, str]]:
    rows = WorkflowHistory.objects.filter(workflow_id=instance_id, event_type="DECISION")
    return [(str(r.step_id), str(r.outcome)) for r in rows.order_by("sequence")]


def test_compensations_run_in_reverse_order_each_once():
    instance = start("comp-order", {"refuse_ship": True})
    run_until_idle()
    view = wf.get(instance)
    assert view.status == "COMPENSATED"
    assert view.error_type == "SHIPPING_FAILED", "the fail step's reason is kept"
    assert view.current_step == "give_up"
    assert view.state["log"] == ["reserve", "charge", "refund_charge", "release"]
    steps = decisions(instance)
    assert ("give_up", "COMPENSATING") in steps and steps[-1] == ("give_up", "COMPENSATED")
    after = steps[steps.index(("give_up", "COMPENSATING")) :]
    assert [s for s, _ in after] == ["give_up", "refund_charge", "release", "give_up"]
    assert "recall" not in view.state["log"], "the failed service step was never recorded"
    ended = WorkflowHistory.objects.get(workflow_id=instance, event_type="WORKFLOW_COMPENSATED")
    assert ended.payload_json["step"] == "give_up"


def test_steps_not_yet_reached_are_not_compensated():
    instance = start("comp-order", {"early": True})
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("COMPENSATED", "STOPPED")
    assert view.state["log"] == ["reserve", "release"]


def test_a_completed_path_runs_no_compensation():
    instance = start("comp-order", {})
    run_until_idle()
    view = wf.get(instance)
    assert view.status == "COMPLETED"
    assert view.state["log"] == ["reserve", "charge"]


def test_a_plan_without_compensations_fails_as_before():
    instance = start("comp-plain", {})
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("FAILED", "PLAIN")
    assert decisions(instance)[-1] == ("stop", "FAILED")


def test_a_service_compensation_waits_for_its_result_then_compensated():
    instance = start("comp-payment", {"reject": True})
    run_until_idle(services=False)
    assert wf.get(instance).status == "WAITING"  # the charge's call
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("COMPENSATED", "REJECTED")
    refunds = HandlerCall.objects.filter(handler="refund")
    assert refunds.count() == 1
    outcomes = decisions(instance)
    assert ("refund", "SERVICE_COMPLETED") in outcomes


def test_the_instance_waits_compensating_at_the_compensation_service():
    from vertique_workflow.models import WorkflowServiceCall
    from vertique_workflow.side_effects.relay import Relay

    instance = start("comp-payment", {"reject": True})
    run_until_idle(services=False)
    assert Relay("test").run_once() == 1  # the charge's call
    run_until_idle(services=False)
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("COMPENSATING", "refund")
    pending = WorkflowServiceCall.objects.filter(workflow_id=instance, step_id="refund")
    assert [row.state for row in pending] == ["PENDING"]
    assert HandlerCall.objects.filter(handler="refund").count() == 0
    run_until_idle()
    assert wf.get(instance).status == "COMPENSATED"


def test_a_failed_compensation_fails_the_instance_and_retry_compensates_on():
    instance = start("comp-payment", {"reject": True, "refund_fail": 1})
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("FAILED", "COMPENSATION_FAILED")
    assert view.current_step == "refund"
    wf.retry(instance)
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("COMPENSATED", "REJECTED")
    assert HandlerCall.objects.filter(handler="refund").count() == 2
    assert [o for s, o in decisions(instance) if s == "rejected"] == [
        "COMPENSATING",
        "COMPENSATED",
    ], "the retry goes on compensating; it does not begin again"


def _plan_error(**steps: Any) -> str:
    body = {"id": "comp-bad", "version": 1, "contract": "comp-bad.v1", **steps}
    with pytest.raises(WorkflowDefinitionError) as caught:
        type("Bad", (Workflow,), body).plan()
    return str(caught.value)


def _noop(self: Any, state: dict, ctx: Any) -> dict:
    return state


def test_validation_of_compensate():
    assert "unknown step" in _plan_error(
        a=action(start=True, next="done", compensate="nope")(_noop), done=end()
    )
    assert "compensation is an action or a service" in _plan_error(
        a=action(start=True, next="done", compensate="done")(_noop), done=end()
    )
    assert "no step may go to it" in _plan_error(
        a=action(start=True, next="undo", compensate="undo")(_noop),
        undo=action(next="done")(_noop),
        done=end(),
    )
    assert "takes no next" in _plan_error(
        a=action(start=True, next="done", compensate="undo")(_noop),
        undo=action(next="other")(_noop),
        done=end(),
        other=fail(),
    )


def test_the_plan_hash_covers_compensate():
    from tests.flows.compensation import OrderSaga

    plan = OrderSaga.plan()
    assert plan.steps["reserve"].canonical()["compensate"] == "release"
    assert plan.compensation_steps == {"release", "refund_charge", "recall"}


def test_the_admin_and_the_diagram_render_the_new_statuses(admin_client):
    from django.urls import reverse

    from vertique_workflow import registry
    from vertique_workflow.models import WorkflowInstance

    registry.sync_code_definitions()
    compensated = start("comp-order", {"refuse_ship": True}, key="a-1")
    compensating = start("comp-payment", {"reject": True, "refund_fail": 9}, key="a-2")
    run_until_idle(services=False)
    from vertique_workflow.side_effects.relay import Relay

    Relay("test").run_once()
    run_until_idle(services=False)
    assert wf.get(compensated).status == "COMPENSATED"
    assert wf.get(compensating).status == "COMPENSATING"

    def change(pk: Any) -> str:
        return reverse("admin:vertique_workflow_workflowinstance_change", args=[pk])

    listing = reverse("admin:vertique_workflow_workflowinstance_changelist")
    pages = [
        listing,
        listing + "?status__exact=COMPENSATED",
        listing + "?status__exact=COMPENSATING",
        change(compensated),
        change(compensating),
        change(compensated) + "?at=5",
        reverse("admin:vertique_workflow_definition", args=["default", "comp-order", 1]),
    ]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
    body = admin_client.get(change(compensated)).content.decode()
    assert "COMPENSATED" in body and "refund_charge" in body
    assert WorkflowInstance.objects.get(pk=compensating).status == "COMPENSATING"


def test_the_document_form_declares_compensate_on_actions():
    from vertique_workflow.definitions.documents import compile_document, register_callable

    @register_callable(name="tests.comp.step")
    def step(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return state

    text = (
        "id: doc-comp\nversion: 1\nsteps:\n"
        "  book: {kind: action, callback: tests.comp.step, next: stop, compensate: unbook}\n"
        "  stop: {kind: fail, reason: NOPE}\n"
        "  unbook: {kind: action, callback: tests.comp.step}\n"
    )
    plan = compile_document(text)
    assert plan.steps["book"].compensate == "unbook"
    assert plan.compensation_steps == {"unbook"}
    assert plan.canonical()["steps"]["book"]["compensate"] == "unbook"
    with pytest.raises(WorkflowDefinitionError, match="an action needs next"):
        compile_document(text.replace(", next: stop, compensate: unbook", ""))
    with pytest.raises(WorkflowDefinitionError, match="unknown step"):
        compile_document(text.replace("compensate: unbook", "compensate: nowhere"))
