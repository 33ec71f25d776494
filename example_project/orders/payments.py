"""A fake, local payment provider, called through the service outbox.

A real shop would call its provider's HTTP API here. The handlers run in the
relay (inside ``workflow_executor``), never in a workflow transaction, and
send the dispatch key as the provider's idempotency key: a call made twice
charges once. To show retries, the provider is "busy" on the first attempt
of every amount ending in 7; a charge for a reference starting with
``DECLINE`` is refused for good.
"""

from __future__ import annotations

from typing import Any

from vertique_workflow.exceptions import NonRetryable
from vertique_workflow.side_effects import service_handler

from .models import PaymentCharge


class ProviderBusy(Exception):
    """The provider asked us to try again later (HTTP 503): retried by the step."""


@service_handler("demo.payments.charge")
def charge(request: dict[str, Any], call: Any) -> dict[str, Any]:
    """Capture the order's amount against its confirmed payment reference."""
    if str(request.get("reference", "")).startswith("DECLINE"):
        raise NonRetryable("PAYMENT_REFUSED")
    if request["amount"] % 10 == 7 and call.attempt == 1:
        raise ProviderBusy("try again")
    row, _ = PaymentCharge.objects.get_or_create(
        idempotency_key=call.dispatch_key,
        defaults={"reference": request["reference"], "amount": request["amount"]},
    )
    return {"charge_id": str(row.pk), "attempts": call.attempt}


@service_handler("demo.payments.refund")
def refund(request: dict[str, Any], call: Any) -> dict[str, Any]:
    """Refund a charge (the compensation of ``charge``); refunding twice is a no-op."""
    PaymentCharge.objects.filter(pk=int(request["charge_id"])).update(status="REFUNDED")
    return {"refunded": request["charge_id"]}
