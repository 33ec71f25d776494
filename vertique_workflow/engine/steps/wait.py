"""``wait``: stop until one of the step's signals arrives (or its timeout fires).

Entering logs WAITING and, with ``timeout``, schedules a SIGNAL_TIMEOUT
timer whose TIMEOUT command names the wait (``{stepId, signalNames}``), so
the eligibility rule holds it back while a signal for this wait, recorded
before its ``fire_at``, is on its way. An accepted signal folds its payload
into the state and cancels the timeout; a timeout that fires while its timer
is still SCHEDULED leaves the wait for ``on_timeout``.
"""

from __future__ import annotations

from ...definitions import Step
from ...exceptions import WorkflowDefinitionError, WorkflowValidationError
from ..effects import CancelTimers, FireTimer, ScheduleTimer
from ..events import Event, Refusal, Signal, TimerFired
from ..transition import Halt, Run, mark_step, refused_input

NAME = "wait"
TIMEOUT_PURPOSE = "SIGNAL_TIMEOUT"


def _timeout(step: Step) -> float | None:
    timeout = getattr(step, "timeout", None)
    return None if timeout is None else timeout.total_seconds()


def enter(run: Run, step: Step) -> Halt:
    run.note(step.id, "WAITING", {"signals": list(step.signals)})
    seconds = _timeout(step)
    if seconds is not None:
        run.effect(
            ScheduleTimer(
                step.id,
                TIMEOUT_PURPOSE,
                delay_seconds=seconds,
                target={"stepId": step.id, "signalNames": sorted(step.signals)},
            )
        )
    return Halt("WAITING", waiting=tuple(step.signals))


def refusal(step: Step, event: Event) -> Refusal | None:
    if isinstance(event, Signal) and event.name in step.signals:
        return None
    if (
        isinstance(event, TimerFired)
        and event.timer_kind == "TIMEOUT"
        and event.scheduled
        and event.step_id == step.id
    ):
        return None
    return event.refused(step.id)  # type: ignore[union-attr]


def accept(run: Run, step: Step, event: Event) -> str:
    if isinstance(event, TimerFired):
        run.effect(FireTimer(event.timer_id))
        run.note(step.id, "TIMED_OUT", {"signals": list(step.signals)})
        target = getattr(step, "on_timeout", None)
        if target is None:  # validated plans name one with every timeout
            raise WorkflowDefinitionError(
                f"wait {step.id!r} has no on_timeout step", step_id=step.id
            )
        return str(target)
    assert isinstance(event, Signal)
    plan, name = run.plan, event.name
    ctx = run.context(step.id, signal_name=name, signal_payload=event.payload)
    try:
        run.state = plan.apply_signal(step, run.state, name, event.payload, ctx)
    except Exception as exc:
        if isinstance(exc, WorkflowValidationError) and step.apply is None:
            # the default merge refused the payload; a wait's own apply is
            # workflow code, retried like any other
            raise refused_input("PAYLOAD_INVALID", exc, step.id) from exc
        mark_step(exc, step.id)
        raise
    run.log(step.id, "SIGNAL_APPLIED", {"signal": name})
    if _timeout(step) is not None:
        run.effect(CancelTimers(step.id, (TIMEOUT_PURPOSE,)))
    target = plan.next_after_signal(step, name)
    if target is None:  # validated plans always name one
        raise WorkflowDefinitionError(
            f"wait {step.id!r} has no next step for {name!r}",
            definition_id=plan.id,
            step_id=step.id,
        )
    return target
