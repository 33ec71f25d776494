"""Compensation flows of the tests: steps that record their undo, and a fail path (issue 12)."""

from __future__ import annotations

from typing import Any

from vertique_workflow.definitions import Workflow, action, decision, end, fail, register, service
from vertique_workflow.side_effects import service_handler

from .models import HandlerCall


class Unavailable(Exception):
    """A failure of the fake refund provider."""


def _count(name: str, call: Any) -> int:
    HandlerCall.objects.create(handler=name, dispatch_key=call.dispatch_key, attempt=call.attempt)
    return HandlerCall.objects.filter(handler=name).count()


@service_handler("test.comp.ship")
def ship(request: dict, call: Any) -> dict:
    """Ships, unless the request says ``refuse_ship``."""
    _count("ship", call)
    if request.get("refuse_ship"):
        raise Unavailable("no carrier")
    return {"parcel": "p-1"}


@service_handler("test.comp.refund")
def refund(request: dict, call: Any) -> dict:
    """Refunds; the first ``refund_fail`` calls of the test fail."""
    calls = _count("refund", call)
    if calls <= int(request.get("refund_fail", 0)):
        raise Unavailable("refunds are down")
    return {"refund": "r-1"}


def _logged(state: dict, entry: str) -> dict:
    return {**state, "log": [*state.get("log", []), entry]}


@register
class OrderSaga(Workflow[dict]):
    """Three compensable steps; the third (a service) failing undoes the second, then the first."""

    id, version, contract = "comp-order", 1, "comp-order.v1"

    @action(start=True, next="route", compensate="release")
    def reserve(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "reserve")

    @decision(targets=["charge", "stop_early"])
    def route(self, state: dict) -> str:
        return "stop_early" if state.get("early") else "charge"

    @action(next="ship", compensate="refund_charge")
    def charge(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "charge")

    ship = service(
        "test.comp.ship", next="done", on_failed="give_up", attempts=1, compensate="recall"
    )

    done = end()
    give_up = fail(reason="SHIPPING_FAILED")
    stop_early = fail(reason="STOPPED")

    @action(compensate=None)
    def release(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "release")

    @action()
    def refund_charge(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "refund_charge")

    @action()
    def recall(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "recall")


@register
class PaymentSaga(Workflow[dict]):
    """A charge whose compensation is a refund service; a rejection compensates it."""

    id, version, contract = "comp-payment", 1, "comp-payment.v1"

    charge = service("test.comp.ship", start=True, next="verdict", attempts=1, compensate="refund")

    @decision(targets=["done", "rejected"])
    def verdict(self, state: dict) -> str:
        return "rejected" if state.get("reject") else "done"

    done = end()
    rejected = fail(reason="REJECTED")
    refund = service("test.comp.refund", attempts=1)


@register
class PlainFail(Workflow[dict]):
    """No compensations declared: fail behaves as it always did."""

    id, version, contract = "comp-plain", 1, "comp-plain.v1"

    @action(start=True, next="stop")
    def work(self, state: dict, ctx: Any) -> dict:
        return _logged(state, "work")

    stop = fail(reason="PLAIN")
