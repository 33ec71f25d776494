"""``fail``: the instance fails with the step's reason (retryable with ``wf.retry``)."""

from __future__ import annotations

from ...definitions import Step
from ..effects import CloseAll
from ..transition import Halt, Run

NAME = "fail"


def enter(run: Run, step: Step) -> Halt:
    reason = step.reason or "FAILED"
    run.note(step.id, "FAILED", {"reason": reason})
    if run.plan.opens_timers_or_tasks:
        run.effect(CloseAll())
    return Halt(
        "FAILED",
        error_type=reason,
        error_message=f"{reason}: workflow reached fail step {step.id!r}",
    )
