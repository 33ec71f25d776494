"""Service steps: the outbox, the relay, retries, failures and dispatch dedup (issue 12)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

import vertique_workflow as wf
from tests.conftest import history_events
from tests.flows.models import HandlerCall
from vertique_workflow.models import WorkflowCommand, WorkflowDedup, WorkflowServiceCall
from vertique_workflow.side_effects.relay import Relay
from vertique_workflow.store import outbox
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def start(definition: str, payload: Any, key: str = "k1") -> Any:
    return wf.start(definition, payload, idempotency_key=key).id


def outcomes(instance_id: Any) -> list[str]:
    """The decision outcomes of an instance's history (SERVICE_DISPATCHED, ...)."""
    from vertique_workflow.models import WorkflowHistory

    rows = WorkflowHistory.objects.filter(workflow_id=instance_id, event_type="DECISION")
    return [str(row.outcome) for row in rows.order_by("sequence")]


def calls(handler: str = "charge") -> list[int]:
    return list(HandlerCall.objects.filter(handler=handler).values_list("attempt", flat=True))


def test_a_service_step_records_its_call_in_the_segment_and_waits():
    instance = start("svc-charge", {"amount": 5})
    run_until_idle(services=False)
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "pay")
    [row] = WorkflowServiceCall.objects.filter(workflow_id=instance)
    assert (row.state, row.handler, row.step_id, row.request_json) == (
        "PENDING",
        "test.charge",
        "pay",
        {"amount": 5},
    )
    assert row.policy_json["attempts"] == 3
    assert row.dispatch_key.startswith(f"vertique.service:{instance}:")
    assert calls() == [], "nothing is called inside the segment"
    assert WorkflowDedup.objects.filter(kind="DISPATCH", key=row.dispatch_key).count() == 1
    assert "SERVICE_DISPATCHED" in outcomes(instance)


def test_the_relay_calls_the_handler_and_the_workflow_takes_the_success_path():
    instance = start("svc-charge", {"amount": 7})
    report = run_until_idle()
    view = wf.get(instance)
    assert view.status == "COMPLETED"
    assert view.state["charge"] == {"charge_id": "ch-7", "calls": 1}
    assert view.state["charge_status"] == "COMPLETED"
    assert report.count("SERVICE_DELIVERED") == 1
    [row] = WorkflowServiceCall.objects.filter(workflow_id=instance)
    assert (row.state, row.outcome, row.attempts) == ("DELIVERED", "COMPLETED", 1)
    assert history_events(instance).count("SERVICE_RESULT") == 1
    assert "SERVICE_COMPLETED" in outcomes(instance)


def test_retries_honour_the_policy_then_succeed():
    instance = start("svc-charge", {"amount": 3, "fail_times": 2})
    report = run_until_idle()
    assert wf.get(instance).status == "COMPLETED"
    assert calls() == [1, 2, 3]
    assert report.count("SERVICE_RETRIED") == 2
    assert wf.get(instance).state["charge"]["calls"] == 3


def test_spent_attempts_take_the_failure_path_with_the_reason():
    instance = start("svc-charge", {"amount": 3, "fail_times": 5})
    run_until_idle()
    view = wf.get(instance)
    assert calls() == [1, 2, 3], "attempts=3 bounds the calls"
    assert (view.status, view.current_step) == ("COMPLETED", "declined")
    assert view.state["charge_status"] == "FAILED"
    assert view.state["error"].startswith("ATTEMPTS_EXHAUSTED: attempt 3 of 3")
    [row] = WorkflowServiceCall.objects.filter(workflow_id=instance)
    assert (row.state, row.outcome) == ("DELIVERED", "FAILED")


def test_an_error_retry_on_does_not_name_fails_at_once():
    instance = start("svc-charge", {"amount": 3, "refuse": True})
    run_until_idle()
    assert calls() == [1]
    view = wf.get(instance)
    assert view.current_step == "declined"
    assert view.state["error"].startswith("HANDLER_FAILED: attempt 1 of 3: Refused")
    assert "card declined" not in view.state["error"], "the exception's message is not stored"


def test_a_handlers_non_retryable_code_is_the_reason():
    instance = start("svc-charge", {"amount": 3, "non_retryable": True})
    run_until_idle()
    assert calls() == [1]
    assert wf.get(instance).state["error"].startswith("CARD_DECLINED:")


