"""The order pages: place an order, follow its branches, confirm payment, review fraud, ship.

The detail page lists the order's branches (``wf.branches``) with their
status and current step. Payment is confirmed by a signal addressed to the
payment branch; the fraud-review task is completed with
``wf.complete_task`` by a user ``wf.can_complete`` lets act. Every refusal
of the API comes back as a form error or a message, never a 500.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from expenses.pages import in_flight, instance_of, open_task

import vertique_workflow as wf
from vertique_workflow.models import WorkflowInstance

from .models import StockReservation

DEFINITION_ID = "order-fulfilment"
FORK_STEP = "split"  # the fork whose payment branch the confirmation addresses
IN_FLIGHT = {"PENDING", "RUNNING"}
REVIEW_DECISIONS = {"clear": "cleared", "block": "blocked"}


class OrderForm(forms.Form):
    amount = forms.IntegerField(min_value=0)
    sku = forms.CharField(max_length=64, help_text='"none-left" is out of stock')
    quantity = forms.IntegerField(min_value=1, initial=1)
    customer = forms.CharField(max_length=255, required=False)
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class PaymentForm(forms.Form):
    reference = forms.CharField(max_length=100)
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class ShipForm(forms.Form):
    tracking = forms.CharField(max_length=100)
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


class ReviewForm(forms.Form):
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)


def _actor_name(request: HttpRequest) -> str:
    return request.user.get_username() if request.user.is_authenticated else "demo-shop"


def index(request: HttpRequest) -> HttpResponse:
    form = OrderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        payload = {"amount": data["amount"], "sku": data["sku"], "quantity": data["quantity"]}
        if data["customer"].strip():
            payload["customer"] = data["customer"].strip()
        try:
            with transaction.atomic():
                ref = wf.start(
                    DEFINITION_ID,
                    payload,
                    idempotency_key=str(data["idempotency_key"]),
                    actor=wf.Actor.user(_actor_name(request)),
                )
        except wf.WorkflowValidationError as exc:
            form.add_error(None, wf.user_message(exc))
        except (wf.WorkflowConflict, wf.WorkflowNotFound) as exc:
            form.add_error(None, f"Refused: {wf.user_message(exc)}")
        else:
            if ref.created:
                messages.success(request, f"Order placed as instance {ref.id}.")
            else:
                messages.info(request, f"Already placed as instance {ref.id} (same form).")
            return redirect("orders:detail", instance_id=ref.id)
    instances = WorkflowInstance.objects.filter(definition_id=DEFINITION_ID).order_by(
        "-created_at"
    )[:50]
    return render(
        request,
        "orders/index.html",
        {
            "form": form,
            "instances": instances,
            "reservations": StockReservation.objects.all()[:10],
        },
    )


def _instance(instance_id: uuid.UUID) -> wf.InstanceView:
    return instance_of(DEFINITION_ID, instance_id, "order")


def _render_detail(
    request: HttpRequest, instance: wf.InstanceView, status: int = 200, **bound: forms.Form
) -> HttpResponse:
    branches = wf.branches(instance.id)
    task = open_task(instance.id)
    # a recorded signal or decision not applied yet: no forms, "processing", reload
    processing = instance.id in in_flight([instance.id])
    may_review = (
        task is not None
        and task.status == "OPEN"
        and not processing
        and wf.can_complete(request.user, task)
    )
    awaits_payment = not processing and any(
        b.branch_id == "payment" and b.status == "WAITING" and b.current_step == "await_payment"
        for b in branches
    )
    awaits_shipping = (
        not processing and instance.status == "WAITING" and instance.current_step == "shipping"
    )
    return render(
        request,
        "orders/detail.html",
        {
            "instance": instance,
            "branches": branches,
            "history": wf.history_of(instance.id),
            "processing": processing,
            "refresh": processing
            or instance.status in IN_FLIGHT
            or (task is not None and task.status != "OPEN"),
            "task": task,
            "may_review": may_review,
            "review_form": bound.get("review_form") or (ReviewForm() if may_review else None),
            "payment_form": bound.get("payment_form")
            or (PaymentForm() if awaits_payment else None),
            "ship_form": bound.get("ship_form") or (ShipForm() if awaits_shipping else None),
            "reservation": StockReservation.objects.filter(instance_id=instance.id).first(),
        },
        status=status,
    )


def detail(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    return _render_detail(request, _instance(instance_id))


@require_POST
def confirm_payment(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    """Confirm the payment: ``payment_confirmed`` addressed to the payment branch."""
    instance = _instance(instance_id)
    form = PaymentForm(request.POST)
    if not form.is_valid():
        return _render_detail(request, instance, payment_form=form)
    try:
        with transaction.atomic():
            sent = wf.signal(
                instance.id,
                "payment_confirmed",
                {"reference": form.cleaned_data["reference"]},
                dedup_key=str(form.cleaned_data["idempotency_key"]),
                branch=(FORK_STEP, "payment"),
                actor=wf.Actor.user(_actor_name(request)),
            )
    except (wf.WorkflowConflict, wf.WorkflowValidationError) as exc:
        form.add_error(None, wf.user_message(exc))
        return _render_detail(request, instance, payment_form=form)
    if sent.duplicate:
        messages.info(request, "Payment already confirmed (the same form was sent twice).")
    else:
        messages.success(request, "Payment confirmed.")
    return redirect("orders:detail", instance_id=instance.id)


@require_POST
def ship(request: HttpRequest, instance_id: uuid.UUID) -> HttpResponse:
    """Mark the order shipped: the ``shipped`` signal its shipping child workflow waits for."""
    instance = _instance(instance_id)
    form = ShipForm(request.POST)
    if not form.is_valid():
        return _render_detail(request, instance, ship_form=form)
    shipping = [c for c in wf.children(instance.id) if c.definition_id == "order-shipping"]
    if not shipping:
        form.add_error(None, "The order is not being shipped yet.")
        return _render_detail(request, instance, ship_form=form)
    try:
        with transaction.atomic():
            sent = wf.signal(
                shipping[-1].id,
                "shipped",
                {"tracking": form.cleaned_data["tracking"]},
                dedup_key=str(form.cleaned_data["idempotency_key"]),
                actor=wf.Actor.user(_actor_name(request)),
            )
    except (wf.WorkflowConflict, wf.WorkflowValidationError) as exc:
        form.add_error(None, wf.user_message(exc))
        return _render_detail(request, instance, ship_form=form)
    if sent.duplicate:
        messages.info(request, "Already marked shipped (the same form was sent twice).")
    else:
        messages.success(request, "Marked shipped.")
    return redirect("orders:detail", instance_id=instance.id)


@require_POST
def review(
    request: HttpRequest, instance_id: uuid.UUID, task_id: uuid.UUID, decision: str
) -> HttpResponse:
    """Complete the fraud-review task of the fraud branch (clear or block)."""
    instance = _instance(instance_id)
    if decision not in REVIEW_DECISIONS:
        raise Http404("unknown decision")
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    form = ReviewForm(request.POST)
    try:
        task = wf.get_task(task_id)
    except wf.WorkflowNotFound:
        raise Http404("no such task") from None
    if task.instance_id != instance.id:
        raise Http404("not a task of this order")
    if not form.is_valid():
        return _render_detail(request, instance, review_form=form)
    if not wf.can_complete(request.user, task):
        form.add_error(None, "You may not review this order.")
        return _render_detail(request, instance, status=403, review_form=form)
    by = request.user.get_username()
    try:
        with transaction.atomic():
            receipt = wf.complete_task(
                task.id,
                decision,
                {"reviewed_by": by},
                idempotency_key=str(form.cleaned_data["idempotency_key"]),
                actor=wf.Actor.user(by),
            )
    except wf.WorkflowNotFound:
        raise Http404("no such task") from None
    except (wf.WorkflowConflict, wf.WorkflowValidationError) as exc:
        form.add_error(None, wf.user_message(exc))
        return _render_detail(request, instance, review_form=form)
    if receipt.duplicate:
        messages.info(request, "Already recorded (the same form was sent twice).")
    else:
        messages.success(request, f"Order {REVIEW_DECISIONS[decision]} by {by}.")
    return redirect("orders:detail", instance_id=instance.id)
