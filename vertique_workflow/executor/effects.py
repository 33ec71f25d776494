"""Persisting a transition's effects, in the reference's lock order.

The engine hands the segment its effects as data (``engine/effects.py``);
this module writes them through ``store/`` before the instance is updated:
every timer statement first (fire, cancel, then one statement recording all
new timers with their TIMER commands), then every task statement -- the
order execution lock -> timers -> tasks -> branch tokens -> instances ->
queues that every writer keeps, so a segment and a recording or a cancel
can never deadlock. A guarded write that finds its row changed raises a
transient conflict: the segment rolls back and its command is retried.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..engine.effects import (
    CancelTasks,
    CancelTimers,
    CloseAll,
    CompleteTask,
    Effect,
    FireTimer,
    OpenTask,
    ScheduleTimer,
)
from ..store import tasks, timers
from ..store.timers import TimerSpec

TASK_TIMERS = ("TASK_DUE", "TASK_REMINDER")


def persist(
    workflow_id: Any,
    command_id: int,
    effects: Sequence[Effect],
    metadata: dict[str, Any] | None,
) -> None:
    """Write ``effects`` of one transition of ``workflow_id`` (the segment holds the lock).

    ``command_id`` is the segment's own command, never cancelled with a
    timer (it settles with the transition). ``metadata`` is the durable
    context of the drive, stored on every timer it records (the TIMER
    segment binds it again when the timer fires).
    """
    if not effects:
        return
    specs: list[TimerSpec] = []
    opened: list[tuple[uuid.UUID, OpenTask]] = []
    for effect in effects:  # timers
        if isinstance(effect, FireTimer):
            timers.mark_fired(effect.timer_id)
        elif isinstance(effect, CancelTimers):
            timers.cancel_scheduled(
                workflow_id,
                step_id=effect.step_id,
                purposes=list(effect.purposes) or None,
                keep_command_id=command_id,
            )
        elif isinstance(effect, CompleteTask):
            timers.cancel_scheduled(
                workflow_id,
                task_id=effect.task_id,
                purposes=list(TASK_TIMERS),
                keep_command_id=command_id,
            )
        elif isinstance(effect, CancelTasks):
            timers.cancel_scheduled(
                workflow_id,
                step_id=effect.step_id,
                purposes=list(TASK_TIMERS),
                keep_command_id=command_id,
            )
        elif isinstance(effect, CloseAll):
            timers.cancel_scheduled(workflow_id, keep_command_id=command_id)
        elif isinstance(effect, ScheduleTimer):
            specs.append(
                TimerSpec(
                    uuid.uuid4(),
                    effect.step_id,
                    effect.purpose,
                    effect.delay_seconds,
                    effect.fire_at,
                    target=effect.target,
                    metadata=metadata,
                )
            )
        elif isinstance(effect, OpenTask):
            task_id = uuid.uuid4()
            opened.append((task_id, effect))
            specs.extend(_task_timers(task_id, effect, metadata))
    recorded = timers.record(workflow_id, specs) if specs else []
    fired_at = dict(zip((spec.timer_id for spec in specs), recorded, strict=True))
    due_at = {
        spec.task_id: fired_at[spec.timer_id][1] for spec in specs if spec.purpose == "TASK_DUE"
    }
    for effect in effects:  # tasks
        if isinstance(effect, CompleteTask):
            if not tasks.mark_completed(
                effect.task_id, effect.command_id, effect.decision, effect.result
            ):
                raise timers.TimerConflict("the task changed under the execution lock")
        elif isinstance(effect, CancelTasks | CloseAll):
            tasks.cancel_open(workflow_id)
    for task_id, effect in opened:
        tasks.insert_open(
            task_id,
            workflow_id,
            step_id=effect.step_id,
            name=effect.title,
            assignee=effect.assignee,
            candidate_users=list(effect.candidate_users),
            candidate_groups=list(effect.candidate_groups),
            decisions_snapshot=effect.decisions,
            due_at=due_at.get(task_id),
            require_version_stability=effect.require_version_stability,
        )


def _task_timers(
    task_id: uuid.UUID, effect: OpenTask, metadata: dict[str, Any] | None
) -> list[TimerSpec]:
    """The task's REMINDER timers, then its DUE timer: queue order is fire-time order.

    Timers that come due together (time skipping, an executor that was
    down) run in queue order, so the reminders (each before the due date)
    are recorded first, earliest first.
    """
    found = [
        _spec(task_id, effect.step_id, "TASK_REMINDER", seconds, metadata)
        for seconds in sorted(effect.reminder_seconds)
    ]
    if effect.due_seconds is not None:
        found.append(_spec(task_id, effect.step_id, "TASK_DUE", effect.due_seconds, metadata))
    return found


def _spec(
    task_id: uuid.UUID, step_id: str, purpose: str, seconds: float, metadata: Any
) -> TimerSpec:
    return TimerSpec(
        uuid.uuid4(), step_id, purpose, seconds, None, task_id=task_id, metadata=metadata
    )


__all__ = ["persist"]
