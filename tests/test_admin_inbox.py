"""The task inbox and the task actions of the admin: decide (schema-built forms), reassign.

Who may act is the task rule (``wf.can_complete``); everyone else gets a
clear refusal and nothing is written. The decision forms come from each
decision's payload schema: plain fields for a flat object, a JSON textarea
otherwise, both checked against the schema before anything is recorded.
"""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

import pytest
from django import forms
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import vertique_workflow as wf
from tests.conftest import table_counts
from vertique_workflow.admin.actions import DecisionForm
from vertique_workflow.admin.schema_form import PayloadSpec, parse_json
from vertique_workflow.models import WorkflowCommand, WorkflowHistory, WorkflowTask
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def task_url(name: str, task_id: Any, *more: str) -> str:
    return reverse(f"admin:vertique_workflow_workflowtask_{name}", args=[task_id, *more])


def inbox(show: str | None = None, **params: str) -> str:
    url = reverse("admin:vertique_workflow_workflowtask_inbox")
    query = {**({"show": show} if show else {}), **params}
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def staff(name: str, *groups: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def ann(db: Any) -> Client:
    """The manager: the review task's assignee."""
    return staff("ann")


@pytest.fixture
def bob(db: Any) -> Client:
    """Staff, but neither assignee, candidate nor reviewer."""
    return staff("bob")


@pytest.fixture
def rita(db: Any) -> Client:
    """A member of the task's candidate group "reviewers"."""
    return staff("rita", "reviewers")


def review(manager: str = "ann", key: str = "r-1") -> tuple[uuid.UUID, wf.TaskView]:
    ref = wf.start("review", {"manager": manager}, idempotency_key=key)
    run_until_idle()
    [task] = wf.tasks(assignee=manager, status="OPEN").items
    assert task.instance_id == ref.id
    return ref.id, task


def decision_data(decision: str, **fields: str) -> dict[str, str]:
    data = {"reason": "looked at it", "idempotency_key": str(uuid.uuid4()), **fields}
    return {f"d-{decision}-{name}": value for name, value in data.items()}


def completions(task_id: Any) -> list[WorkflowCommand]:
    return list(WorkflowCommand.objects.filter(task_id=task_id, kind="COMPLETION"))


# -- decide ---------------------------------------------------------------------------


def test_the_assignee_decides_through_the_form_built_from_the_payload_schema(ann):
    instance, task = review()
    page = ann.get(task_url("complete", task.id))
    assert page.status_code == 200
    # "reject" declares {"reason": string, required}: a real, required field
    assert re.search(r'<input type="text" name="d-reject-payload__reason"[^>]* required', page.text)
    # "approve" declares no schema: an optional JSON textarea
    assert 'name="d-approve-payload_json"' in page.text
    key = re.search(r'name="d-reject-idempotency_key" value="([0-9a-f-]{36})"', page.text)
    assert key, "each decision form carries its own idempotency key"
    response = ann.post(
        task_url("complete_decision", task.id, "reject"),
        {
            "d-reject-payload__reason": "over budget",
            "d-reject-reason": "policy 4.2",
            "d-reject-idempotency_key": key.group(1),
        },
    )
    assert response.status_code == 302
    assert response.url == reverse(
        "admin:vertique_workflow_workflowinstance_change", args=[instance]
    )
    assert "'reject' recorded by ann" in texts(response)[-1]
    [command] = completions(task.id)
    assert command.payload_json == {"reason": "over budget"}
    assert command.target_json["decision"] == "reject"
    assert (command.actor_kind, command.actor_id, command.actor_reason) == (
        "USER",
        "ann",
        "policy 4.2",
    )
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.state["outcome"]) == ("COMPLETED", "rejected")
    assert wf.get_task(task.id).status == "COMPLETED"


def test_a_member_of_a_candidate_group_decides_and_returns_to_the_inbox(rita):
    instance, task = review()
    listed = rita.get(inbox("groups"))
    decide = task_url("complete", task.id) + "?from=inbox"
    assert decide in listed.text
    response = rita.post(
        task_url("complete_decision", task.id, "approve") + "?from=inbox",
        decision_data("approve"),
    )
    assert response.status_code == 302 and response.url == inbox()
    [command] = completions(task.id)
    assert (command.payload_json, command.actor_id) == (None, "rita")
    run_until_idle()
    assert wf.get(instance).state["outcome"] == "approved"


def test_a_user_the_task_rule_refuses_gets_a_clear_refusal_and_nothing_is_written(bob):
    _instance, task = review()
    before = table_counts()
    page = bob.get(task_url("complete", task.id))
    assert page.status_code == 403
    assert "You may not decide the task" in page.text
    posted = bob.post(task_url("complete_decision", task.id, "approve"), decision_data("approve"))
    assert posted.status_code == 403
    refused = bob.post(
        task_url("reassign", task.id),
        {"assignee": "bob", "reason": "mine now", "idempotency_key": str(uuid.uuid4())},
    )
    assert refused.status_code == 403 and "You may not reassign the task" in refused.text
    assert table_counts() == before


