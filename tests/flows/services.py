"""Service steps of the tests: handlers that count their calls, and the flows that use them."""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

from vertique_workflow.definitions import (
    Workflow,
    action,
    end,
    fail,
    fork,
    join,
    register,
    service,
)
from vertique_workflow.exceptions import NonRetryable
from vertique_workflow.side_effects import service_handler

from .models import HandlerCall


class Unavailable(Exception):
    """A transient error of the fake provider: retried by the steps below."""


class Refused(Exception):
    """An error the steps' retry_on does not name: never retried."""


MS10 = datetime.timedelta(milliseconds=10)
MS20 = datetime.timedelta(milliseconds=20)

# behaviour switches, per request (the request carries what the test wants)
_release = threading.Event()


def _log(name: str, call: Any) -> int:
    HandlerCall.objects.create(handler=name, dispatch_key=call.dispatch_key, attempt=call.attempt)
    return HandlerCall.objects.filter(handler=name, dispatch_key=call.dispatch_key).count()


@service_handler("test.charge")
def charge(request: dict, call: Any) -> dict:
    """Fails ``fail_times`` calls with Unavailable, then charges; ``refuse`` raises Refused."""
    calls = _log("charge", call)
    if request.get("refuse"):
        raise Refused("card declined")
    if request.get("non_retryable"):
        raise NonRetryable("CARD_DECLINED")
    if calls <= int(request.get("fail_times", 0)):
        raise Unavailable("provider busy")
    if request.get("bad_result"):
        return {"charge_id": 42}
    if request.get("kill_after_call") and calls == 1:
        os._exit(9)  # the relay dies between the call and the recording of its result
    return {"charge_id": f"ch-{request.get('amount')}", "calls": calls}


@service_handler("test.hang")
def hang(request: dict, call: Any) -> dict:
    """Never returns within the step's timeout on its first call."""
    calls = _log("hang", call)
    if calls == 1:
        _release.wait(30)
    return {"ok": True, "calls": calls}


def release_hung_handlers() -> None:
    _release.set()


def _charged(state: dict, outcome: Any, ctx: Any) -> dict:
    return {
        **state,
        "charge": outcome.result,
        "charge_status": outcome.status,
        "error": outcome.error,
    }


@register
class ChargeFlow(Workflow[dict]):
    """Charge through the outbox, retrying a busy provider; a final failure is handled."""

    id, version, contract = "svc-charge", 1, "svc-charge.v1"

    pay = service(
        "test.charge",
        start=True,
        next="done",
        result=_charged,
        on_failed="declined",
        attempts=3,
        backoff=MS10,
        max_backoff=MS20,
        retry_on=Unavailable,
        timeout="5s",
        result_schema={
            "type": "object",
            "required": ["charge_id"],
            "properties": {"charge_id": {"type": "string"}},
        },
    )
    declined = end()
    done = end()


@register
class StrictChargeFlow(Workflow[dict]):
    """No on_failed: a call that fails for good fails the instance SERVICE_FAILED."""

    id, version, contract = "svc-strict", 1, "svc-strict.v1"

    pay = service("test.charge", start=True, next="done", attempts=1, timeout="5s")
    done = end()


@register
class HangFlow(Workflow[dict]):
    """A handler that hangs is bounded by the step's timeout and retried."""

    id, version, contract = "svc-hang", 1, "svc-hang.v1"

    call_it = service(
        "test.hang",
        start=True,
        next="done",
        timeout=datetime.timedelta(milliseconds=300),
        attempts=2,
        backoff=MS10,
        max_backoff=MS10,
        result=_charged,
    )
    done = end()


@register
class FanChargeFlow(Workflow[dict]):
    """One charge per branch: dispatch keys are per workflow and branch."""

    id, version, contract = "svc-fan", 1, "svc-fan.v1"

    split = fork(branches={"a": "pay_a", "b": "pay_b"}, join="joined")
    pay_a = service("test.charge", next="joined", timeout="5s", attempts=1)
    pay_b = service("test.charge", next="joined", timeout="5s", attempts=1)
    joined = join(next="done", on_failed="gave_up")
    gave_up = fail(reason="GAVE_UP")
    done = end()


@register
class FragileRelayFlow(Workflow[dict]):
    """A short call timeout, so a dead relay's lease passes soon (the relay-kill test)."""

    id, version, contract = "svc-fragile", 1, "svc-fragile.v1"

    pay = service("test.charge", start=True, next="done", timeout="1s", attempts=3, result=_charged)
    done = end()


_boom = {"left": 0}


def explode_next_attempts(times: int) -> None:
    """Make the next ``times`` runs of ``SegmentRollbackFlow.boom`` raise (in this process)."""
    _boom["left"] = times


@register
class SegmentRollbackFlow(Workflow[dict]):
    """One branch records a service call while the other raises in the same segment."""

    id, version, contract = "svc-rollback", 1, "svc-rollback.v1"

    split = fork(branches={"a": "pay", "b": "boom"}, join="joined")
    pay = service("test.charge", next="joined", timeout="5s", attempts=1)

    @action(next="joined")
    def boom(self, state: dict, ctx: Any) -> dict:
        if _boom["left"] > 0:
            _boom["left"] -= 1
            raise RuntimeError("the segment rolls back")
        return state

    joined = join(next="done")
    done = end()
