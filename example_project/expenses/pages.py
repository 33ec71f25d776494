"""View helpers both example apps use: an instance of one workflow, and its open task."""

from __future__ import annotations

import uuid

from django.http import Http404

import vertique_workflow as wf
from vertique_workflow.models import WorkflowTask

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
