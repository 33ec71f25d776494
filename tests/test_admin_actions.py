"""The admin's instance actions: cancel, retry (instance and branch), signal, and bulk.

Each success is recorded through the public operations with the admin user
as the actor and the form's reason, and the instance moves on once the
executor ran; every refusal is a clear message and writes nothing; a
double submit of one form records once.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.flows.workflows import Gate, Gifts
from vertique_workflow.models import WorkflowCommand, WorkflowHistory
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]


def action_url(name: str, instance_id: Any) -> str:
    return reverse(f"admin:vertique_workflow_workflowinstance_{name}", args=[instance_id])


def instance_page(instance_id: Any) -> str:
    return action_url("change", instance_id)


def changelist() -> str:
    return reverse("admin:vertique_workflow_workflowinstance_changelist")


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def form_key(response: Any) -> str:
    """The hidden idempotency key the form page drew."""
    match = re.search(r'name="idempotency_key" value="([0-9a-f-]{36})"', response.text)
    assert match, "the form carries a hidden idempotency key"
    return match.group(1)


def waiting_order(key: str = "o-1", amount: int = 5) -> uuid.UUID:
    ref = wf.start("order", {"amount": amount}, idempotency_key=key, business_key=key.upper())
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    return ref.id


def completed_order() -> uuid.UUID:
    ref = wf.start("order", {"amount": 0}, idempotency_key="free", business_key="FREE")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    return ref.id


def failed_shipment(key: str = "s-1") -> uuid.UUID:
    Gate.fail_times = 100  # every attempt fails: the START is dead-lettered
    ref = wf.start("shipment", {"ref": key}, idempotency_key=key)
    run_until_idle()
    assert wf.get(ref.id).status == "FAILED"
    Gate.fail_times = 0  # the cause fixed: a retry now succeeds
    return ref.id


def commands(instance_id: Any, kind: str) -> list[WorkflowCommand]:
    return list(WorkflowCommand.objects.filter(workflow_id=instance_id, kind=kind).order_by("seq"))


@pytest.fixture
def operator(db: Any) -> Client:
    """A staff user holding the instance action permission (and view), not a superuser."""
    user = User.objects.create_user("olga", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="change_workflowinstance"),
        Permission.objects.get(codename="view_workflowinstance"),
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db: Any) -> Client:
    """A staff user who may only view instances."""
    user = User.objects.create_user("vic", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflowinstance"))
    client = Client()
    client.force_login(user)
    return client


# -- cancel ---------------------------------------------------------------------------


def test_cancel_records_the_admin_user_and_the_reason(admin_client):
    instance = waiting_order()
    page = admin_client.get(action_url("cancel", instance))
    assert page.status_code == 200
    assert "Cancel the instance" in page.text and "csrfmiddlewaretoken" in page.text
    response = admin_client.post(
        action_url("cancel", instance),
        {"reason": "customer called", "idempotency_key": form_key(page)},
    )
    assert response.status_code == 302 and response.url == instance_page(instance)
    assert texts(response) == [f"Instance {instance} cancelled."]
    assert wf.get(instance).status == "CANCELLED"
    entry = WorkflowHistory.objects.get(workflow_id=instance, event_type="WORKFLOW_CANCELLED")
    assert (entry.actor_kind, entry.actor_id, entry.actor_reason, entry.attribution_status) == (
        "USER",
        "admin",
        "customer called",
        "ASSERTED",
    )
    assert entry.payload_json == {"reason": "customer called"}


def test_cancel_twice_with_one_form_records_once(admin_client):
    instance = waiting_order()
    data = {"reason": "double click", "idempotency_key": str(uuid.uuid4())}
    admin_client.post(action_url("cancel", instance), data)
    before = table_counts()
    again = admin_client.post(action_url("cancel", instance), data)
    assert again.status_code == 302
    assert "had already ended (CANCELLED): nothing was recorded" in texts(again)[-1]
    assert table_counts() == before
    assert (
        WorkflowHistory.objects.filter(
            workflow_id=instance, event_type="WORKFLOW_CANCELLED"
        ).count()
        == 1
    )


def test_cancel_without_a_reason_is_a_form_error_and_writes_nothing(admin_client):
    instance = waiting_order()
    before = table_counts()
    response = admin_client.post(
        action_url("cancel", instance), {"reason": "  ", "idempotency_key": str(uuid.uuid4())}
    )
    assert response.status_code == 200
    assert "This field is required." in response.text
    assert table_counts() == before
    assert wf.get(instance).status == "WAITING"


def test_instance_actions_need_the_change_permission(viewer, operator):
    instance = waiting_order()
    before = table_counts()
    for name, data in [
        ("cancel", {"reason": "r"}),
        ("retry", {"reason": "r", "target": "instance"}),
        ("signal", {"reason": "r", "name": "paid", "payload": '{"amount_paid": 5}'}),
    ]:
        assert viewer.get(action_url(name, instance)).status_code == 403
        refused = viewer.post(
            action_url(name, instance), {**data, "idempotency_key": str(uuid.uuid4())}
        )
        assert refused.status_code == 403
        assert "vertique_workflow.change_workflowinstance" in refused.text
        assert "refused" in refused.text
    assert table_counts() == before
    # the same action by a user holding the permission
    done = operator.post(
        action_url("cancel", instance), {"reason": "by olga", "idempotency_key": str(uuid.uuid4())}
    )
    assert done.status_code == 302
    entry = WorkflowHistory.objects.get(workflow_id=instance, event_type="WORKFLOW_CANCELLED")
    assert (entry.actor_id, entry.actor_reason) == ("olga", "by olga")


def test_an_unknown_instance_is_a_message_not_an_error(admin_client):
    response = admin_client.get(action_url("cancel", uuid.uuid4()))
    assert response.status_code == 302 and response.url == changelist()
    assert "No workflow instance with id" in texts(response)[0]
    assert admin_client.get(action_url("signal", "not-a-uuid")).status_code == 302


def test_the_action_pages_are_csrf_protected(db):
    user = User.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    instance = waiting_order()
    before = table_counts()
    response = client.post(
        action_url("cancel", instance), {"reason": "r", "idempotency_key": str(uuid.uuid4())}
    )
    assert response.status_code == 403
    assert table_counts() == before


# -- retry ----------------------------------------------------------------------------


def test_retry_records_a_retry_command_and_the_instance_moves_on(admin_client):
    instance = failed_shipment()
    page = admin_client.get(action_url("retry", instance))
    assert page.status_code == 200 and "FAILED" in page.text
    response = admin_client.post(
        action_url("retry", instance),
        {"target": "instance", "reason": "carrier back", "idempotency_key": form_key(page)},
    )
    assert response.status_code == 302 and response.url == instance_page(instance)
    [retry] = commands(instance, "RETRY")
    assert (retry.actor_kind, retry.actor_id, retry.actor_reason) == (
        "USER",
        "admin",
        "carrier back",
    )
    assert f"Retry of the instance recorded (command {retry.id})" in texts(response)[0]
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "confirm_wait")


def test_a_double_submitted_retry_records_once(admin_client):
    instance = failed_shipment()
    data = {"target": "instance", "reason": "again", "idempotency_key": str(uuid.uuid4())}
    admin_client.post(action_url("retry", instance), data)
    run_until_idle()  # the first retry has run: the instance is no longer FAILED
    before = table_counts()
    again = admin_client.post(action_url("retry", instance), data)
    assert again.status_code == 302
    assert "already recorded" in texts(again)[-1]
    assert table_counts() == before
    assert len(commands(instance, "RETRY")) == 1


def test_retry_of_an_instance_with_nothing_to_retry_is_refused_and_writes_nothing(admin_client):
    instance = waiting_order()
    before = table_counts()
    response = admin_client.post(
        action_url("retry", instance),
        {"target": "instance", "reason": "why not", "idempotency_key": str(uuid.uuid4())},
    )
    assert response.status_code == 200
    assert "nothing to retry" in response.text
    assert table_counts() == before


def test_retry_of_a_failed_branch(admin_client):
    Gifts.mode = "refuse"
    instance = wf.start("broken-branches", {}, idempotency_key="b-1").id
    run_until_idle()
    Gifts.mode = "ok"
    page = admin_client.get(action_url("retry", instance))
    target = '["split", "gift"]'
    assert "the failed branch &#x27;gift&#x27; of fork &#x27;split&#x27;" in page.text
    response = admin_client.post(
        action_url("retry", instance),
        {"target": target, "reason": "gift shop open", "idempotency_key": form_key(page)},
    )
    assert response.status_code == 302
    [retry] = commands(instance, "RETRY")
    assert retry.target_json == {"forkStepId": "split", "branchId": "gift"}
    assert (retry.actor_id, retry.actor_reason) == ("admin", "gift shop open")
    assert "Retry of branch 'gift' recorded" in texts(response)[0]
    run_until_idle()
    token = wf.branches(instance)
    assert {b.branch_id: b.status for b in token}["gift"] == "COMPLETED"


def test_retry_of_a_branch_that_is_not_offered_is_a_form_error(admin_client):
    instance = waiting_order()
    before = table_counts()
    response = admin_client.post(
        action_url("retry", instance),
        {"target": '["split", "gift"]', "reason": "r", "idempotency_key": str(uuid.uuid4())},
    )
    assert response.status_code == 200 and "Select a valid choice" in response.text
    assert table_counts() == before


# -- signal ---------------------------------------------------------------------------


def test_a_signal_is_recorded_with_the_admin_user_and_the_instance_moves_on(admin_client):
    instance = waiting_order()
    page = admin_client.get(action_url("signal", instance))
    assert page.status_code == 200
    assert '<option value="paid">paid</option>' in page.text
    assert "amount_paid" in page.text  # the declared schema is shown
    response = admin_client.post(
        action_url("signal", instance),
        {
            "name": "paid",
            "payload": '{"amount_paid": 5}',
            "reason": "paid by phone",
            "idempotency_key": form_key(page),
        },
    )
    assert response.status_code == 302 and response.url == instance_page(instance)
    [sent] = commands(instance, "SIGNAL")
    assert (sent.target_json["name"], sent.payload_json) == ("paid", {"amount_paid": 5})
    assert (sent.actor_kind, sent.actor_id, sent.actor_reason) == ("USER", "admin", "paid by phone")
    assert f"Signal 'paid' recorded (command {sent.id})" in texts(response)[0]
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"


def test_a_double_submitted_signal_records_once(admin_client):
    instance = waiting_order()
    data = {
        "name": "paid",
        "payload": '{"amount_paid": 5}',
        "reason": "twice",
        "idempotency_key": str(uuid.uuid4()),
    }
    admin_client.post(action_url("signal", instance), data)
    before = table_counts()
    again = admin_client.post(action_url("signal", instance), data)
    assert again.status_code == 302
    assert "already sent with this form" in texts(again)[-1]
    assert table_counts() == before
    assert len(commands(instance, "SIGNAL")) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"payload": '{"amount_paid": 5'}, "not valid JSON"),
        ({"payload": "NaN"}, "NaN is not JSON"),
        ({"payload": '{"amount_paid": "five"}'}, "does not match its schema"),
        ({"payload": "{}"}, "does not match its schema"),
        ({"name": "refund"}, "Select a valid choice. refund is not one of the available choices."),
        ({"reason": ""}, "This field is required."),
        ({"idempotency_key": "not-a-uuid"}, "Enter a valid UUID."),
    ],
    ids=["malformed", "nan", "schema-type", "schema-required", "undeclared", "reason", "key"],
)
def test_bad_signal_input_is_a_form_error_and_writes_nothing(admin_client, data, message):
    instance = waiting_order()
    before = table_counts()
    posted = {
        "name": "paid",
        "payload": '{"amount_paid": 5}',
        "reason": "testing",
        "idempotency_key": str(uuid.uuid4()),
        **data,
    }
    response = admin_client.post(action_url("signal", instance), posted)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert table_counts() == before
    assert wf.get(instance).status == "WAITING"


def test_a_signal_to_an_ended_instance_is_refused_with_a_message(admin_client):
    instance = completed_order()
    before = table_counts()
    response = admin_client.post(
        action_url("signal", instance),
        {
            "name": "paid",
            "payload": '{"amount_paid": 1}',
            "reason": "late",
            "idempotency_key": str(uuid.uuid4()),
        },
    )
    assert response.status_code == 200
    assert "the instance has ended (COMPLETED); signal refused" in response.text
    assert table_counts() == before


def test_a_definition_without_signals_offers_none(admin_client):
    instance = wf.start("review", {"manager": "ann"}, idempotency_key="r-1").id
    run_until_idle()
    page = admin_client.get(action_url("signal", instance))
    assert page.status_code == 200
    assert "declares no signals" in page.text
    before = table_counts()
    response = admin_client.post(
        action_url("signal", instance),
        {"name": "anything", "reason": "r", "idempotency_key": str(uuid.uuid4())},
    )
    assert response.status_code == 200
    assert table_counts() == before


# -- bulk cancel / retry --------------------------------------------------------------


def bulk(client: Client, action: str, ids: list[Any], **extra: str) -> Any:
    data = {"action": action, "_selected_action": [str(i) for i in ids], **extra}
    return client.post(changelist(), data)


def test_bulk_cancel_confirms_then_cancels_the_eligible_and_reports_the_others(admin_client):
    first, second = waiting_order("o-1"), waiting_order("o-2")
    ended = completed_order()
    ids = [first, second, ended]
    before = table_counts()
    confirm = bulk(admin_client, "cancel_selected", ids)
    assert confirm.status_code == 200
    assert "Cancel the selected instances" in confirm.text
    for instance in ids:
        assert str(instance) in confirm.text
    assert table_counts() == before  # the confirmation page records nothing
    key = form_key(confirm)
    no_reason = bulk(admin_client, "cancel_selected", ids, post="yes", idempotency_key=key)
    assert no_reason.status_code == 200 and "This field is required." in no_reason.text
    assert table_counts() == before
    done = bulk(
        admin_client,
        "cancel_selected",
        ids,
        post="yes",
        reason="season closed",
        idempotency_key=key,
    )
    assert done.status_code == 302
    outcomes = texts(done)
    assert f"{first}: cancelled." in outcomes and f"{second}: cancelled." in outcomes
    assert f"{ended}: had already ended; nothing recorded." in outcomes
    assert [wf.get(i).status for i in ids] == ["CANCELLED", "CANCELLED", "COMPLETED"]
    for instance in (first, second):
        entry = WorkflowHistory.objects.get(workflow_id=instance, event_type="WORKFLOW_CANCELLED")
        assert (entry.actor_id, entry.actor_reason) == ("admin", "season closed")


def test_bulk_retry_retries_the_failed_and_refuses_the_others_one_by_one(admin_client):
    failed_one, failed_two = failed_shipment("s-1"), failed_shipment("s-2")
    waiting = waiting_order()
    ids = [failed_one, waiting, failed_two]
    confirm = bulk(admin_client, "retry_selected", ids)
    assert confirm.status_code == 200 and "Retry the selected instances" in confirm.text
    data = {"post": "yes", "reason": "carrier back", "idempotency_key": form_key(confirm)}
    done = bulk(admin_client, "retry_selected", ids, **data)
    assert done.status_code == 302
    outcomes = texts(done)
    assert any(m.startswith(f"{failed_one}: retry recorded") for m in outcomes)
    assert any(m.startswith(f"{failed_two}: retry recorded") for m in outcomes)
    assert any(
        m.startswith(f"{waiting}: not retried:") and "nothing to retry" in m for m in outcomes
    )
    assert commands(waiting, "RETRY") == []
    for instance in (failed_one, failed_two):
        [retry] = commands(instance, "RETRY")
        assert (retry.actor_id, retry.actor_reason) == ("admin", "carrier back")
    # the same confirmation sent again records nothing new
    before = table_counts()
    again = bulk(admin_client, "retry_selected", ids, **data)
    assert sum("already recorded" in m for m in texts(again)) == 2
    assert table_counts() == before
    run_until_idle()
    assert [wf.get(i).status for i in ids] == ["WAITING", "WAITING", "WAITING"]
    assert wf.get(failed_one).current_step == "confirm_wait"


def test_bulk_actions_are_offered_only_to_users_with_the_permission(viewer, operator):
    waiting_order()
    assert "cancel_selected" not in viewer.get(changelist()).text
    listing = operator.get(changelist())
    assert "cancel_selected" in listing.text and "retry_selected" in listing.text
    instance = waiting_order("o-2")
    before = table_counts()
    response = bulk(
        viewer,
        "cancel_selected",
        [instance],
        post="yes",
        reason="r",
        idempotency_key=str(uuid.uuid4()),
    )
    assert response.status_code == 200  # vic has no actions: the post is just the list again
    assert table_counts() == before
    assert wf.get(instance).status == "WAITING"


# -- the buttons on the instance page and the lists -----------------------------------


def test_the_instance_page_shows_the_action_buttons_to_users_who_may_act(admin_client, viewer):
    instance = waiting_order()
    page = admin_client.get(instance_page(instance))
    assert page.status_code == 200
    for name in ("signal", "retry", "cancel"):
        assert f'href="{action_url(name, instance)}"' in page.text
    shown = viewer.get(instance_page(instance))
    assert shown.status_code == 200
    assert action_url("cancel", instance) not in shown.text
    assert "need the permission “change workflow instance”" in shown.text
    ended = completed_order()
    assert action_url("cancel", ended) not in admin_client.get(instance_page(ended)).text


def test_an_open_tasks_decide_and_reassign_links_are_on_its_instance_and_task_pages(admin_client):
    ref = wf.start("review", {"manager": "ann"}, idempotency_key="r-1")
    run_until_idle()
    [task] = wf.tasks(assignee="ann").items
    decide = reverse("admin:vertique_workflow_workflowtask_complete", args=[task.id])
    reassign = reverse("admin:vertique_workflow_workflowtask_reassign", args=[task.id])
    page = admin_client.get(instance_page(ref.id)).text
    assert decide in page and reassign in page
    task_page = admin_client.get(
        reverse("admin:vertique_workflow_workflowtask_change", args=[task.id])
    ).text
    assert decide in task_page and reassign in task_page
    inbox = reverse("admin:vertique_workflow_workflowtask_inbox")
    assert inbox in admin_client.get(changelist()).text
    assert (
        inbox in admin_client.get(reverse("admin:vertique_workflow_workflowtask_changelist")).text
    )
