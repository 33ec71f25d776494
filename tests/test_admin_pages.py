"""The admin's pages: every one renders for a superuser, is refused without the view
permission, nothing is editable, and the lists filter and search."""

from __future__ import annotations

import uuid

import pytest
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

import vertique_workflow as wf
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowDedup,
    WorkflowDefinition,
    WorkflowDefinitionActivation,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowJoinState,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.testing import run_until_idle

from .admin_support import add_timer_task_branch, orders, staff_client, url

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["orders"]

REGISTERED = [
    WorkflowInstance,
    WorkflowHistory,
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowTimer,
    WorkflowTask,
    WorkflowBranchToken,
]
COMPOSITE_KEYS = [
    WorkflowDedup,
    WorkflowJoinState,
    WorkflowDefinition,
    WorkflowDefinitionActivation,
]
CUSTOM_VIEWS = {
    "definitions": WorkflowDefinition,
    "activations": WorkflowDefinitionActivation,
    "dedup": WorkflowDedup,
    "join_states": WorkflowJoinState,
}


def all_pages(waiting: uuid.UUID) -> dict[str, tuple[type, str]]:
    """Every page of the workflow admin, with the model whose view permission it needs."""
    timer, task, branch = add_timer_task_branch(waiting)
    command = WorkflowCommand.objects.filter(workflow_id=waiting).first()
    entry = WorkflowHistory.objects.filter(workflow_id=waiting).first()
    objects = {
        WorkflowInstance: waiting,
        WorkflowHistory: entry.pk,
        WorkflowCommand: command.pk,
        WorkflowCommandQueue: waiting,
        WorkflowTimer: timer.pk,
        WorkflowTask: task.pk,
        WorkflowBranchToken: branch.pk,
    }
    pages = {}
    for model, pk in objects.items():
        pages[f"{model.__name__} list"] = (model, url(model, "changelist"))
        pages[f"{model.__name__} page"] = (model, url(model, "change", pk))
    for name, model in CUSTOM_VIEWS.items():
        pages[name] = (model, reverse(f"admin:vertique_workflow_{name}"))
    pages["definition version"] = (
        WorkflowDefinition,
        reverse("admin:vertique_workflow_definition", args=["default", "order", 1]),
    )
    pages["instance at entry 3"] = (
        WorkflowInstance,
        url(WorkflowInstance, "change", waiting) + "?at=3",
    )
    pages["json value"] = (
        WorkflowInstance,
        reverse("admin:vertique_workflow_json", args=["workflowinstance", "state_json"])
        + f"?pk={waiting}",
    )
    return pages


def test_system_checks_pass():
    call_command("check")


def test_registered_models_and_the_composite_key_ones_have_views_of_their_own(admin_client):
    for model in REGISTERED:
        assert admin.site.is_registered(model), model
    for model in COMPOSITE_KEYS:
        assert not admin.site.is_registered(model), model
    with pytest.raises(ImproperlyConfigured, match="composite primary key"):
        admin.AdminSite().register(WorkflowDefinition)
    # ... so they are listed on the index as views of their own
    html = admin_client.get(reverse("admin:index")).content.decode()
    for name in CUSTOM_VIEWS:
        assert reverse(f"admin:vertique_workflow_{name}") in html, name
    assert "Workflow join states" in html
    app = admin_client.get(reverse("admin:app_list", args=["vertique_workflow"])).content.decode()
    assert reverse("admin:vertique_workflow_dedup") in app


def test_every_page_renders_for_a_superuser(admin_client, orders):
    waiting, _done = orders
    for name, (_model, address) in all_pages(waiting).items():
        response = admin_client.get(address)
        assert response.status_code == 200, name
        assert b'name="_save"' not in response.content, name


