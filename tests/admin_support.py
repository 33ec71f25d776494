"""Fixtures and helpers of the admin tests (test_admin_*.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import vertique_workflow as wf
from vertique_workflow import registry
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowHistory,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.testing import run_until_idle


def url(model: Any, view: str, *args: Any) -> str:
    return reverse(f"admin:vertique_workflow_{model._meta.model_name}_{view}", args=args)


@pytest.fixture
def orders() -> tuple[uuid.UUID, uuid.UUID]:
    """One order waiting for "paid" (started by ann), one completed (paid by bob).

    The registry rows of the test catalog are written first (an earlier test's
    flush removed them, and this process's sync ran once).
    """
    registry.sync_code_definitions()
    waiting = wf.start(
        "order",
        {"amount": 5},
        idempotency_key="o-1",
        business_key="ORD-1",
        actor=wf.Actor.user("ann"),
    )
    done = wf.start(
        "order",
        {"amount": 7},
        idempotency_key="o-2",
        business_key="ORD-2",
        actor=wf.Actor.user("ann"),
    )
    run_until_idle()
    wf.signal(done.id, "paid", {"amount_paid": 7}, dedup_key="p-2", actor=wf.Actor.user("bob"))
    run_until_idle()
    assert (wf.get(waiting.id).status, wf.get(done.id).status) == ("WAITING", "COMPLETED")
    return waiting.id, done.id


def add_timer_task_branch(
    instance_id: uuid.UUID,
) -> tuple[WorkflowTimer, WorkflowTask, WorkflowBranchToken]:
    """Rows of timers, tasks and branches for an instance (its plan has none)."""
    timer = WorkflowTimer.objects.create(
        id=uuid.uuid4(),
        workflow_id=instance_id,
        step_id="await_payment",
        purpose="SIGNAL_TIMEOUT",
        fire_at=timezone.now(),
        status="SCHEDULED",
    )
    task = WorkflowTask.objects.create(
        id=uuid.uuid4(),
        workflow_id=instance_id,
        step_id="review",
        name="Review the order",
        status="OPEN",
        assignee="ann",
    )
    branch = WorkflowBranchToken.objects.create(
        id=uuid.uuid4(),
        workflow_id=instance_id,
        fork_step_id="fork",
        branch_id="b1",
        status="RUNNING",
        current_step_id="ship",
    )
    return timer, task, branch


def grow_history(instance_id: uuid.UUID, entries: int) -> None:
    """Append ``entries`` plain history rows (version 1: no decision log) to an instance."""
    last = WorkflowHistory.objects.filter(workflow_id=instance_id).order_by("-sequence").first()
    start = last.sequence if last else 0
    WorkflowHistory.objects.bulk_create(
        [
            WorkflowHistory(
                workflow_id=instance_id,
                sequence=start + n,
                event_type="COMMAND_DEFERRED",
                payload_json={"commandId": 1, "kind": "SIGNAL", "reason": f"n{n}"},
                actor_kind="SYSTEM",
                actor_id="test",
            )
            for n in range(1, entries + 1)
        ],
        batch_size=1000,
    )


def staff_client(*codenames: str) -> Client:
    """A logged-in staff user (not superuser) holding the given vertique_workflow permissions."""
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="x", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="vertique_workflow", codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client
