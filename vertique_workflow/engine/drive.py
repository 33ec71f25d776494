"""The loop: drive a plan from one event until the instance waits or ends.

``drive(plan, snapshot, event, facts)`` takes the instance as stored (its
status, step and state) and the event a command brings, and returns a
``Transition``: the new status, step and state, the decisions for the log
and the effects for the segment to persist -- or, when the step the
instance stands at refuses the event, how its command settles. What a kind
of step does lives in ``engine/steps/``; this loop never names a kind. The
engine never touches the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..definitions import Plan, Step
from ..exceptions import NonRetryable, WorkflowDefinitionError, WorkflowValidationError
from ..payloads import json_size
from .events import Completion, Event, Refusal, Resume, Signal, Start, TimerFired
from .steps import KINDS, StepKind
from .transition import (
    STEP_ATTRIBUTE,
    Decision,
    DriveResult,
    Halt,
    Run,
    RunFacts,
    Transition,
    mark_step,
    refused_input,
)

# A plan that never reaches a wait or an end inside one segment is a bug in
# the plan (a decision loop); it fails instead of spinning forever.
MAX_STEPS_PER_SEGMENT = 10_000

STEP_NOT_IN_PLAN = "STEP_NOT_IN_PLAN"


@dataclass(frozen=True)
class Snapshot:
    """The instance as the segment read it, under the execution lock.

    ``current_step`` is where the instance's token stands (the step it waits
    at, or the step it failed at); ``state`` the stored state JSON. Branch
    tokens join the snapshot with fork/join.
    """

    status: str
    current_step: str | None
    state: dict[str, Any] | None


def state_of(plan: Plan, state_json: Any, code: str, step_id: str) -> Any:
    """``plan.state_from_json``, failing non-retryably (``code``, at ``step_id``) on a misfit."""
    try:
        return plan.state_from_json(state_json)
    except WorkflowValidationError as exc:
        raise refused_input(code, exc, step_id) from exc


def current_step_of(plan: Plan, step_id: str) -> Step:
    """The step an instance stands at (the wait it waits at, or the step it failed at).

    An instance keeps its step id across a code change of its version (the
    pin resolves by scope, id and version, not by hash). When the code of
    that version no longer has the step, the instance cannot continue: the
    command fails non-retryably with ``STEP_NOT_IN_PLAN`` (marked with the
    step) instead of being deferred or parked forever. Restoring the step in
    the code of that version (keep the old class as that version, put the
    changed graph in a new version) and retrying the failed instance repairs
    it; see docs/changing-workflows.md.
    """
    step = plan.steps.get(step_id)
    if step is None:
        exc = NonRetryable(
            STEP_NOT_IN_PLAN,
            f"workflow {plan.id!r} version {plan.version} has no step {str(step_id)[:64]!r} "
            "any more; restore it in that version's code and retry the instance",
        )
        mark_step(exc, step_id)
        raise exc
    return step


def check_state_size(result: DriveResult, limit: int | None) -> None:
    """Refuse to leave a state larger than ``limit`` bytes of JSON (``STATE_TOO_LARGE``).

    Measured once per drive, on the state the segment would store; only when
    it is too large are the steps measured, to name the first one whose state
    went over the limit (a retry would grow it the same way).
    """
    if limit is None or not result.applied or result.state is None:
        return
    size = json_size(result.state)
    if size <= limit:
        return
    step = next(
        (d.step_id for d in result.decisions if json_size(d.after) > limit),
        result.current_step or "",
    )
    exc = NonRetryable(
        "STATE_TOO_LARGE",
        f"the state would be {size} bytes of JSON, over MAX_PAYLOAD_BYTES ({limit})",
    )
    if step:
        mark_step(exc, step)
    raise exc


def drive(plan: Plan, snapshot: Snapshot, event: Event, facts: RunFacts) -> Transition:
    """The transition ``event`` makes from ``snapshot`` (the segment's one engine call)."""
    if isinstance(event, Start):
        state = state_of(plan, event.payload or {}, "PAYLOAD_INVALID", plan.start)
        result = _run(Run(plan, facts, state, plan.state_to_json(state)), plan.start)
    elif isinstance(event, Resume):
        current_step_of(plan, event.step_id)  # a step the code lost fails as STEP_NOT_IN_PLAN
        state = state_of(plan, snapshot.state, "STATE_INVALID", event.step_id)
        result = _run(Run(plan, facts, state, plan.state_to_json(state)), event.step_id)
    else:
        result = _deliver(plan, snapshot, event, facts)
    check_state_size(result, facts.max_state_bytes)
    return result


def _deliver(
    plan: Plan, snapshot: Snapshot, event: Signal | TimerFired | Completion, facts: RunFacts
) -> DriveResult:
    """Offer an event to the step the instance waits at; refused => nothing changes."""
    step = current_step_of(plan, snapshot.current_step) if snapshot.current_step else None
    kind = _kind(plan, step) if step is not None else None
    refusal = (
        event.refused(snapshot.current_step)
        if step is None or kind is None or kind.refusal is None
        else kind.refusal(step, event)
    )
    if refusal is None:
        assert step is not None and kind is not None and kind.accept is not None
        state = state_of(plan, snapshot.state, "STATE_INVALID", step.id)
        run = Run(plan, facts, state, plan.state_to_json(state))
        moved = kind.accept(run, step, event)  # a kind may still refuse, having seen the state
        if not isinstance(moved, Refusal):
            return _halted(run, step, moved) if isinstance(moved, Halt) else _run(run, moved)
        refusal = moved
    return DriveResult(
        applied=False,
        status=snapshot.status,
        current_step=snapshot.current_step,
        state=snapshot.state,
        refusal=refusal,
    )


def _kind(plan: Plan, step: Step) -> StepKind:
    kind = KINDS.get(step.kind)
    if kind is None:
        raise WorkflowDefinitionError(
            f"step kind {step.kind!r} is not supported by this release",
            definition_id=plan.id,
            step_id=step.id,
        )
    return kind


def _halted(run: Run, step: Step, halt: Halt) -> DriveResult:
    return DriveResult(
        True,
        halt.status,
        step.id,
        run.before,
        run.decisions,
        error_type=halt.error_type,
        error_message=halt.error_message,
        waiting=halt.waiting,
        effects=run.effects,
    )


def _run(run: Run, step_id: str) -> DriveResult:
    plan = run.plan
    for _ in range(MAX_STEPS_PER_SEGMENT):
        step = plan.step(step_id)
        moved = _kind(plan, step).enter(run, step)
        if isinstance(moved, Halt):
            return _halted(run, step, moved)
        step_id = moved
    exc = NonRetryable(
        "STEP_LIMIT_EXCEEDED", f"ran {MAX_STEPS_PER_SEGMENT} steps without waiting or ending"
    )
    mark_step(exc, step_id)
    raise exc


__all__ = [
    "STEP_ATTRIBUTE",
    "STEP_NOT_IN_PLAN",
    "Completion",
    "Decision",
    "DriveResult",
    "Resume",
    "RunFacts",
    "Signal",
    "Snapshot",
    "Start",
    "TimerFired",
    "Transition",
    "check_state_size",
    "current_step_of",
    "drive",
    "state_of",
]
