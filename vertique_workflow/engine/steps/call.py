"""``call``: start another workflow as a child and wait for it to end.

Entering builds the child's start payload from the state and asks the
segment to start the child in the same transaction (``StartChild``), with
an idempotency key derived from the parent, the command and the step (a
retried segment never starts two) and the parent's id, step and branch
stored with the child. When the child ends, its outcome comes back as a
deduplicated command: ``result`` folds the ``ChildResult`` into the state,
and the parent goes to ``on_completed`` (the child COMPLETED) or
``on_failed``; without ``on_failed`` the parent fails (in a branch: the
branch fails and its join decides).
"""

from __future__ import annotations

from ...definitions import Step
from ...definitions.branches import ChildResult, call_payload
from ..effects import StartChild
from ..events import ChildEnded, Event, Refusal
from ..transition import Halt, Run

NAME = "call"


def enter(run: Run, step: Step) -> Halt:
    spec = step.call
    assert spec is not None
    payload = run.call(step.id, call_payload, step, run.state, run.context(step.id))
    facts = run.facts
    token = run.token
    parent = {"id": str(facts.instance_id), "stepId": step.id}
    if token is not None:
        parent.update(
            branchTokenId=str(token.id), forkStepId=token.fork_key, branchId=token.branch_id
        )
    key = f"vertique.call:{facts.instance_id}:{facts.command_id}:{run.key or '-'}:{step.id}"
    run.effect(StartChild(spec.workflow, spec.version, payload, key, parent))
    run.note(step.id, "CHILD_STARTED", {"workflow": spec.workflow})
    return Halt("WAITING")


def refusal(step: Step, event: Event) -> Refusal | None:
    if isinstance(event, ChildEnded) and event.step_id == step.id:
        return None
    return event.refused(step.id)  # type: ignore[union-attr]


def accept(run: Run, step: Step, event: Event) -> str | Halt:
    spec = step.call
    assert spec is not None and isinstance(event, ChildEnded)
    child = ChildResult(event.status, event.state, event.error_type)
    if spec.result is not None:
        folded = run.call(step.id, spec.result, run.state, child, run.context(step.id))
        if folded is not None:
            run.state = folded
    run.log(step.id, "CHILD_ENDED", {"childId": str(event.child_id), "status": event.status})
    if event.status == "COMPLETED":
        assert spec.on_completed is not None
        return spec.on_completed
    if spec.on_failed is not None:
        return spec.on_failed
    reason = f"CHILD_FAILED: the child of call step {step.id!r} ended {event.status}"
    if run.token is None:
        return Halt("FAILED", error_type="CHILD_FAILED", error_message=reason)
    from . import join

    fork = run.plan.step(run.token.fork_step).fork
    assert fork is not None
    join.arrive(run, run.plan.step(fork.join), "FAILED", reason)
    return Halt("BRANCH_FAILED")
