"""Effects: what a transition asks the segment to write besides the instance.

Plain data, produced by the step kinds (``engine/steps/``) and persisted by
the segment through ``store/`` in the reference's lock order: timers, then
tasks, then branch tokens, then the instance, then the command queue. The
engine never writes anything itself, so a transition can be computed,
inspected and replayed without a database.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from ..ids import uuid7

__all__ = [
    "Arrive",
    "CancelTasks",
    "CancelTimers",
    "CloseAll",
    "CompleteTask",
    "CreateBranches",
    "DecideJoin",
    "Effect",
    "EmitEvent",
    "FireTimer",
    "OpenJoin",
    "OpenTask",
    "RecordSideEffect",
    "ScheduleTimer",
    "StartChild",
    "SupersedeBranches",
    "UpdateBranches",
    "WithdrawArrival",
]


@dataclass(frozen=True)
class ScheduleTimer:
    """Record a timer and its TIMER command (``store.timers.record``).

    ``purpose`` is a ``TimerPurpose`` value (``STEP`` for a timer step,
    ``SIGNAL_TIMEOUT`` for a wait's timeout); exactly one of ``delay_seconds``
    (counted from the recording, on the database clock) and ``fire_at`` (an
    aware instant; a past one counts as now) is set. ``target`` is a
    TIMEOUT's ``{stepId, signalNames}``.
    """

    step_id: str
    purpose: str
    delay_seconds: float | None = None
    fire_at: datetime.datetime | None = None
    target: dict[str, Any] | None = None
    branch_token_id: Any = None
    fork_step_id: str | None = None
    branch_id: str | None = None


@dataclass(frozen=True)
class CancelTimers:
    """Cancel the instance's SCHEDULED timers of a step (and their TIMER commands).

    Emitted when a token leaves a step that scheduled timers: a signal that
    ends a wait cancels its timeout. ``purposes`` narrows the cancellation.
    """

    step_id: str
    purposes: tuple[str, ...] = ()
    branch_token_id: Any = None


@dataclass(frozen=True)
class FireTimer:
    """Mark the fired timer FIRED, guarded by ``status = 'SCHEDULED'`` (a row-count check)."""

    timer_id: Any


@dataclass(frozen=True)
class OpenTask:
    """Open a human task at ``step_id``, with its due and reminder timers.

    The task's id is chosen here (so its timers can name it); the segment
    records the DUE and REMINDER timers
    (``due_seconds``, ``reminder_seconds`` from the opening) and then the
    task row, in lock order.
    """

    step_id: str
    title: str
    assignee: str | None
    candidate_users: tuple[str, ...]
    candidate_groups: tuple[str, ...]
    decisions: dict[str, Any]
    due_seconds: float | None = None
    reminder_seconds: tuple[float, ...] = ()
    require_version_stability: bool = False
    task_id: Any = field(default_factory=uuid7)
    branch_token_id: Any = None
    fork_step_id: str | None = None
    branch_id: str | None = None


@dataclass(frozen=True)
class CompleteTask:
    """Complete the task the COMPLETION reserved, and cancel its due and reminder timers."""

    task_id: Any
    command_id: int | None
    decision: str
    result: Any = None


@dataclass(frozen=True)
class CancelTasks:
    """Close the open tasks of a step (a due date took the on-due path) and their timers."""

    step_id: str
    task_ids: tuple[Any, ...] = field(default_factory=tuple)
    branch_token_id: Any = None


@dataclass(frozen=True)
class CloseAll:
    """The instance ended: cancel every timer still scheduled and every task still open.

    Emitted by ``end`` and ``fail`` only for plans that can schedule timers
    or open tasks (``Plan.opens_timers_or_tasks``), so a plan of actions and
    signals pays no statement for it.
    """


@dataclass(frozen=True)
class CreateBranches:
    """Insert the branch tokens a fork created, as they stand at the end of the drive.

    One statement for all of them (a fan-out of hundreds of branches is one
    insert); ``metadata`` is the durable context at the fork, written once.
    """

    tokens: tuple[Any, ...]


@dataclass(frozen=True)
class UpdateBranches:
    """Move existing branch tokens (status, step, state); metadata is never rewritten."""

    tokens: tuple[Any, ...]


@dataclass(frozen=True)
class SupersedeBranches:
    """A decided join no longer needs these live branches: supersede them.

    Their scheduled timers and open tasks are cancelled and their parked
    signals settled with them (timers, then tasks, then the tokens).
    """

    tokens: tuple[Any, ...]


@dataclass(frozen=True)
class OpenJoin:
    """Start (or restart, for a fork entered again) the progress of a join."""

    join_key: str
    fork_key: str
    expected: int


@dataclass(frozen=True)
class Arrive:
    """Branches reached their join (or failed): append them to its arrivals."""

    join_key: str
    arrivals: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class WithdrawArrival:
    """A failed branch is retried: take its arrival back from the undecided join."""

    join_key: str
    token_id: Any


@dataclass(frozen=True)
class DecideJoin:
    """The join's policy decided: mark it, so no later arrival decides it again."""

    join_key: str


@dataclass(frozen=True)
class StartChild:
    """Start a child workflow in the segment's transaction (``call``).

    ``idempotency_key`` is derived from the parent, the command and the step,
    so a retried segment never starts two; ``parent`` (instance id, step,
    branch) is stored with the child, whose end records its outcome on the
    parent as a deduplicated command.
    """

    definition_id: str
    version: int | None
    payload: dict[str, Any]
    idempotency_key: str
    parent: dict[str, Any]


@dataclass(frozen=True)
class RecordSideEffect:
    """Hand an intent to the outside world to the recorder of ``kind``, in the segment.

    The recorder (``side_effects``: the service outbox by default) writes it
    in the segment's transaction, so the transition and its record commit or
    roll back together. ``dispatch_key`` is generated by the step and
    deduplicated per workflow and branch by the segment *before* the
    recorder runs (the reference's dispatch dedup), so a step entered again
    by a retried segment records nothing twice. ``required``: with no
    recorder of ``kind`` installed the transition fails (``False``: skipped).
    """

    kind: str
    step_id: str
    dispatch_key: str
    payload: dict[str, Any]
    required: bool = True
    branch_token_id: Any = None
    fork_step_id: str | None = None
    branch_id: str | None = None


@dataclass(frozen=True)
class EmitEvent:
    """A workflow event for external consumers and in-process listeners.

    Recorded by the ``event`` recorder when one is installed (optional, as in
    the reference) and sent as the Django signal ``workflow_event`` after the
    segment commits. ``event_type`` is one of ``side_effects.EVENT_TYPES``.
    """

    event_type: str
    step_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    branch_token_id: Any = None
    fork_step_id: str | None = None
    branch_id: str | None = None


Effect = (
    ScheduleTimer
    | CancelTimers
    | FireTimer
    | OpenTask
    | CompleteTask
    | CancelTasks
    | CloseAll
    | CreateBranches
    | UpdateBranches
    | SupersedeBranches
    | OpenJoin
    | Arrive
    | WithdrawArrival
    | DecideJoin
    | StartChild
    | RecordSideEffect
    | EmitEvent
)
