"""``decision``: ``callback(state, ctx)`` names the next step, one of the declared targets."""

from __future__ import annotations

from ...definitions import Step
from ...exceptions import NonRetryable
from ..transition import Run, mark_step

NAME = "decision"


def enter(run: Run, step: Step) -> str:
    assert step.callback is not None
    chosen = run.call(step.id, step.callback, run.state, run.context(step.id))
    if chosen not in step.targets:
        # the value chosen is workflow data: it goes to the log only
        exc = NonRetryable(
            "DECISION_TARGET_UNDECLARED", f"decision {step.id!r} chose {str(chosen)[:64]!r}"
        )
        mark_step(exc, step.id)
        raise exc
    # a decision should not change the state; if it did, the log shows it
    run.log(step.id, "DECISION_TAKEN", {"chosen": chosen})
    return str(chosen)
