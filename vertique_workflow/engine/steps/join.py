"""``join``: where the branches of its fork end, and where the forking token goes on.

A branch token that reaches the join *arrives* (its branch COMPLETED); a
branch token that reaches a ``fail`` step arrives FAILED. Each arrival is
appended to the join's progress and the policy (``join_outcome``: all, any,
n of m) is asked again:

- decided: the join is marked decided, the branches it no longer needs are
  superseded (their timers, tasks and parked signals go with them), the
  ``merge`` callable folds the branch results into the state the forking
  token had at the fork, and that token goes on to ``next``;
- failed (too many branches failed for the policy): ``on_failed`` when
  declared; otherwise the forking token fails -- the instance, or, for a
  nested fork, the enclosing branch, which arrives FAILED at its own join.
"""

from __future__ import annotations

from typing import Any

from ...definitions import Step
from ...definitions.branches import BranchResult, join_outcome
from ...exceptions import WorkflowDefinitionError
from ..effects import Arrive, DecideJoin
from ..tokens import scoped_key
from ..transition import Halt, Run

NAME = "join"


def enter(run: Run, step: Step) -> Halt:
    if run.token is None:  # validated plans reach a join only from its fork's branches
        raise WorkflowDefinitionError(
            f"join {step.id!r} was reached outside the branches of its fork", step_id=step.id
        )
    arrive(run, step, "COMPLETED")
    return Halt("ARRIVED")


def arrive(run: Run, step: Step, status: str, error: str | None = None) -> None:
    """Record that ``run``'s branch ended (``status``) at the join ``step``, then decide."""
    drive, token = run.drive, run.token
    join_key = scoped_key(step.id, token.parent_id)
    progress = drive.progress(join_key)
    if progress.decided:
        return
    arrival: dict[str, Any] = {
        "branchId": token.branch_id,
        "tokenId": str(token.id),
        "status": status,
    }
    if error is not None:
        arrival["error"] = error[:255]
    progress.arrived.append(arrival)
    run.effect(Arrive(join_key, (arrival,)))
    run.note(step.id, "ARRIVED" if status == "COMPLETED" else "BRANCH_FAILED")
    decide(drive, step, join_key, token.fork_key, token.parent_id)


def results(drive: Any, progress: Any) -> dict[str, BranchResult]:
    """The ended branches of a join, by branch id, with their states."""
    found: dict[str, BranchResult] = {}
    for arrival in progress.arrived:
        token = drive.token(arrival["tokenId"])
        run = drive.runs.get(arrival["tokenId"])
        state = run.state if run is not None else drive.plan.state_from_json(token.state)
        error = arrival.get("error")  # a stored failure text: its reason code
        code = error.split(":", 1)[0] if error else None
        found[arrival["branchId"]] = BranchResult(arrival["status"], state, code)
    return found


def decide(drive: Any, step: Step, join_key: str, fork_key: str, parent_key: str | None) -> None:
    """Ask the join's policy; when it has decided, move the forking token on."""
    progress = drive.progress(join_key)
    statuses = {  # the policy counts statuses: the branches' states are read once it decided
        a["branchId"]: BranchResult(a["status"], None, a.get("error")) for a in progress.arrived
    }
    outcome = join_outcome(step, progress.expected, statuses)
    if outcome == "WAIT":
        return
    ended = results(drive, progress)
    progress.decided = True
    drive.effects.append(DecideJoin(join_key))
    arrived = {a["tokenId"] for a in progress.arrived}
    drive.supersede([t for t in drive.siblings(fork_key) if str(t.id) not in arrived])
    parent = drive.main_run() if parent_key is None else drive.token_run(drive.token(parent_key))
    spec = step.join
    assert spec is not None
    completed = sorted(b for b, r in ended.items() if r.status == "COMPLETED")
    failed = sorted(b for b, r in ended.items() if r.status == "FAILED")
    if outcome == "DECIDED":
        if spec.merge is not None:
            merged = parent.call(step.id, spec.merge, parent.state, ended, parent.context(step.id))
            if merged is not None:
                parent.state = merged
        parent.log(step.id, "JOINED", {"completed": completed[:50], "failed": failed[:50]})
        assert step.next is not None
        drive.go(parent, step.next)
        return
    parent.note(step.id, "JOIN_FAILED", {"completed": completed[:50], "failed": failed[:50]})
    if spec.on_failed is not None:
        drive.go(parent, spec.on_failed)
        return
    reason = f"JOIN_FAILED: join {step.id!r} cannot be met: {len(failed)} of its branches failed"
    if parent.token is None:
        drive.halts[None] = (step, Halt("FAILED", error_type="JOIN_FAILED", error_message=reason))
        return
    # a nested fork failed its branch: that branch arrives FAILED at its own join
    outer = drive.plan.step(drive.plan.step(parent.token.fork_step).fork.join)
    drive.halts[parent.key] = (step, Halt("BRANCH_FAILED"))
    arrive(parent, outer, "FAILED", reason)
