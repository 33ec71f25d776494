"""Drive a plan from a command until the instance waits or ends.

The executor hands the engine the plan of the instance's pin, the stored
state and the command; the engine runs workflow code (actions, decisions,
signal application) and returns what happened. It never touches the
database: persisting the outcome is the segment's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..definitions import Plan, Step, StepContext
from ..exceptions import NonRetryable, WorkflowDefinitionError, WorkflowValidationError
from ..payloads import json_size

# A plan that never reaches a wait or an end inside one segment is a bug in
# the plan (a decision loop); it fails instead of spinning forever.
MAX_STEPS_PER_SEGMENT = 10_000


@dataclass(frozen=True)
class RunFacts:
    """What the engine may know about the instance and the command."""

    instance_id: Any
    definition_id: str
    definition_version: int
    business_key: str | None
    scope: str
    command_id: int | None
    command_kind: str
    actor: Any = None
    # MAX_PAYLOAD_BYTES, handed in by the segment (the engine reads no settings):
    # the largest state a drive may leave to be stored; None checks no size.
    max_state_bytes: int | None = None


@dataclass(frozen=True)
class Decision:
    """One step the drive took: the state before and after it, as JSON."""

    step_id: str
    outcome: str
    before: dict[str, Any]
    after: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class DriveResult:
    """The outcome of one drive.

    ``applied`` is False when a signal is not accepted by the current step:
    the segment parks it and changes nothing else.
    """

    applied: bool
    status: str
    current_step: str | None
    state: dict[str, Any] | None
    decisions: list[Decision] = field(default_factory=list)
    error_type: str | None = None
    error_message: str | None = None
    waiting: tuple[str, ...] = ()

    @property
    def ended(self) -> bool:
        return self.status in ("COMPLETED", "FAILED")


def _context(facts: RunFacts, step_id: str, **extra: Any) -> StepContext:
    return StepContext(
        instance_id=facts.instance_id,
        step_id=step_id,
        definition_id=facts.definition_id,
        definition_version=facts.definition_version,
        command_id=facts.command_id,
        command_kind=facts.command_kind,
        business_key=facts.business_key,
        scope=facts.scope,
        actor=facts.actor,
        **extra,
    )


def _refused(code: str, exc: WorkflowValidationError, step_id: str) -> NonRetryable:
    """A validation error of the engine's own: the same input fails every attempt.

    ``PAYLOAD_INVALID``: the command's payload does not fit (the start payload
    the state type, a signal payload the default merge). ``STATE_INVALID``: the
    stored state no longer fits the state type. The message names fields,
    never values; it goes to the log only (``detail``).
    """
    refused = NonRetryable(code, str(exc))
    mark_step(refused, step_id)
    return refused


def state_of(plan: Plan, state_json: Any, code: str, step_id: str) -> Any:
    """``plan.state_from_json``, failing non-retryably (``code``, at ``step_id``) on a misfit."""
    try:
        return plan.state_from_json(state_json)
    except WorkflowValidationError as exc:
        raise _refused(code, exc, step_id) from exc


def start(plan: Plan, payload: dict[str, Any] | None, facts: RunFacts) -> DriveResult:
    """Run a new instance from its first step with the start payload as state."""
    state = state_of(plan, payload or {}, "PAYLOAD_INVALID", plan.start)
    return _run(plan, state, plan.start, facts, [])


def apply_signal(
    plan: Plan,
    state_json: dict[str, Any] | None,
    current_step: str | None,
    name: str,
    payload: Any,
    facts: RunFacts,
) -> DriveResult:
    """Apply a signal to the wait it targets, then drive on; not accepted => not applied."""
    step = current_step_of(plan, current_step) if current_step else None
    if step is None or step.kind != "wait" or name not in step.signals:
        return DriveResult(
            applied=False, status="WAITING", current_step=current_step, state=state_json
        )
    state = state_of(plan, state_json, "STATE_INVALID", step.id)
    before = plan.state_to_json(state)
    ctx = _context(facts, step.id, signal_name=name, signal_payload=payload)
    try:
        state = plan.apply_signal(step, state, name, payload, ctx)
    except Exception as exc:
        if isinstance(exc, WorkflowValidationError) and step.apply is None:
            # the default merge refused the payload; a wait's own apply is
            # workflow code, retried like any other
            raise _refused("PAYLOAD_INVALID", exc, step.id) from exc
        mark_step(exc, step.id)
        raise
    after = plan.state_to_json(state)
    decisions = [Decision(step.id, "SIGNAL_APPLIED", before, after, {"signal": name})]
    target = plan.next_after_signal(step, name)
    if target is None:  # validated plans always name one
        raise WorkflowDefinitionError(
            f"wait {step.id!r} has no next step for {name!r}",
            definition_id=plan.id,
            step_id=step.id,
        )
    return _run(plan, state, target, facts, decisions)


def resume(
    plan: Plan, state_json: dict[str, Any] | None, step_id: str, facts: RunFacts
) -> DriveResult:
    """Drive on from ``step_id`` with the stored state (a retry re-driving a failed instance)."""
    current_step_of(plan, step_id)  # a step the code lost fails as STEP_NOT_IN_PLAN
    state = state_of(plan, state_json, "STATE_INVALID", step_id)
    result = _run(plan, state, step_id, facts, [])
    check_state_size(result, facts.max_state_bytes)
    return result


STEP_NOT_IN_PLAN = "STEP_NOT_IN_PLAN"


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


def drive(
    plan: Plan,
    *,
    kind: str,
    state_json: dict[str, Any] | None,
    current_step: str | None,
    payload: Any,
    signal_name: str | None,
    facts: RunFacts,
) -> DriveResult:
    """Entry point used by the segment: START or SIGNAL."""
    if kind == "START":
        result = start(plan, payload, facts)
    elif kind == "SIGNAL":
        assert signal_name is not None
        result = apply_signal(plan, state_json, current_step, signal_name, payload, facts)
    else:
        raise WorkflowDefinitionError(
            f"command kind {kind!r} is not supported by this release", definition_id=plan.id
        )
    check_state_size(result, facts.max_state_bytes)
    return result


STEP_ATTRIBUTE = "_vertique_step"


def mark_step(exc: BaseException, step_id: str) -> None:
    """Remember which step raised, so the executor can say where (never what)."""
    if not hasattr(exc, STEP_ATTRIBUTE):
        setattr(exc, STEP_ATTRIBUTE, step_id)


def _call(step_id: str, callback: Any, state: Any, ctx: StepContext) -> Any:
    try:
        return callback(state, ctx)
    except Exception as exc:
        mark_step(exc, step_id)
        raise


def _run(
    plan: Plan, state: Any, step_id: str, facts: RunFacts, decisions: list[Decision]
) -> DriveResult:
    # The JSON of the state is taken once per step that runs code (a fresh
    # copy, so code that mutates the state in place cannot alter the log).
    before = plan.state_to_json(state)
    for _ in range(MAX_STEPS_PER_SEGMENT):
        step = plan.step(step_id)
        if step.kind == "action":
            assert step.callback is not None and step.next is not None
            result = _call(step.id, step.callback, state, _context(facts, step.id))
            state = state if result is None else result
            after = plan.state_to_json(state)
            decisions.append(Decision(step.id, "ACTION_COMPLETED", before, after))
            before = after
            step_id = step.next
        elif step.kind == "decision":
            assert step.callback is not None
            chosen = _call(step.id, step.callback, state, _context(facts, step.id))
            if chosen not in step.targets:
                # the value chosen is workflow data: it goes to the log only
                exc = NonRetryable(
                    "DECISION_TARGET_UNDECLARED",
                    f"decision {step.id!r} chose {str(chosen)[:64]!r}",
                )
                mark_step(exc, step.id)
                raise exc
            after = plan.state_to_json(state)  # a decision should not change it; if it did, log it
            decisions.append(Decision(step.id, "DECISION_TAKEN", before, after, {"chosen": chosen}))
            before = after
            step_id = chosen
        elif step.kind == "wait":
            decisions.append(
                Decision(step.id, "WAITING", before, before, {"signals": list(step.signals)})
            )
            return DriveResult(
                True, "WAITING", step.id, before, decisions, waiting=tuple(step.signals)
            )
        elif step.kind == "end":
            decisions.append(Decision(step.id, "COMPLETED", before, before))
            return DriveResult(True, "COMPLETED", step.id, before, decisions)
        elif step.kind == "fail":
            reason = step.reason or "FAILED"
            decisions.append(Decision(step.id, "FAILED", before, before, {"reason": reason}))
            return DriveResult(
                True,
                "FAILED",
                step.id,
                before,
                decisions,
                error_type=reason,
                error_message=f"{reason}: workflow reached fail step {step.id!r}",
            )
        else:
            raise WorkflowDefinitionError(
                f"step kind {step.kind!r} is not supported by this release",
                definition_id=plan.id,
                step_id=step.id,
            )
    exc = NonRetryable(
        "STEP_LIMIT_EXCEEDED", f"ran {MAX_STEPS_PER_SEGMENT} steps without waiting or ending"
    )
    mark_step(exc, step_id)
    raise exc


__all__ = [
    "STEP_NOT_IN_PLAN",
    "Decision",
    "DriveResult",
    "RunFacts",
    "apply_signal",
    "check_state_size",
    "current_step_of",
    "drive",
    "resume",
    "start",
    "state_of",
]
