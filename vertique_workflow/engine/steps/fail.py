"""``fail``: the instance fails with the step's reason (retryable with ``wf.retry``)."""

from __future__ import annotations

from ...definitions import Step
from ..transition import Halt, Run

NAME = "fail"


def enter(run: Run, step: Step) -> Halt:
    reason = step.reason or "FAILED"
    run.note(step.id, "FAILED", {"reason": reason})
    return Halt(
        "FAILED",
        error_type=reason,
        error_message=f"{reason}: workflow reached fail step {step.id!r}",
    )
