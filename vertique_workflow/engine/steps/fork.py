"""``fork``: start parallel branches; the token that forks waits for their join.

Entering computes the branches (fixed ones, or one per item of a list in
the state: ``definitions.branches.branches_of``), opens the join's progress
and creates one branch token per branch -- each on its own copy of the
state (for a fan-out over a state field, with that field empty: the branch
has its item in ``ctx.branch_item``), with the durable context of the
drive as its metadata -- which the same drive runs at once, until each
waits, arrives at the join or fails.
A fork inside a branch keys its tokens and join by the branch's token
(``tokens.scoped_key``), so nested forks and fan-outs never collide.
"""

from __future__ import annotations

from ...definitions import Step
from ...definitions.branches import BranchListError, branches_of
from ...exceptions import NonRetryable
from ..tokens import scoped_key
from ..transition import Halt, Run, mark_step
from . import join

NAME = "fork"


def enter(run: Run, step: Step) -> Halt:
    spec = step.fork
    assert spec is not None
    try:
        found = run.call(step.id, branches_of, step, run.state, run.context(step.id))
    except (BranchListError, TypeError) as exc:
        # the list or the keys the state gives cannot make branches: every
        # attempt would fail the same way (the message goes to the log only)
        refused = NonRetryable("FORK_BRANCHES_INVALID", str(exc))
        mark_step(refused, step.id)
        raise refused from exc
    fork_key = scoped_key(step.id, run.key)
    join_key = scoped_key(spec.join, run.key)
    ids = [branch_id for branch_id, _, _ in found]
    run.note(step.id, "FORKED", {"branches": ids[:50], "count": len(ids)})
    # a fan-out over a state field gives each branch its item (ctx.branch_item),
    # not the whole list: each branch's copy holds the field empty, so a fork
    # over n items stores and logs O(n), not O(n^2)
    base = {**run.before, spec.each: []} if isinstance(spec.each, str) else None
    run.drive.spawn(run, fork_key, join_key, found, base)
    if not found:  # an empty fan-out: the join's policy decides at once
        join.decide(run.drive, run.plan.step(spec.join), join_key, fork_key, run.key)
    return Halt("WAITING")
