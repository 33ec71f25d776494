"""``end``: the instance completes."""

from __future__ import annotations

from ...definitions import Step
from ..transition import Halt, Run

NAME = "end"


def enter(run: Run, step: Step) -> Halt:
    run.note(step.id, "COMPLETED")
    return Halt("COMPLETED")
