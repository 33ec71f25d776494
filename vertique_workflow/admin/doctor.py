"""The admin's *Doctor* page: the findings of ``doctor.diagnose()`` with links to act on them."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse

from .. import doctor
from ..models import WorkflowInstance
from .common import admin_url

EXAMPLES = 50


def _instance_links(example: dict[str, Any]) -> dict[str, Any]:
    """The example with links to its instance page and to the actions that fix it."""
    instance_id = example.get("instance_id")
    links: dict[str, str] = {}
    if isinstance(instance_id, uuid.UUID):
        links["page"] = admin_url(WorkflowInstance, "change", instance_id)
        links["cancel"] = admin_url(WorkflowInstance, "cancel", instance_id)
        links["retry"] = admin_url(WorkflowInstance, "retry", instance_id)
    rest = {k: v for k, v in example.items() if k != "instance_id" and v is not None}
    return {"instance_id": instance_id, "links": links, "details": rest}


# which action link fixes a finding of each kind (None: a deploy or an operator's fix)
ACTIONS = {
    "STRANDED": "cancel",
    "WAITING_FOREVER": "cancel",
    "DEAD_LETTERS": "retry",
    "PARKED_SIGNALS": None,
    "DEFERRED_FOREVER": None,
    "LEASE_EXPIRING": None,
    "STUCK_SERVICE_CALLS": None,
}


def doctor_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> TemplateResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    report = doctor.diagnose(limit=EXAMPLES)
    findings = [
        {
            "finding": finding,
            "action": ACTIONS.get(finding.kind),
            "rows": [_instance_links(e) for e in finding.examples],
        }
        for finding in report.findings
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Workflow doctor",
        "opts": model_admin.model._meta,
        "healthy": report.healthy,
        "findings": findings,
        "figures": report.figures,
        "list_url": admin_url(WorkflowInstance, "changelist"),
    }
    return TemplateResponse(request, "admin/vertique_workflow/doctor.html", context)