@pytest.mark.parametrize(
    ("decision", "fields", "message"),
    [
        ("reject", {}, "This field is required."),  # the schema's required "reason"
        ("reject", {"payload__reason": "x", "reason": ""}, "This field is required."),
        ("approve", {"payload_json": '{"note": '}, "not valid JSON"),
        ("approve", {"idempotency_key": "1"}, "Enter a valid UUID."),
    ],
    ids=["payload-required", "reason-required", "malformed-json", "bad-key"],
)
def test_bad_decision_input_is_a_form_error_and_writes_nothing(ann, decision, fields, message):
    _instance, task = review()
    before = table_counts()
    response = ann.post(
        task_url("complete_decision", task.id, decision), decision_data(decision, **fields)
    )
    assert response.status_code == 200
    assert message in response.text
    assert table_counts() == before
    assert wf.get_task(task.id).status == "OPEN"


def test_an_undeclared_decision_is_refused_with_a_message(ann):
    _instance, task = review()
    before = table_counts()
    response = ann.post(task_url("complete_decision", task.id, "escalate"), decision_data("x"))
    assert response.status_code == 302
    assert "declares no decision 'escalate' (allowed: approve, reject)" in texts(response)[-1]
    assert table_counts() == before


def test_a_double_submitted_decision_records_once(ann):
    _instance, task = review()
    data = decision_data("approve")
    ann.post(task_url("complete_decision", task.id, "approve"), data)
    before = table_counts()
    again = ann.post(task_url("complete_decision", task.id, "approve"), data)
    assert again.status_code == 302
    assert "already recorded (the form was sent twice)" in texts(again)[-1]
    assert table_counts() == before
    assert len(completions(task.id)) == 1


def test_a_task_already_completed_offers_no_form_and_refuses_a_new_decision(ann):
    _instance, task = review()
    ann.post(task_url("complete_decision", task.id, "approve"), decision_data("approve"))
    run_until_idle()
    page = ann.get(task_url("complete", task.id))
    assert "The task is COMPLETED: there is nothing to decide" in page.text
    assert "d-approve-reason" not in page.text
    before = table_counts()
    response = ann.post(
        task_url("complete_decision", task.id, "reject"),
        decision_data("reject", payload__reason="late"),
    )
    assert response.status_code == 200
    assert "the task is COMPLETED; completion refused" in response.text
    assert table_counts() == before


def test_an_unknown_task_is_a_message(ann):
    response = ann.get(task_url("complete", uuid.uuid4()))
    assert response.status_code == 302
    assert "No task with id" in texts(response)[-1]


# -- reassign -------------------------------------------------------------------------


def test_reassign_records_the_admin_user_and_the_reason(ann, admin_client):
    instance, task = review()
    page = ann.get(task_url("reassign", task.id))
    assert page.status_code == 200 and 'value="ann"' in page.text
    key = re.search(r'name="idempotency_key" value="([0-9a-f-]{36})"', page.text).group(1)
    data = {"assignee": "carol", "reason": "on holiday", "idempotency_key": key}
    response = ann.post(task_url("reassign", task.id), data)
    assert response.status_code == 302
    assert "reassigned from ann to carol" in texts(response)[-1]
    assert wf.get_task(task.id).assignee == "carol"
    entry = WorkflowHistory.objects.get(workflow_id=instance, event_type="TASK_REASSIGNED")
    assert entry.payload_json == {"taskId": str(task.id), "from": "ann", "to": "carol"}
    assert (entry.actor_id, entry.actor_reason) == ("ann", "on holiday")
    # ann gave the task away: the task rule no longer lets her act on it
    before = table_counts()
    assert ann.post(task_url("reassign", task.id), data).status_code == 403
    assert table_counts() == before


def test_a_double_submitted_reassignment_records_once(admin_client):
    instance, task = review()
    data = {"assignee": "carol", "reason": "balance", "idempotency_key": str(uuid.uuid4())}
    admin_client.post(task_url("reassign", task.id), data)
    before = table_counts()
    again = admin_client.post(task_url("reassign", task.id), data)
    assert again.status_code == 302
    assert "already reassigned with this form" in texts(again)[-1]
    assert table_counts() == before
    assert (
        WorkflowHistory.objects.filter(workflow_id=instance, event_type="TASK_REASSIGNED").count()
        == 1
    )


def test_reassign_without_a_reason_writes_nothing(ann):
    _instance, task = review()
    before = table_counts()
    response = ann.post(
        task_url("reassign", task.id),
        {"assignee": "carol", "reason": "", "idempotency_key": str(uuid.uuid4())},
    )
    assert response.status_code == 200 and "This field is required." in response.text
    assert table_counts() == before


# -- the inbox ------------------------------------------------------------------------


