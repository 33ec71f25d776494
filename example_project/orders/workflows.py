"""The demo of parallel branches: order fulfilment.

Payment, stock reservation and a fraud check run in parallel, joined
(policy all)::

    check_stock --(sold out)--> sold_out (fails, OUT_OF_STOCK)
    split --payment--> await_payment (branch-addressed signals)
                          --payment_confirmed--> joined
                          --payment_declined--> declined (fails the branch)
          --stock----> reserve (action: a StockReservation row) -> joined
          --fraud----> fraud_route --(amount < FRAUD_LIMIT)--> fraud_clear -> joined
                                   \\--(otherwise)--> fraud_review (task, group "fraud")
                                          --clear--> joined
                                          --block--> fraud_blocked (fails the branch, BLOCKED)
    joined (all; merge) --> charge (service: the fake payment provider, retried)
                              --> shipping -> shipped
                              \\--on_failed--> cancelled
                 (compensate: refund -- a cancel after the charge refunds it: COMPENSATED)
           \\--on_failed--> cancelled (a refund note, then fails CANCELLED)

``charge`` is a service step: the charge is recorded in the outbox with the
join's transition and made by the relay after the commit, at least once,
with its dispatch key as the provider's idempotency key (orders/payments.py).

Shipping is its own workflow, ``order-shipping``, started by the parent's
``shipping`` step as a child (``call``); the warehouse's ``shipped`` signal
goes to the child, and the child's end brings the tracking number back.
"""

from __future__ import annotations

from typing import Any

from vertique_workflow.definitions import (
    StepContext,
    Workflow,
    action,
    call,
    decision,
    decision_to,
    end,
    fail,
    fork,
    join,
    service,
    task,
    wait,
)

from .models import StockReservation
from .payments import ProviderBusy

FRAUD_LIMIT = 1000  # orders from this amount on get a fraud-review task
OUT_OF_STOCK_SKU = "none-left"  # the demo's way to make the stock branch fail

CONFIRMED = {
    "type": "object",
    "required": ["reference"],
    "properties": {"reference": {"type": "string", "minLength": 1, "maxLength": 100}},
    "additionalProperties": False,
}
REVIEW = {
    "type": "object",
    "properties": {"reviewed_by": {"type": "string", "minLength": 1, "maxLength": 255}},
    "additionalProperties": False,
}
CHARGED = {
    "type": "object",
    "required": ["charge_id"],
    "properties": {"charge_id": {"type": "string"}, "attempts": {"type": "integer"}},
}
SHIPPED = {
    "type": "object",
    "properties": {"tracking": {"type": "string", "minLength": 1, "maxLength": 100}},
    "additionalProperties": False,
}


