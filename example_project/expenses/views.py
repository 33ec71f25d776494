"""The demo pages: submit expenses, approve or reject them, read their history."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import vertique_workflow as wf
from vertique_workflow.models import WorkflowInstance

from .forms import ExpenseForm
from .models import Payment

DEFINITION_ID = "expense-approval"
DECISIONS = {"approve": "approved", "reject": "rejected"}
BUTTONS = [("approve", "Approve"), ("reject", "Reject")]
IN_FLIGHT = {"PENDING", "RUNNING"}  # the detail page reloads itself meanwhile


def _actor_name(request: HttpRequest) -> str:
    return request.user.get_username() if request.user.is_authenticated else "demo-manager"


def index(request: HttpRequest) -> HttpResponse:
    form = ExpenseForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        payload = {
            "amount": data["amount"],
            "description": data["description"],
            "submitted_by": data["submitted_by"],
        }
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
    instances = WorkflowInstance.objects.filter(definition_id=DEFINITION_ID).order_by(
        "-created_at"
    )[:50]
    return render(
        request,
        "expenses/index.html",
        {
            "form": form,
            "instances": instances,
            "payments": Payment.objects.all()[:10],
            "decisions": BUTTONS,
        },
    )


def detail(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    try:
        instance = wf.get(instance_id)
    except wf.WorkflowNotFound:
        raise Http404("no such workflow instance") from None
    if instance.definition_id != DEFINITION_ID:
        raise Http404("not an expense workflow")
    return render(
        request,
        "expenses/detail.html",
        {
            "instance": instance,
            "history": wf.history_of(instance_id),
            "decisions": BUTTONS,
            "refresh": instance.status in IN_FLIGHT,
        },
    )


@require_POST
def decide(request: HttpRequest, instance_id: uuid.UUID, decision: str) -> HttpResponse:
    if decision not in DECISIONS:
        raise Http404("unknown decision")
    by = _actor_name(request)
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
