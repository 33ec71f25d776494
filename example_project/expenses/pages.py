"""View helpers both example apps use: an instance of one workflow, and its open task."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import Http404

import vertique_workflow as wf
from vertique_workflow.models import WorkflowCommand, WorkflowTask

ACTIVE_TASK = ["OPEN", "COMPLETING"]


def instance_of(definition_id: str, instance_id: uuid.UUID, what: str) -> wf.InstanceView:
    """The instance, 404 when it does not exist or is not a ``definition_id`` instance."""
    try:
        instance = wf.get(instance_id)
    except wf.WorkflowNotFound:
        raise Http404("no such workflow instance") from None
    if instance.definition_id != definition_id:
        raise Http404(f"not an {what} workflow")
    return instance


def open_task(instance_id: uuid.UUID) -> wf.TaskView | None:
    """The instance's open (or completing) task, if it waits at a task step."""
    row = (
        WorkflowTask.objects.filter(workflow_id=instance_id, status__in=ACTIVE_TASK)
        .order_by("-created_at")
        .first()
    )
    if row is None:
        return None
    try:
        return wf.get_task(row.id)
    except wf.WorkflowNotFound:
        return None


# commands the executor is about to run (or running): the page shows "processing"
# and reloads itself; a TIMER waits for its time, so it does not count
IN_FLIGHT_COMMANDS = ["PENDING", "RUNNING"]


def in_flight(instance_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """The instances among ``instance_ids`` with a recorded command not yet run (one query).

    A decision or a signal is recorded at once and applied by the executor a
    moment later: meanwhile the instance still reads WAITING, so a page that
    showed its buttons again would invite a second decision.
    """
    if not instance_ids:
        return set()
    rows = (
        WorkflowCommand.objects.filter(workflow_id__in=instance_ids, state__in=IN_FLIGHT_COMMANDS)
        .exclude(kind="TIMER")
        .values_list("workflow_id", flat=True)
        .distinct()
    )
    return set(rows)


def submitted_by(instance: wf.InstanceView) -> str | None:
    """Who submitted the expense (its state's ``submitted_by``), if the state names one."""
    state = instance.state
    if isinstance(state, dict):
        value = state.get("submitted_by")
    else:
        value = getattr(state, "submitted_by", None)
    return value if isinstance(value, str) else None


def may_decide_expense(user: Any, instance: wf.InstanceView) -> str | None:
    """Why ``user`` may not decide this expense (None: they may).

    Four eyes: the submitter never decides their own expense, whatever their
    permissions. The version-2 task rule (``wf.can_complete``) is checked by
    the caller on the task itself.
    """
    if not getattr(user, "is_authenticated", False):
        return "Log in to decide this expense."
    if submitted_by(instance) == user.get_username():
        return "You submitted this expense: someone else decides it."
    return None
