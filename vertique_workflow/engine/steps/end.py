"""``end``: the instance completes; a timer still scheduled or a task still open is closed."""

from __future__ import annotations

from ...definitions import Step
from ..effects import CloseAll
from ..transition import Halt, Run

NAME = "end"


def enter(run: Run, step: Step) -> Halt:
    run.note(step.id, "COMPLETED")
    if run.plan.opens_timers_or_tasks:
        run.effect(CloseAll())
    return Halt("COMPLETED")
