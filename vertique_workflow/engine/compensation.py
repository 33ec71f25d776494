"""Compensation: a ``fail`` step undoes the recorded steps, newest first.

A step with ``compensate`` that completes (an action ran, a service step got
a COMPLETED result) on the instance's own token is *recorded*: its decision
carries ``{"compensate": <compensation step>}``. Nothing else is stored: the
stack is the history's decisions, read lazily (``Snapshot.compensation_marks``)
only when a plan that declares compensations needs it, followed by the
decisions of the drive in progress.

Reaching a ``fail`` step with recorded compensations logs ``COMPENSATING``
there and runs the compensations in reverse order of recording; each
compensation step logs its own decision with ``{"compensates": <step>}``,
which takes its entry off the stack. A compensation service step waits,
the instance ``COMPENSATING``. When the stack is empty the drive goes back
to the fail step, which logs ``COMPENSATED`` and ends the instance
``COMPENSATED`` with the fail step's reason as its error type. Validation
ensures a compensation step is reached only as a compensation, so a token
standing at one is compensating -- which is how a service result or a
retry at one knows to go on compensating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .transition import Halt, Run

__all__ = [
    "COMPENSATE",
    "COMPENSATED",
    "COMPENSATES",
    "COMPENSATING",
    "COMPENSATION_FAILED",
    "Mark",
    "Progress",
    "after_compensation",
    "progress",
    "recorded_detail",
]

COMPENSATE = "compensate"  # detail of a recorded step's decision: the step that undoes it
COMPENSATES = "compensates"  # detail of a compensation step's decision: the step it undid
COMPENSATING = "COMPENSATING"
COMPENSATED = "COMPENSATED"
COMPENSATION_FAILED = "COMPENSATION_FAILED"

# the outcomes of a step that completed (recorded, or a compensation done)
_DONE = frozenset({"ACTION_COMPLETED", "SERVICE_COMPLETED"})


@dataclass(frozen=True)
class Mark:
    """One decision of the instance's own token that compensation reads."""

    step_id: str
    outcome: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Progress:
    """Where compensation stands: the recorded (step, compensation) stack, newest last.

    ``fail_step`` and ``reason`` are set once a fail step began compensating.
    """

    stack: list[tuple[str, str]] = field(default_factory=list)
    fail_step: str | None = None
    reason: str | None = None

    @property
    def begun(self) -> bool:
        return self.fail_step is not None


def fold(marks: Sequence[Mark]) -> Progress:
    """Fold marks, oldest first, into the compensation's progress."""
    found = Progress()
    for mark in marks:
        detail = mark.detail or {}
        if mark.outcome == COMPENSATING:
            found.fail_step, found.reason = mark.step_id, detail.get("reason")
        elif mark.outcome == COMPENSATED:
            found = Progress()
        elif mark.outcome in _DONE and COMPENSATES in detail:
            if found.stack:
                found.stack.pop()
        elif mark.outcome in _DONE and detail.get(COMPENSATE) is not None:
            found.stack.append((mark.step_id, str(detail[COMPENSATE])))
    return found


def progress(run: Run) -> Progress:
    """The compensation progress of ``run``'s instance: the history, then this drive."""
    stored = run.drive.compensation_marks() if run.drive is not None else ()
    current = [Mark(d.step_id, d.outcome, d.detail) for d in run.decisions if d.branch is None]
    return fold([*stored, *current])


def is_compensating(run: Run, step_id: str) -> bool:
    """Whether ``run`` stands at ``step_id`` as a compensation (the instance's token only)."""
    return run.token is None and step_id in run.plan.compensation_steps


def recorded_detail(run: Run, step: Any) -> dict[str, Any]:
    """The decision detail of a completed step: what records it, or what it compensated."""
    if run.token is not None:
        return {}
    if step.id in run.plan.compensation_steps:
        top = progress(run).stack
        return {COMPENSATES: top[-1][0] if top else None}
    if step.compensate is not None:
        return {COMPENSATE: step.compensate}
    return {}


def begin(run: Run, fail_step: str, reason: str) -> str | None:
    """At a ``fail`` step: the first compensation to run (COMPENSATING logged), or None."""
    found = progress(run)
    if found.begun:  # the compensations have all run: the fail step ends them
        return None
    if not found.stack:
        return None
    pending = [undo for _, undo in reversed(found.stack)]
    run.note(fail_step, COMPENSATING, {"reason": reason, "compensations": pending})
    return found.stack[-1][1]


def finished(run: Run) -> Progress | None:
    """At a ``fail`` step: the progress when the compensations began and have all run."""
    found = progress(run)
    return found if found.begun and not found.stack else None


def after_compensation(run: Run) -> str:
    """The step after a compensation completed: the next compensation, or the fail step."""
    found = progress(run)
    if found.stack:
        return found.stack[-1][1]
    assert found.fail_step is not None
    return found.fail_step


def compensation_failed(step_id: str, code: str) -> Halt:
    """A compensation service step whose call failed for good: the instance FAILS (retryable)."""
    return Halt(
        "FAILED",
        error_type=COMPENSATION_FAILED,
        error_message=(
            f"{COMPENSATION_FAILED}: the compensation service step {step_id!r} failed ({code}); "
            "retry the instance to compensate on"
        ),
    )
