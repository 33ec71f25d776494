"""``service``: record a call of a service handler in the outbox and wait for its outcome.

Entering builds the request from the state and asks the segment for a
``RecordSideEffect`` of kind ``service`` with a dispatch key generated from
the instance, the command, the branch and the step: the segment claims the
key (dispatch dedup, per workflow and branch) and the outbox recorder writes
the call in the same transaction. The relay calls the handler after the
commit and records the outcome as the reserved signal
``vertique.service_result`` whose dedup key is the dispatch key. Accepting
it folds the ``ServiceOutcome`` into the state (``result``), checks a
successful result against ``result_schema`` and goes to ``next``, or to
``on_failed`` when the call failed for good; without ``on_failed`` the
instance fails ``SERVICE_FAILED`` (in a branch: the branch fails and its join
decides).
"""

from __future__ import annotations

from typing import Any

from ...definitions import Step
from ...definitions.services import ServiceOutcome, service_request
from .. import compensation
from ..effects import RecordSideEffect
from ..events import Event, Refusal, ServiceResult
from ..transition import Halt, Run

NAME = "service"
RESULT_INVALID = "SERVICE_RESULT_INVALID"
FAILED = "SERVICE_FAILED"


def dispatch_key(run: Run, step: Step) -> str:
    """The call's idempotency key: stable across retries of the segment that records it."""
    facts = run.facts
    return f"vertique.service:{facts.instance_id}:{facts.command_id}:{run.key or '-'}:{step.id}"


def enter(run: Run, step: Step) -> Halt:
    spec = step.service
    assert spec is not None
    ctx = run.context(step.id)
    state_json = run.plan.state_to_json(run.state)
    request = run.call(step.id, service_request, spec, step.id, state_json, run.state, ctx)
    key = dispatch_key(run, step)
    payload = {"handler": spec.handler, "request": request, "policy": spec.policy()}
    run.effect(RecordSideEffect(NAME, step.id, key, payload))
    run.note(step.id, "SERVICE_DISPATCHED", {"handler": spec.handler, "dispatchKey": key})
    if compensation.is_compensating(run, step.id):
        return Halt(compensation.COMPENSATING)
    return Halt("WAITING")


def refusal(step: Step, event: Event) -> Refusal | None:
    if isinstance(event, ServiceResult) and event.step_id == step.id:
        return None
    return event.refused(step.id)  # type: ignore[union-attr]


def _invalid_result(schema: Any, result: Any) -> str | None:
    """Where the result breaks ``schema`` (a JSON path, never the value), or None."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(dict(schema))
    error = next(iter(validator.iter_errors(result)), None)
    if error is None:
        return None
    return "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in error.path)


def accept(run: Run, step: Step, event: Event) -> str | Halt:
    spec = step.service
    assert spec is not None and isinstance(event, ServiceResult)
    status, error, result = event.status, event.error, event.result
    detail: dict[str, Any] = {"dispatchKey": event.dispatch_key, "attempts": event.attempts}
    if status == "COMPLETED" and spec.result_schema is not None:
        where = _invalid_result(spec.result_schema, result)
        if where is not None:
            status, error, result = "FAILED", RESULT_INVALID, None
            detail["invalidAt"] = where
    outcome = ServiceOutcome(status, result, error, event.attempts, event.dispatch_key)
    if spec.result is not None:
        folded = run.call(step.id, spec.result, run.state, outcome, run.context(step.id))
        if folded is not None:
            run.state = folded
    compensating = compensation.is_compensating(run, step.id)
    if status == "COMPLETED":
        detail.update(compensation.recorded_detail(run, step))
        run.log(step.id, "SERVICE_COMPLETED", detail)
        if compensating:
            return compensation.after_compensation(run)
        assert step.next is not None
        return step.next
    detail["error"] = error
    run.log(step.id, "SERVICE_FAILED", detail)
    if compensating:
        return compensation.compensation_failed(step.id, error or FAILED)
    if spec.on_failed is not None:
        return spec.on_failed
    code = error or FAILED
    reason = f"{FAILED}: the call of service step {step.id!r} failed ({code})"
    if run.token is None:
        return Halt("FAILED", error_type=FAILED, error_message=reason)
    from .fail import fail_branch

    return fail_branch(run, step, "FAILED", {"reason": code}, reason)