def test_the_inbox_lists_my_tasks_my_groups_tasks_and_the_overdue_ones(ann, bob, rita):
    _one, mine = review("ann", "r-1")
    _two, other = review("zoe", "r-2")
    assigned = ann.get(inbox())
    assert assigned.status_code == 200
    assert str(mine.instance_id) in assigned.text and str(other.instance_id) not in assigned.text
    assert str(mine.instance_id) not in bob.get(inbox()).text
    groups = rita.get(inbox("groups")).text
    assert str(mine.instance_id) in groups and str(other.instance_id) in groups
    assert "You belong to no group." in bob.get(inbox("groups")).text
    # ann's task is overdue: the due date (set here) has passed
    assert str(mine.instance_id) not in ann.get(inbox("overdue")).text
    past = timezone.now() - datetime.timedelta(hours=1)
    WorkflowTask.objects.filter(id=mine.id).update(due_at=past)
    overdue = ann.get(inbox("overdue")).text
    assert str(mine.instance_id) in overdue and "(overdue)" in overdue
    assert str(other.instance_id) not in overdue
    # "All open tasks" is for supervisors only
    assert "All open tasks" not in ann.get(inbox()).text


def test_the_all_tab_is_for_supervisors_and_pages_with_a_cursor(admin_client, ann):
    for n in range(3):
        review(f"user{n}", f"r-{n}")
    page = admin_client.get(inbox("all"))
    assert page.status_code == 200 and "All open tasks" in page.text
    assert page.text.count("Decide</a>") == 3
    ann_all = ann.get(inbox("all"))
    assert "All open tasks" not in ann_all.text  # falls back to "Assigned to me"
    bad = admin_client.get(inbox("all", cursor="garbage"))
    assert bad.status_code == 200
    assert "That page link is no longer valid" in texts(bad)[-1]


def test_the_inbox_runs_a_bounded_number_of_queries(rita, django_assert_max_num_queries):
    for n in range(12):
        review(f"m{n}", f"r-{n}")
    with django_assert_max_num_queries(8):
        response = rita.get(inbox("groups"))
    assert response.text.count("Decide</a>") == 12


# -- schema -> form fields ------------------------------------------------------------


SCHEMA = {
    "type": "object",
    "required": ["reason", "amount"],
    "properties": {
        "reason": {"type": "string", "minLength": 2, "title": "Why"},
        "amount": {"type": "integer", "minimum": 1},
        "rate": {"type": "number"},
        "urgent": {"type": "boolean"},
        "level": {"enum": ["low", "high", 3]},
    },
    "additionalProperties": False,
}


def test_a_flat_schema_becomes_typed_fields_and_the_payload_is_assembled():
    form = DecisionForm(decision="approve", schema=SCHEMA)
    fields = form.fields
    assert (
        isinstance(fields["payload__reason"], forms.CharField)
        and fields["payload__reason"].required
    )
    assert fields["payload__reason"].label == "Why"
    assert isinstance(fields["payload__amount"], forms.IntegerField)
    assert fields["payload__amount"].min_value == 1
    assert isinstance(fields["payload__rate"], forms.FloatField)
    assert isinstance(fields["payload__urgent"], forms.BooleanField)
    assert [c[0] for c in fields["payload__level"].choices] == ["", '"low"', '"high"', "3"]
    assert list(fields)[-2:] == ["reason", "idempotency_key"]
    bound = DecisionForm(
        {
            "d-approve-payload__reason": "ok",
            "d-approve-payload__amount": "7",
            "d-approve-payload__level": "3",
            "d-approve-payload__urgent": "on",
            "d-approve-reason": "r",
            "d-approve-idempotency_key": str(uuid.uuid4()),
        },
        decision="approve",
        schema=SCHEMA,
    )
    assert bound.is_valid(), bound.errors
    assert bound.payload == {"reason": "ok", "amount": 7, "urgent": True, "level": 3}


def test_the_whole_schema_is_checked_after_the_fields():
    schema = {
        **SCHEMA,
        "properties": {**SCHEMA["properties"], "reason": {"type": "string", "pattern": "^[A-Z]"}},
    }
    bound = DecisionForm(
        {
            "d-x-payload__reason": "lowercase",
            "d-x-payload__amount": "2",
            "d-x-reason": "r",
            "d-x-idempotency_key": str(uuid.uuid4()),
        },
        decision="x",
        schema=schema,
    )
    assert not bound.is_valid()
    assert "does not match its schema" in str(bound.non_field_errors())


def test_a_nested_schema_gets_a_json_textarea_checked_against_the_schema():
    nested = {
        "type": "object",
        "required": ["lines"],
        "properties": {"lines": {"type": "array", "items": {"type": "integer"}}},
    }
    spec = PayloadSpec.of(nested)
    assert not spec.as_fields

    def bound(text: str) -> DecisionForm:
        return DecisionForm(
            {"d-x-payload_json": text, "d-x-reason": "r", "d-x-idempotency_key": str(uuid.uuid4())},
            decision="x",
            schema=nested,
        )

    good = bound('{"lines": [1, 2]}')
    assert good.is_valid() and good.payload == {"lines": [1, 2]}
    wrong = bound('{"lines": ["a"]}')
    assert not wrong.is_valid() and "does not match its schema" in str(wrong.errors["payload_json"])
    broken = bound("[1,")
    assert not broken.is_valid() and "not valid JSON" in str(broken.errors["payload_json"])


def test_parse_json_refuses_what_jsonb_cannot_hold():
    assert parse_json('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
    for text in ("NaN", "[Infinity]", "{'a': 1}"):
        with pytest.raises(ValueError):
            parse_json(text)
