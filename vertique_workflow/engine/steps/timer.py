"""``timer``: wait a duration, or until an instant computed from the state.

Entering schedules a STEP timer (its FIRE command is available at the fire
time, on the database clock; a past instant counts as now) and waits. The
FIRE timer, while its row is still SCHEDULED and the instance still stands
here, marks the timer FIRED and goes to ``next``; any other timer finds the
step left and settles STALE.
"""

from __future__ import annotations

from ...definitions import Step
from ..effects import FireTimer, ScheduleTimer
from ..events import Event, Refusal, TimerFired
from ..transition import Halt, Run

NAME = "timer"
PURPOSE = "STEP"


def enter(run: Run, step: Step) -> Halt:
    how, when = run.call(step.id, step.timer_fire, run.state, run.context(step.id))
    if how == "delay":
        run.effect(ScheduleTimer(step.id, PURPOSE, delay_seconds=float(when)))
        run.note(step.id, "TIMER_SCHEDULED", {"delaySeconds": when})
    else:
        run.effect(ScheduleTimer(step.id, PURPOSE, fire_at=when))
        run.note(step.id, "TIMER_SCHEDULED", {"fireAt": when.isoformat()})
    return Halt("WAITING")


def refusal(step: Step, event: Event) -> Refusal | None:
    if (
        isinstance(event, TimerFired)
        and event.timer_kind == "FIRE"
        and event.scheduled
        and event.step_id == step.id
    ):
        return None
    return event.refused(step.id)  # type: ignore[union-attr]


def accept(run: Run, step: Step, event: Event) -> str:
    assert isinstance(event, TimerFired) and step.next is not None
    run.effect(FireTimer(event.timer_id))
    run.note(step.id, "TIMER_FIRED")
    return step.next