def test_a_result_failing_the_result_schema_takes_the_failure_path_with_a_clear_reason():
    instance = start("svc-charge", {"amount": 3, "bad_result": True})
    run_until_idle()
    view = wf.get(instance)
    assert (view.current_step, view.state["error"]) == ("declined", "SERVICE_RESULT_INVALID")
    assert "SERVICE_FAILED" in outcomes(instance), "the failure is in the history"


def test_without_on_failed_the_instance_fails_service_failed():
    instance = start("svc-strict", {"refuse": True})
    run_until_idle()
    view = wf.get(instance)
    assert view.status == "FAILED"
    assert view.error_type == "SERVICE_FAILED"
    assert view.error_message.startswith(
        "SERVICE_FAILED: the call of service step 'pay' failed (ATTEMPTS_EXHAUSTED: attempt 1 of 1"
    )


def test_a_hanging_handler_is_bounded_by_its_timeout_and_retried():
    from tests.flows.services import release_hung_handlers

    instance = start("svc-hang", {})
    try:
        report = run_until_idle()
    finally:
        release_hung_handlers()
    assert calls("hang") == [1, 2]
    assert report.count("SERVICE_RETRIED") == 1
    [row] = WorkflowServiceCall.objects.filter(workflow_id=instance)
    assert row.outcome == "COMPLETED"
    assert wf.get(instance).status == "COMPLETED"


def test_duplicate_result_deliveries_are_absorbed():
    instance = start("svc-charge", {"amount": 2})
    run_until_idle(services=False)
    [claimed] = outbox.claim(10, "00000000-0000-0000-0000-000000000001", "test", 30)
    from vertique_workflow.operations import record_service_result

    with transaction.atomic():
        assert record_service_result(claimed, "COMPLETED", {"charge_id": "x"}, None, 1)
    with transaction.atomic():
        assert not record_service_result(claimed, "COMPLETED", {"charge_id": "x"}, None, 1)
    run_until_idle(services=False)
    assert wf.get(instance).status == "COMPLETED"
    assert WorkflowCommand.objects.filter(workflow_id=instance, kind="SIGNAL").count() == 1, (
        "one result command"
    )


def test_a_segment_run_inside_a_transaction_that_rolls_back_leaves_no_call():
    # the start and its segment run inside the caller's transaction (run_until_idle on
    # the test's connection); the caller rolls back: the outbox row goes with it
    with pytest.raises(RuntimeError), transaction.atomic():
        start("svc-charge", {"amount": 1})
        run_until_idle(services=False)
        assert WorkflowServiceCall.objects.count() == 1, "the segment recorded it"
        raise RuntimeError("roll back")
    assert WorkflowServiceCall.objects.count() == 0
    assert WorkflowDedup.objects.filter(kind="DISPATCH").count() == 0


def test_each_branch_dispatches_its_own_call():
    instance = start("svc-fan", {"amount": 4})
    run_until_idle()
    rows = WorkflowServiceCall.objects.filter(workflow_id=instance).order_by("step_id")
    assert [(r.step_id, r.branch_id, r.state) for r in rows] == [
        ("pay_a", "a", "DELIVERED"),
        ("pay_b", "b", "DELIVERED"),
    ]
    assert len({r.dispatch_key for r in rows}) == 2
    assert wf.get(instance).status == "COMPLETED"


def test_a_cancelled_instance_is_never_called():
    instance = start("svc-charge", {"amount": 1})
    run_until_idle(services=False)
    wf.cancel(instance, reason="changed my mind")
    assert Relay("test").run_once() == 0
    assert calls() == []
    assert WorkflowServiceCall.objects.get(workflow_id=instance).state == "CANCELLED"


def test_the_service_result_signal_name_is_reserved():
    instance = start("svc-charge", {"amount": 1})
    with pytest.raises(wf.WorkflowValidationError, match="reserved"):
        wf.signal(instance, "vertique.service_result", {}, dedup_key="x")


def test_two_relays_never_take_the_same_call():
    for n in range(6):
        start("svc-charge", {"amount": n}, key=f"k{n}")
    run_until_idle(services=False)
    first = outbox.claim(4, "00000000-0000-0000-0000-00000000000a", "one", 30)
    second = outbox.claim(4, "00000000-0000-0000-0000-00000000000b", "two", 30)
    assert len(first) == 4 and len(second) == 2
    assert not {c.id for c in first} & {c.id for c in second}
    assert connection.in_atomic_block is False