def test_every_page_is_refused_without_the_view_permission(orders):
    waiting, _done = orders
    pages = all_pages(waiting)
    anonymous = Client()
    nobody = staff_client()  # staff, no workflow permission
    for name, (_model, address) in pages.items():
        response = anonymous.get(address)
        assert response.status_code == 302 and "/login/" in response["Location"], name
        assert nobody.get(address).status_code in (302, 403), name
    # the view permission of the page's own model opens it (and only it)
    for name, (model, address) in pages.items():
        client = staff_client(f"view_{model._meta.model_name}")
        if name == "instance at entry 3":
            client = staff_client("view_workflowinstance", "view_workflowhistory")
        assert client.get(address).status_code == 200, name
    only_instances = staff_client("view_workflowinstance")
    assert only_instances.get(pages["dedup"][1]).status_code == 403
    assert only_instances.get(pages["WorkflowCommand list"][1]).status_code == 403
    index = only_instances.get(reverse("admin:index")).content.decode()
    assert reverse("admin:vertique_workflow_dedup") not in index


def test_django_history_button_is_gone_and_its_view_leads_to_the_row(admin_client, orders):
    waiting, _done = orders
    page = admin_client.get(url(WorkflowInstance, "change", waiting)).content.decode()
    assert url(WorkflowInstance, "history", waiting) not in page
    assert "historylink" not in page
    response = admin_client.get(url(WorkflowInstance, "history", waiting))
    assert response.status_code == 302
    assert response["Location"] == url(WorkflowInstance, "change", waiting)


