"""``fail``: the instance fails with the step's reason (retryable with ``wf.retry``).

When steps of the instance's token recorded compensations, the instance
compensates instead and ends COMPENSATED (``engine/compensation.py``).

In a branch only the branch fails: it arrives FAILED at its join, whose
policy decides whether the instance goes on.
"""

from __future__ import annotations

from ...definitions import Step
from .. import compensation
from ..effects import CloseAll
from ..transition import Halt, Run

NAME = "fail"


def enter(run: Run, step: Step) -> Halt | str:
    reason = step.reason or "FAILED"
    if run.token is not None:  # a branch fails alone: its join's policy decides
        return fail_branch(
            run, step, "FAILED", {"reason": reason}, f"{reason}: fail step {step.id!r}"
        )
    if run.plan.compensation_steps:  # recorded compensations run first (engine/compensation.py)
        done = compensation.finished(run)
        if done is not None:
            run.note(step.id, compensation.COMPENSATED, {"reason": reason})
            return Halt(
                compensation.COMPENSATED,
                error_type=reason,
                error_message=f"{reason}: workflow reached fail step {step.id!r}; "
                "its recorded compensations ran",
            )
        first = compensation.begin(run, step.id, reason)
        if first is not None:
            if run.plan.opens_timers_or_tasks:
                run.effect(CloseAll())
            return first
    run.note(step.id, "FAILED", {"reason": reason})
    if run.plan.opens_timers_or_tasks:
        run.effect(CloseAll())
    return Halt(
        "FAILED",
        error_type=reason,
        error_message=f"{reason}: workflow reached fail step {step.id!r}",
    )


def fail_branch(run: Run, step: Step, outcome: str, detail: dict[str, str], error: str) -> Halt:
    """End ``run``'s branch FAILED at ``step``: it arrives FAILED at its fork's join.

    For a ``fail`` step and for a step that failed terminally (its attempts
    spent, or an error its policy never retries): the branch keeps its
    token, and the join's policy decides whether the instance goes on.
    ``error`` is a stored text of :mod:`vertique_workflow.failures` kind.
    """
    from . import join

    run.note(step.id, outcome, detail)
    fork = run.plan.step(run.token.fork_step).fork
    assert fork is not None
    join.arrive(run, run.plan.step(fork.join), "FAILED", error)
    return Halt("BRANCH_FAILED")
