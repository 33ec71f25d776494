"""``action``: run ``callback(state, ctx)`` in the segment and go to ``next``."""

from __future__ import annotations

from ...definitions import Step
from ..transition import Run

NAME = "action"


def enter(run: Run, step: Step) -> str:
    assert step.callback is not None and step.next is not None
    result = run.call(step.id, step.callback, run.state, run.context(step.id))
    if result is not None:
        run.state = result
    run.log(step.id, "ACTION_COMPLETED")
    return step.next
