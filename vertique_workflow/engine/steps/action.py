"""``action``: run ``callback(state, ctx)`` in the segment and go to ``next``.

Run as a compensation it goes to the next compensation instead
(``engine/compensation.py``).
"""

from __future__ import annotations

from ...definitions import Step
from .. import compensation
from ..transition import Run

NAME = "action"


def enter(run: Run, step: Step) -> str:
    assert step.callback is not None
    result = run.call(step.id, step.callback, run.state, run.context(step.id))
    if result is not None:
        run.state = result
    run.log(step.id, "ACTION_COMPLETED", compensation.recorded_detail(run, step))
    if compensation.is_compensating(run, step.id):  # run as a compensation: its next is unused
        return compensation.after_compensation(run)
    assert step.next is not None
    return step.next