def test_a_relay_whose_lease_passed_settles_nothing_and_the_other_relay_delivers_once():
    from vertique_workflow.side_effects.relay import deliver

    instance = start("svc-charge", {"amount": 6})
    run_until_idle(services=False)
    # a lease already past on the database clock: a relay that hung
    [stale] = outbox.claim(1, "00000000-0000-0000-0000-0000000000a1", "slow", -40)
    [fresh] = outbox.claim(1, "00000000-0000-0000-0000-0000000000b2", "fast", 30)
    assert (stale.id, fresh.attempts) == (fresh.id, 2), "the expired claim was taken over"
    assert deliver(fresh, "COMPLETED", {"charge_id": "ch-6"}, None)
    assert not deliver(stale, "COMPLETED", {"charge_id": "ch-6"}, None), "fenced out"
    run_until_idle(services=False)
    assert wf.get(instance).state["charge"] == {"charge_id": "ch-6"}
    assert history_events(instance).count("SERVICE_RESULT") == 1
    assert WorkflowServiceCall.objects.get(workflow_id=instance).claimed_by == "fast"


def test_the_admin_shows_an_instances_service_calls_and_the_diagram_draws_the_step(admin_client):
    from vertique_workflow.definitions import catalog
    from vertique_workflow.diagram import render_svg

    instance = start("svc-charge", {"amount": 3, "fail_times": 5})
    run_until_idle()
    page = admin_client.get(f"/admin/vertique_workflow/workflowinstance/{instance}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="service-calls"' in body and "test.charge" in body
    assert "ATTEMPTS_EXHAUSTED: attempt 3 of 3" in body
    listing = admin_client.get("/admin/vertique_workflow/workflowservicecall/?state=DELIVERED")
    assert listing.status_code == 200 and "test.charge" in listing.content.decode()
    assert "service test.charge" in render_svg(catalog.get("svc-charge", 1))


def test_an_unregistered_handler_name_fails_the_system_check_at_startup():
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from vertique_workflow import registry
    from vertique_workflow.definitions import Workflow, catalog, end, service

    class Unregistered(Workflow[dict]):
        id, version, contract = "svc-unregistered", 1, "svc-unregistered.v1"
        pay = service("nobody.registered.this", start=True, next="done")
        done = end()

    plan = catalog.register(Unregistered)
    try:
        with pytest.raises(SystemCheckError) as refused:
            call_command("check")
        text = str(refused.value)
        assert "vertique_workflow.E020" in text
        assert "'svc-unregistered' v1 step 'pay'" in text
        assert "'nobody.registered.this'" in text
    finally:
        catalog.remove(plan.id, plan.version)
        registry._reset_sync_state()
    call_command("check")  # the registered handlers of the other plans pass


def test_handlers_listed_in_the_settings_are_found_by_name(settings):
    from vertique_workflow.side_effects.handlers import get_handler, handler_names

    settings.VERTIQUE_WORKFLOW = {
        "SERVICE_HANDLERS": {"listed.charge": "tests.flows.services.charge"}
    }
    from tests.flows.services import charge

    assert "listed.charge" in handler_names()
    assert get_handler("listed.charge") is charge


def test_a_missing_required_recorder_fails_the_transition_with_a_clear_error(settings):
    settings.VERTIQUE_WORKFLOW = {"RECORDERS": []}
    instance = start("svc-charge", {"amount": 1})
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("FAILED", "SIDE_EFFECT_RECORDER_MISSING")
    assert "step 'pay'" in view.error_message
    assert WorkflowServiceCall.objects.count() == 0


def test_the_call_recorded_by_a_segment_that_rolled_back_never_exists():
    from tests.flows.services import explode_next_attempts
    from vertique_workflow.executor.segment import run_next

    explode_next_attempts(1)
    instance = start("svc-rollback", {"amount": 8})
    outcome = run_next("test-node")
    assert outcome is not None and outcome.result == "RETRIED", "branch b raised: rolled back"
    assert WorkflowServiceCall.objects.count() == 0, "branch a's call went with the segment"
    assert WorkflowDedup.objects.filter(kind="DISPATCH").count() == 0
    run_until_idle()
    [row] = WorkflowServiceCall.objects.filter(workflow_id=instance)
    assert (row.state, row.branch_id) == ("DELIVERED", "a")
    assert calls() == [1], "called once, by the segment that committed"
    assert wf.get(instance).status == "COMPLETED"