class OrderFulfilment(Workflow[dict]):
    """Payment, stock and fraud check in parallel; a failure of any cancels the order."""

    id, version, contract = "order-fulfilment", 2, "orders.fulfilment"
    signals = {"payment_confirmed": CONFIRMED, "payment_declined": None, "shipped": SHIPPED}
    start_schema = {
        "type": "object",
        "required": ["amount", "sku", "quantity"],
        "properties": {
            "amount": {"type": "integer", "minimum": 0},
            "sku": {"type": "string", "minLength": 1, "maxLength": 64},
            "quantity": {"type": "integer", "minimum": 1},
            "customer": {"type": "string", "maxLength": 255},
        },
        "additionalProperties": False,
    }

    @decision(start=True, targets=["split", "sold_out"])
    def check_stock(self, state: dict[str, Any]) -> str:
        # before the fork, not in the stock branch: a branch that fails in the
        # fork's own segment trips an engine bug today (reported to the lead;
        # tests/test_branches_same_segment.py)
        return "sold_out" if state["sku"] == OUT_OF_STOCK_SKU else "split"

    sold_out = fail(reason="OUT_OF_STOCK")

    split = fork(
        branches={"payment": "await_payment", "stock": "reserve", "fraud": "fraud_route"},
        join="joined",
    )

    # payment: the view sends payment_confirmed addressed to this branch
    await_payment = wait(
        "payment_confirmed",
        "payment_declined",
        on={"payment_confirmed": "joined", "payment_declined": "declined"},
    )
    declined = fail(reason="PAYMENT_DECLINED")  # fails the payment branch

    @action(next="joined")
    def reserve(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        # same transaction as the step: a retried segment never reserves twice
        StockReservation.objects.get_or_create(
            instance_id=ctx.instance_id,
            defaults={"sku": state["sku"], "quantity": state["quantity"]},
        )
        return {**state, "reserved": True}

    @decision(targets=["fraud_clear", "fraud_review"])
    def fraud_route(self, state: dict[str, Any]) -> str:
        return "fraud_clear" if state["amount"] < FRAUD_LIMIT else "fraud_review"

    @action(next="joined")
    def fraud_clear(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "fraud": "cleared"}

    fraud_review = task(
        title="Review order for fraud",
        candidate_groups=["fraud"],
        decisions={
            "clear": decision_to("joined", schema=REVIEW),
            "block": decision_to("fraud_blocked", schema=REVIEW),
        },
    )
    fraud_blocked = fail(reason="BLOCKED")

    joined = join(policy="all", merge="collect", next="charge", on_failed="cancelled")

    def collect(self, state: dict[str, Any], results: Any, ctx: StepContext) -> dict[str, Any]:
        """Take what each branch found into the order's state."""
        payment = results["payment"].state
        stock = results["stock"].state
        fraud = results["fraud"].state
        return {
            **state,
            "payment_reference": payment.get("reference"),
            "reserved": bool(stock.get("reserved")),
            "fraud": fraud.get("fraud") or "reviewed",
            "reviewed_by": fraud.get("reviewed_by"),
        }

    # the payment provider is outside the database: a service step, never an action
    charge = service(
        "demo.payments.charge",
        request="charge_request",
        result="note_charge",
        next="shipping",
        on_failed="cancelled",
        attempts=4,
        backoff="1s",
        max_backoff="5s",
        retry_on=ProviderBusy,
        timeout="10s",
        result_schema=CHARGED,
        compensate="refund",
    )

    # the compensation of charge: a later fail step (the order cancelled after
    # the charge) refunds through the provider, and the order ends COMPENSATED
    refund = service("demo.payments.refund", request="refund_request", timeout="10s")

    def refund_request(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"charge_id": state["charge_id"]}

    def charge_request(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"amount": state["amount"], "reference": state["payment_reference"]}

    def note_charge(self, state: dict[str, Any], outcome: Any, ctx: StepContext) -> dict[str, Any]:
        if not outcome.ok:
            return {**state, "charge_error": outcome.error}
        return {**state, "charge_id": outcome.result["charge_id"]}

    # shipping is a child workflow: the warehouse signals the child, whose end
    # brings its tracking number back here
    shipping = call(
        "order-shipping",
        payload="shipping_payload",
        result="note_tracking",
        on_completed="shipped",
        on_failed="cancelled",
    )

    def shipping_payload(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"sku": state["sku"], "quantity": state["quantity"]}

    def note_tracking(self, state: dict[str, Any], child: Any, ctx: StepContext) -> dict[str, Any]:
        return {**state, "tracking": (child.state or {}).get("tracking")}

    shipped = end()

    @action(next="cancelled_end")
    def cancelled(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        # a real shop refunds here; the demo only notes it
        StockReservation.objects.filter(instance_id=ctx.instance_id).delete()
        return {**state, "refunded": True}

    cancelled_end = fail(reason="CANCELLED")


class OrderShipping(Workflow[dict]):
    """Shipping of one order: the warehouse sends ``shipped`` (or ``undeliverable``).

    Without word from the warehouse it ships by itself after 2h. An
    undeliverable order fails the child, and the parent cancels the order:
    its charge is refunded by compensation.
    """

    id, version, contract = "order-shipping", 2, "orders.shipping"
    signals = {"shipped": SHIPPED, "undeliverable": None}
    start_schema = {
        "type": "object",
        "required": ["sku", "quantity"],
        "properties": {
            "sku": {"type": "string", "minLength": 1, "maxLength": 64},
            "quantity": {"type": "integer", "minimum": 1},
        },
        "additionalProperties": False,
    }

    dispatch = wait(
        "shipped",
        "undeliverable",
        on={"shipped": "done", "undeliverable": "lost"},
        timeout="2h",
        on_timeout="done",
        start=True,
    )
    lost = fail(reason="UNDELIVERABLE")
    done = end()
