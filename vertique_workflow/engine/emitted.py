"""Which workflow events a transition emits, derived once from the drive's result.

The step kinds never emit events themselves: at the end of ``drive()``,
and only when the segment asks for them (``RunFacts.emit_events``: an
``event`` recorder is installed or ``workflow_event`` has receivers), this
module reads what the drive did -- the event it applied, the decisions it
logged, the effects it asked for and the status it left -- and appends one
``EmitEvent`` per fact. A drive nobody listens to pays one attribute test.
Pure: no database, no settings.
"""

from __future__ import annotations

from typing import Any

from .effects import CompleteTask, EmitEvent, OpenTask, RecordSideEffect
from .events import Signal, Start
from .transition import DriveResult

__all__ = [
    "EVENT_TYPES",
    "SERVICE_DISPATCHED",
    "SIGNAL_APPLIED",
    "STEP_ENTERED",
    "TASK_COMPLETED",
    "TASK_OPENED",
    "WORKFLOW_CANCELLED",
    "WORKFLOW_COMPLETED",
    "WORKFLOW_FAILED",
    "WORKFLOW_STARTED",
    "WORKFLOW_WAITING",
    "emitted",
]

WORKFLOW_STARTED = "WORKFLOW_STARTED"
STEP_ENTERED = "STEP_ENTERED"
TASK_OPENED = "TASK_OPENED"
TASK_COMPLETED = "TASK_COMPLETED"
SERVICE_DISPATCHED = "SERVICE_DISPATCHED"
SIGNAL_APPLIED = "SIGNAL_APPLIED"
WORKFLOW_WAITING = "WORKFLOW_WAITING"
WORKFLOW_COMPLETED = "WORKFLOW_COMPLETED"
WORKFLOW_FAILED = "WORKFLOW_FAILED"
WORKFLOW_CANCELLED = "WORKFLOW_CANCELLED"

# Every event type, in the order a transition emits them. Compensation
# (COMPENSATING, COMPENSATED) will be added here by the compensation work.
EVENT_TYPES: tuple[str, ...] = (
    WORKFLOW_STARTED,
    SIGNAL_APPLIED,
    STEP_ENTERED,
    TASK_OPENED,
    TASK_COMPLETED,
    SERVICE_DISPATCHED,
    WORKFLOW_WAITING,
    WORKFLOW_COMPLETED,
    WORKFLOW_FAILED,
    WORKFLOW_CANCELLED,
)

_ENDS = {"COMPLETED": WORKFLOW_COMPLETED, "FAILED": WORKFLOW_FAILED}


def _branch(detail: dict[str, Any] | None) -> dict[str, Any]:
    if not detail:
        return {}
    return {
        "branch_token_id": detail.get("tokenId"),
        "fork_step_id": detail.get("forkStepId"),
        "branch_id": detail.get("branchId"),
    }


def _left_step(event: Any, snapshot: Any, result: DriveResult) -> int:
    """How many leading decisions are the addressed token *leaving* the step it waited at.

    A delivered event (a signal, a timer, a completion, a result) is accepted
    by the step its token stands at: that decision is not an entry.
    """
    if isinstance(event, Start) or getattr(event, "kind", None) == "RETRY" or not result.decisions:
        return 0
    first = result.decisions[0]
    if first.branch is None:
        standing = snapshot.current_step
    else:
        token_id = str(first.branch.get("tokenId"))
        standing = next((t.current_step for t in snapshot.branches if str(t.id) == token_id), None)
    return 1 if first.step_id == standing else 0


def emitted(event: Any, result: DriveResult, snapshot: Any = None) -> list[EmitEvent]:
    """The events of an applied transition, in the order they happened.

    The command's event first (the start, an applied signal), then one
    ``STEP_ENTERED`` per step a token entered (with the branch's identity;
    the step a delivered event's token leaves is not one),
    the tasks and dispatches the steps asked for, and last the status the
    instance was left in (waiting, completed, failed).
    """
    if not result.applied:
        return []
    out: list[EmitEvent] = []
    if isinstance(event, Start):
        out.append(EmitEvent(WORKFLOW_STARTED))
    elif isinstance(event, Signal):
        data: dict[str, Any] = {"signal": event.name}
        if event.branch is not None:
            data["forkStepId"], data["branchId"] = event.branch
        out.append(EmitEvent(SIGNAL_APPLIED, data=data))
    skip = 0 if snapshot is None else _left_step(event, snapshot, result)
    for decision in result.decisions[skip:]:
        out.append(
            EmitEvent(
                STEP_ENTERED,
                decision.step_id,
                {"outcome": decision.outcome},
                **_branch(decision.branch),
            )
        )
    for effect in result.effects:
        if isinstance(effect, OpenTask):
            out.append(
                EmitEvent(
                    TASK_OPENED,
                    effect.step_id,
                    {"taskId": str(effect.task_id), "title": effect.title},
                    effect.branch_token_id,
                    effect.fork_step_id,
                    effect.branch_id,
                )
            )
        elif isinstance(effect, CompleteTask):
            out.append(
                EmitEvent(
                    TASK_COMPLETED,
                    None,
                    {"taskId": str(effect.task_id), "decision": effect.decision},
                )
            )
        elif isinstance(effect, RecordSideEffect) and effect.kind == "service":
            out.append(
                EmitEvent(
                    SERVICE_DISPATCHED,
                    effect.step_id,
                    {"dispatchKey": effect.dispatch_key},
                    effect.branch_token_id,
                    effect.fork_step_id,
                    effect.branch_id,
                )
            )
    if result.status == "WAITING":
        out.append(
            EmitEvent(WORKFLOW_WAITING, result.current_step, {"waiting": list(result.waiting)})
        )
    elif result.status in _ENDS:
        data = {"errorType": result.error_type} if result.status == "FAILED" else {}
        out.append(EmitEvent(_ENDS[result.status], result.current_step, data))
    return out
