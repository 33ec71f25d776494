"""The demo pages: submit expenses, decide their approval tasks, send receipts, read history.

Version 2 expenses wait for a human task: the detail page shows the open
task with approve / reject forms (only to a user ``wf.can_complete`` lets
act), "My tasks" lists a user's tasks. Version 1 expenses (started before
version 2 was deployed) still take the approve / reject signals. Every
refusal of the API comes back as a form error or a message, never a 500.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import vertique_workflow as wf
from vertique_workflow.models import WorkflowInstance, WorkflowTask

from .forms import ApproveForm, ExpenseFormV2, ReceiptForm, RejectForm
from .models import Payment
from .pages import ACTIVE_TASK, in_flight, instance_of, may_decide_expense, open_task

DEFINITION_ID = "expense-approval"
DECISIONS = {"approve": "approved", "reject": "rejected"}
BUTTONS = [("approve", "Approve"), ("reject", "Reject")]
IN_FLIGHT = {"PENDING", "RUNNING"}  # the detail page reloads itself meanwhile
RECEIPT_STEP = "receipt"  # version 2's wait for the "receipt" signal
# who decides a version-1 expense (no task: no task rule): a finance member or a
# holder of the task permission (a supervisor, e.g. the demo's admin)
V1_DECIDERS_GROUP = "finance"


def _actor_name(request: HttpRequest) -> str:
    return request.user.get_username() if request.user.is_authenticated else "demo-manager"


def _may_decide_v1(user: Any) -> bool:
    return user.is_authenticated and (
        user.has_perm("vertique_workflow.change_workflowtask")
        or user.groups.filter(name=V1_DECIDERS_GROUP).exists()
    )


def index(request: HttpRequest) -> HttpResponse:
    form = ExpenseFormV2(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        payload = {
            "amount": data["amount"],
            "description": data["description"],
            "submitted_by": data["submitted_by"],
        }
        if data["manager"].strip():
            payload["manager"] = data["manager"].strip()
        try:
            with transaction.atomic():
                ref = wf.start(
                    DEFINITION_ID,
                    payload,
                    idempotency_key=str(data["idempotency_key"]),
                    actor=wf.Actor.user(data["submitted_by"]),
                )
        except wf.WorkflowValidationError as exc:
            form.add_error(None, wf.user_message(exc))
        except (wf.WorkflowConflict, wf.WorkflowNotFound) as exc:
            # user_message: a registry refusal (it can name other scopes and plan
            # hashes) becomes a fixed sentence; the other messages are written for users
            form.add_error(None, f"Refused: {wf.user_message(exc)}")
        else:
            if ref.created:
                messages.success(request, f"Expense submitted as instance {ref.id}.")
            else:
                messages.info(request, f"Already submitted as instance {ref.id} (same form).")
            return redirect("expenses:index")
    instances = list(
        WorkflowInstance.objects.filter(definition_id=DEFINITION_ID).order_by("-created_at")[:50]
    )
    busy = in_flight([i.id for i in instances])
    return render(
        request,
        "expenses/index.html",
        {
            "form": form,
            "instances": instances,
            "busy": busy,
            "refresh": bool(busy),
            "may_decide_v1": _may_decide_v1(request.user),
            "payments": Payment.objects.all()[:10],
            "decisions": BUTTONS,
        },
    )


def _instance(instance_id: uuid.UUID) -> wf.InstanceView:
    return instance_of(DEFINITION_ID, instance_id, "expense")


def _render_detail(
    request: HttpRequest, instance: wf.InstanceView, status: int = 200, **bound: forms.Form
) -> HttpResponse:
    task = open_task(instance.id)
    processing = instance.id in in_flight([instance.id])
    refused = may_decide_expense(request.user, instance)
    may_decide = (
        task is not None
        and task.status == "OPEN"
        and not processing
        and refused is None
        and wf.can_complete(request.user, task)
    )
    waits_for_receipt = (
        instance.status == "WAITING" and instance.current_step == RECEIPT_STEP and not processing
    )
    return render(
        request,
        "expenses/detail.html",
        {
            "instance": instance,
            "history": wf.history_of(instance.id),
            "decisions": BUTTONS if instance.definition_version == 1 else [],
            "busy": {instance.id} if processing else set(),
            "processing": processing,
            "refresh": processing
            or instance.status in IN_FLIGHT
            or (task is not None and task.status != "OPEN"),
            "refused": refused,
            "may_decide_v1": refused is None and _may_decide_v1(request.user),
            "task": task,
            "tasks": WorkflowTask.objects.filter(workflow_id=instance.id).order_by("created_at"),
            "may_decide": may_decide,
            "approve_form": bound.get("approve_form") or (ApproveForm() if may_decide else None),
            "reject_form": bound.get("reject_form") or (RejectForm() if may_decide else None),
            "receipt_form": bound.get("receipt_form")
            or (ReceiptForm() if waits_for_receipt else None),
        },
        status=status,
    )


def detail(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    return _render_detail(request, _instance(instance_id))


@require_POST
def complete(
    request: HttpRequest, instance_id: uuid.UUID, task_id: uuid.UUID, decision: str
) -> HttpResponse:
    """Complete the task shown on the detail page: ``wf.complete_task`` with the form's key.

    It records the completion (the task becomes COMPLETING); the executor
    then completes it and moves the workflow on.
    """
    instance = _instance(instance_id)
    form_class = {"approve": ApproveForm, "reject": RejectForm}.get(decision)
    if form_class is None:
        raise Http404("unknown decision")
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    form = form_class(request.POST)
    name = f"{decision}_form"
    try:
        task = wf.get_task(task_id)
    except wf.WorkflowNotFound:
        raise Http404("no such task") from None
    if task.instance_id != instance.id:
        raise Http404("not a task of this expense")
    if not form.is_valid():
        return _render_detail(request, instance, **{name: form})
    if not wf.can_complete(request.user, task):
        form.add_error(None, "You may not decide this task.")
        return _render_detail(request, instance, status=403, **{name: form})
    refused = may_decide_expense(request.user, instance)
    if refused is not None:
        form.add_error(None, refused)
        return _render_detail(request, instance, status=403, **{name: form})
    by = request.user.get_username()
    payload: dict[str, Any] = {"approved_by": by}
    if decision == "reject":
        payload = {"rejected_by": by}
        if form.cleaned_data["reason"].strip():
            payload["reason"] = form.cleaned_data["reason"].strip()
    try:
        with transaction.atomic():
            receipt = wf.complete_task(
                task.id,
                decision,
                payload,
                idempotency_key=str(form.cleaned_data["idempotency_key"]),
                actor=wf.Actor.user(by),
            )
    except wf.WorkflowNotFound:
        raise Http404("no such task") from None
    except (wf.WorkflowConflict, wf.WorkflowValidationError) as exc:
        # a rejection's payload is the reason and our own rejected_by: a schema
        # refusal is about the reason, so show it on that field
        on_reason = decision == "reject" and isinstance(exc, wf.WorkflowValidationError)
        form.add_error("reason" if on_reason else None, wf.user_message(exc))
        return _render_detail(request, instance, **{name: form})
    if receipt.duplicate:
        messages.info(request, "Already recorded (the same form was sent twice).")
    else:
        messages.success(request, f"{task.name}: {DECISIONS[decision]} by {by}.")
    return redirect("expenses:detail", instance_id=instance.id)


@require_POST
def receipt(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    """Send the receipt an approved expense waits for: the ``receipt`` signal."""
    instance = _instance(instance_id)
    form = ReceiptForm(request.POST)
    if not form.is_valid():
        return _render_detail(request, instance, receipt_form=form)
    try:
        with transaction.atomic():
            sent = wf.signal(
                instance.id,
                "receipt",
                {"receipt_url": form.cleaned_data["receipt_url"]},
                dedup_key=str(form.cleaned_data["idempotency_key"]),
                actor=wf.Actor.user(_actor_name(request)),
            )
    except (wf.WorkflowConflict, wf.WorkflowValidationError) as exc:
        form.add_error(None, wf.user_message(exc))
        return _render_detail(request, instance, receipt_form=form)
    if sent.duplicate:
        messages.info(request, "Receipt already sent (the same form was sent twice).")
    else:
        messages.success(request, "Receipt sent.")
    return redirect("expenses:detail", instance_id=instance.id)


def my_tasks(request: HttpRequest) -> HttpResponse:
    """The signed-in user's open tasks: assigned, named as candidate, or for their groups.

    A supervisor (a user with the task permission, e.g. the demo's admin)
    also gets every open expense task, one keyset page at a time.
    """
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    name = request.user.get_username()
    groups = list(request.user.groups.values_list("name", flat=True))
    mine: dict[uuid.UUID, wf.TaskView] = {}
    queries: list[dict[str, Any]] = [{"assignee": name}, {"candidate_user": name}]
    if groups:
        queries.append({"candidate_groups": groups})
    for query in queries:
        page = wf.tasks(status=ACTIVE_TASK, definition_id=DEFINITION_ID, limit=100, **query)
        for item in page.items:
            mine.setdefault(item.id, item)
    everyone = None
    if request.user.has_perm("vertique_workflow.change_workflowtask"):
        try:
            everyone = wf.tasks(
                status=ACTIVE_TASK,
                definition_id=DEFINITION_ID,
                limit=20,
                cursor=request.GET.get("cursor") or None,
            )
        except wf.WorkflowValidationError as exc:
            messages.error(request, wf.user_message(exc))
            everyone = wf.tasks(status=ACTIVE_TASK, definition_id=DEFINITION_ID, limit=20)
    return render(
        request,
        "expenses/tasks.html",
        {
            "mine": sorted(mine.values(), key=lambda t: t.updated_at, reverse=True),
            "groups": groups,
            "everyone": everyone,
        },
    )


@require_POST
def decide(request: HttpRequest, instance_id: uuid.UUID, decision: str) -> HttpResponse:
    """Decide a version-1 expense: its "approve" / "reject" signal.

    Only a logged-in decider (``_may_decide_v1``) who did not submit it;
    anyone else is refused with a message and nothing is recorded.
    """
    if decision not in DECISIONS:
        raise Http404("unknown decision")
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    instance = _instance(instance_id)
    refused = may_decide_expense(request.user, instance)
    if refused is None and not _may_decide_v1(request.user):
        refused = f"Only the group {V1_DECIDERS_GROUP!r} or a supervisor decides expenses."
    if refused is not None:
        messages.error(request, f"Refused: {refused}")
        if request.POST.get("next") == "detail":
            return redirect("expenses:detail", instance_id=instance_id)
        return redirect("expenses:index")
    by = request.user.get_username()
    try:
        with transaction.atomic():
            receipt = wf.signal(
                instance_id,
                decision,
                {"by": by},
                dedup_key=f"{instance_id}:{decision}",
                actor=wf.Actor.user(by),
            )
    except wf.WorkflowNotFound:
        raise Http404("no such workflow instance") from None
    except wf.WorkflowConflict as exc:
        messages.error(request, f"Refused: {wf.user_message(exc)}")
    except wf.WorkflowValidationError as exc:
        messages.error(request, f"Invalid: {wf.user_message(exc)}")
    else:
        if receipt.duplicate:
            messages.info(request, f"Already {DECISIONS[decision]} (duplicate ignored).")
        else:
            messages.success(request, f"Expense {DECISIONS[decision]} by {by}.")
    if request.POST.get("next") == "detail":
        return redirect("expenses:detail", instance_id=instance_id)
    return redirect("expenses:index")
