"""``task``: open a human task and wait for its completion, due date or reminders.

Entering resolves the people (assignee, candidate users and groups; each
may be computed from the state), opens the task with the payload schema of
each decision in its snapshot, and schedules its DUE timer and REMINDER
timers. While the instance waits here:

- the COMPLETION that reserved this step's task (OPEN -> COMPLETING, on the
  record side) completes it when its decision is one the step declares and,
  with ``require_version_stability``, the subject version the user reviewed
  is still the state's; the payload is merged into the state like a
  signal's, the task's other timers are cancelled, and the decision's step
  follows. Otherwise the command is REJECTED and the task reopened;
- the DUE timer closes the task (and its reminders) and takes ``on_due``;
- a REMINDER timer logs a reminder and keeps the task open.
"""

from __future__ import annotations

from ...definitions import Step
from ...exceptions import WorkflowValidationError
from ..effects import CancelTasks, CompleteTask, FireTimer, OpenTask
from ..events import Completion, Event, Refusal, TimerFired
from ..transition import Halt, Run

NAME = "task"


def enter(run: Run, step: Step) -> Halt:
    spec = step.task
    assert spec is not None
    from ...definitions.tasks import resolve_people

    assignee, users, groups = run.call(
        step.id, resolve_people, spec, run.state, run.context(step.id)
    )
    run.effect(
        OpenTask(
            step.id,
            spec.title or step.id,
            assignee,
            tuple(users),
            tuple(groups),
            spec.snapshot(),
            due_seconds=None if spec.due is None else spec.due.total_seconds(),
            reminder_seconds=tuple(r.total_seconds() for r in spec.reminders),
            require_version_stability=bool(spec.require_version_stability),
        )
    )
    run.note(step.id, "TASK_OPENED", {"decisions": sorted(spec.decisions)})
    return Halt("WAITING")


def refusal(step: Step, event: Event) -> Refusal | None:
    if isinstance(event, Completion):
        if event.step_id == step.id and event.reserved:
            return None
    elif (
        isinstance(event, TimerFired)
        and event.timer_kind in ("DUE", "REMINDER")
        and event.scheduled
        and event.step_id == step.id
    ):
        return None
    return event.refused(step.id)  # type: ignore[union-attr]


def accept(run: Run, step: Step, event: Event) -> str | Halt | Refusal:
    spec = step.task
    assert spec is not None
    if isinstance(event, TimerFired):
        run.effect(FireTimer(event.timer_id))
        if event.timer_kind == "REMINDER":
            run.note(step.id, "TASK_REMINDED", {"taskId": str(event.task_id)})
            return Halt("WAITING")
        run.effect(CancelTasks(step.id))
        run.note(step.id, "TASK_DUE", {"taskId": str(event.task_id)})
        assert spec.on_due is not None
        return str(spec.on_due)
    assert isinstance(event, Completion)
    chosen = spec.decisions.get(event.decision)
    if chosen is None:
        return Refusal(
            "REJECT",
            "DECISION_UNDECLARED",
            f"task step {step.id!r} declares no such decision any more",
        )
    if spec.require_version_stability:
        current = run.call(step.id, spec.subject_version_of, run.state, run.context(step.id))
        if current != event.subject_version:
            return Refusal(
                "REJECT",
                "SUBJECT_VERSION_STALE",
                f"the subject of task step {step.id!r} changed since it was reviewed",
            )
    if event.payload is not None:
        try:
            run.plan.check_merge(f"completion of {step.id}", event.payload)
        except WorkflowValidationError:
            return Refusal(
                "REJECT",
                "PAYLOAD_INVALID",
                f"the completion payload of task step {step.id!r} does not fit the state",
            )
        run.state = run.plan.merge(run.state, event.payload)
    run.log(step.id, "TASK_COMPLETED", {"decision": event.decision, "taskId": str(event.task_id)})
    run.effect(CompleteTask(event.task_id, run.facts.command_id, event.decision, event.payload))
    return str(chosen.next)