@pytest.mark.parametrize("model", REGISTERED)
def test_add_change_and_delete_are_forbidden(admin_client, orders, model):
    waiting, _done = orders
    add_timer_task_branch(waiting)
    obj = model.objects.first()
    assert obj is not None
    assert admin_client.get(url(model, "add")).status_code == 403
    assert admin_client.get(url(model, "delete", obj.pk)).status_code == 403
    assert admin_client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert admin_client.post(url(model, "change", obj.pk), {}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


def listed(client, model, **params) -> list:
    response = client.get(url(model, "changelist"), params)
    assert response.status_code == 200
    return list(response.context["cl"].result_list)


def test_instance_filters_and_search(admin_client, orders):
    waiting, done = orders
    third = wf.start("order", {"amount": 1}, idempotency_key="o-3", business_key="XYZ-3")
    run_until_idle()
    add_timer_task_branch(waiting)

    def ids(**params) -> set[uuid.UUID]:
        return {row.id for row in listed(admin_client, WorkflowInstance, **params)}

    assert ids() == {waiting, done, third.id}
    assert ids(status="WAITING") == {waiting, third.id}
    assert ids(status="COMPLETED") == {done}
    assert ids(definition_id="order", definition_version="1", scope_key="default") == {
        waiting,
        done,
        third.id,
    }
    assert ids(definition_version="2") == set()
    assert ids(waiting_for="task") == ids(waiting_for="timer") == {waiting}
    assert ids(waiting_for="branches") == {waiting}
    assert ids(waiting_for="signal") == {waiting, third.id}  # both stand at the wait step
    assert ids(attention="attention") == set()
    assert ids(q="ORD-2") == {done}
    assert ids(q="ORD-*") == {waiting, done}
    assert ids(q="ord-2") == set()  # exact (indexed), not a substring scan
    assert ids(q=str(waiting)) == {waiting}
    assert ids(q=str(uuid.uuid4())) == set()
    assert ids(created_at__gte="2000-01-01 00:00:00+00:00") == {waiting, done, third.id}


def test_instance_list_columns(admin_client, orders):
    waiting, done = orders
    add_timer_task_branch(waiting)
    WorkflowCommand.objects.filter(workflow_id=done, kind="SIGNAL").update(
        state="DEAD", last_error="SIGNAL_HANDLER_FAILED: the handler broke"
    )
    response = admin_client.get(url(WorkflowInstance, "changelist"))
    html = response.content.decode()
    assert "signal paid" in html  # waiting at the wait step of its plan
    assert "task Review the order (ann, OPEN)" in html
    assert "timer SIGNAL_TIMEOUT at" in html
    assert "branches (1 RUNNING)" in html
    assert "await_payment, ship" in html  # current steps: the main one and the branch's
    assert "1 dead letter(s)" in html  # needs attention
    assert "SIGNAL: SIGNAL_HANDLER_FAILED: the handler broke" in html  # last failure
    assert f'class="wf-nowrap" href="{url(WorkflowInstance, "change", waiting)}"' in html
    dead = {row.id for row in listed(admin_client, WorkflowInstance, attention="dead")}
    assert dead == {done}
    assert {row.id for row in listed(admin_client, WorkflowInstance, attention="attention")} == {
        done
    }


def test_list_pages_never_count_and_page_on(admin_client, orders, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from vertique_workflow.admin import instances

    monkeypatch.setattr(instances.WorkflowInstanceAdmin, "list_per_page", 1)
    with CaptureQueriesContext(connection) as captured:
        first = admin_client.get(url(WorkflowInstance, "changelist"))
    counts = [q["sql"] for q in captured if q["sql"].upper().startswith("SELECT COUNT(")]
    assert counts == []
    assert len(first.context["cl"].result_list) == 1
    assert "?p=2" in first.content.decode()
    second = admin_client.get(url(WorkflowInstance, "changelist"), {"p": 2})
    assert second.status_code == 200
    assert "?p=1" in second.content.decode() and "?p=3" not in second.content.decode()
    assert {r.id for r in first.context["cl"].result_list} != {
        r.id for r in second.context["cl"].result_list
    }


def test_command_filters_search_and_links_from_an_instance(admin_client, orders):
    waiting, done = orders
    assert {c.kind for c in listed(admin_client, WorkflowCommand, kind="SIGNAL")} == {"SIGNAL"}
    assert {c.state for c in listed(admin_client, WorkflowCommand, state="COMPLETE")} == {
        "COMPLETE"
    }
    for condition in ("dead", "parked", "deferred", "lease_expired", "stuck"):
        assert listed(admin_client, WorkflowCommand, condition=condition) == [], condition
    command = WorkflowCommand.objects.filter(workflow_id=waiting).first()
    WorkflowCommand.objects.filter(pk=command.pk).update(
        state="CLAIMED", claimed_by="node-1", lease_until="2000-01-01T00:00:00Z"
    )
    assert [c.pk for c in listed(admin_client, WorkflowCommand, condition="lease_expired")] == [
        command.pk
    ]
    assert [c.pk for c in listed(admin_client, WorkflowCommand, condition="stuck")] == [command.pk]
    assert {c.workflow_id for c in listed(admin_client, WorkflowCommand, q=str(done))} == {done}
    assert listed(admin_client, WorkflowCommand, q="not-a-uuid") == []
    assert {
        c.workflow_id for c in listed(admin_client, WorkflowCommand, workflow_id__exact=waiting)
    } == {waiting}
    entries = listed(admin_client, WorkflowHistory, workflow_id__exact=done)
    assert len(entries) == 10 and {e.workflow_id for e in entries} == {done}
    assert [e.sequence for e in entries] == list(range(1, 11))
    assert {e.workflow_id for e in listed(admin_client, WorkflowHistory, q=str(waiting))} == {
        waiting
    }
    assert {e.event_type for e in listed(admin_client, WorkflowHistory, event_type="DECISION")} == {
        "DECISION"
    }


def test_a_long_last_error_shows_whole_on_the_command_page(admin_client, orders):
    waiting, _done = orders
    command = WorkflowCommand.objects.filter(workflow_id=waiting).first()
    error = "STEP_FAILED: " + "x" * 3900 + " THE END"
    WorkflowCommand.objects.filter(pk=command.pk).update(state="DEAD", last_error=error)
    page = admin_client.get(url(WorkflowCommand, "change", command.pk)).content.decode()
    assert error in page
    listing = admin_client.get(url(WorkflowCommand, "changelist")).content.decode()
    assert "x" * 200 not in listing.replace(error, "")  # the list shows a preview (full in title)
    instance_page = admin_client.get(url(WorkflowInstance, "change", waiting)).content.decode()
    assert error in instance_page
