"""Persisting a transition's effects, in the reference's lock order.

The engine hands the segment its effects as data (``engine/effects.py``);
this module writes them through ``store/`` before the instance is updated:
every timer statement first (fire, cancel, then one statement recording all
new timers with their TIMER commands), then every task statement, then the
branch tokens and join states -- the order execution lock -> timers ->
tasks -> branch tokens -> instances -> queues that every writer keeps, so a
segment and a recording or a cancel can never deadlock. A guarded write
that finds its row changed raises a transient conflict: the segment rolls
back and its command is retried.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..engine.decision_log import HistoryEntry
from ..engine.effects import (
    Arrive,
    CancelTasks,
    CancelTimers,
    CloseAll,
    CompleteTask,
    CreateBranches,
    DecideJoin,
    Effect,
    EmitEvent,
    FireTimer,
    OpenJoin,
    OpenTask,
    RecordSideEffect,
    ScheduleTimer,
    StartChild,
    SupersedeBranches,
    UpdateBranches,
    WithdrawArrival,
)
from ..ids import uuid7
from ..store import branches, commands, joins, tasks, timers
from ..store.timers import TimerSpec

TASK_TIMERS = ("TASK_DUE", "TASK_REMINDER")


def persist(
    workflow_id: Any,
    command_id: int,
    effects: Sequence[Effect],
    metadata: dict[str, Any] | None,
    instance: Any = None,
) -> list[HistoryEntry]:
    """Write ``effects`` of one transition of ``workflow_id`` (the segment holds the lock).

    ``command_id`` is the segment's own command, never cancelled with a
    timer (it settles with the transition). ``metadata`` is the durable
    context of the drive, stored on every timer it records (the TIMER
    segment binds it again when the timer fires) and on every branch token
    a fork creates. ``instance`` (the locked row) names the definition for
    the side-effect recorders, which run after the branch tokens (their
    tables are outside the reference's lock chain: nothing else locks them
    in a segment). Returns the history entries the effects add: the parked
    signals of superseded branches that were settled, the children started.
    """
    if not effects:
        return []
    due_at = _timers(workflow_id, command_id, effects, metadata)
    _tasks(workflow_id, effects, due_at)
    settled = _branches(workflow_id, effects, metadata)
    entries = [
        HistoryEntry(
            "BRANCH_LATE_CALLBACK_IGNORED",
            {
                "commandId": c["id"],
                "seq": c["seq"],
                "kind": c["kind"],
                "reason": "BRANCH_SUPERSEDED",
            },
            extra={"command_id": c["id"]},
        )
        for c in settled
    ]
    entries.extend(_children(effects))
    _side_effects(workflow_id, command_id, effects, metadata, instance)
    return entries


def _side_effects(
    workflow_id: Any,
    command_id: int,
    effects: Sequence[Effect],
    metadata: dict[str, Any] | None,
    instance: Any,
) -> None:
    wanted = [e for e in effects if isinstance(e, RecordSideEffect | EmitEvent)]
    if not wanted:
        return
    from .. import side_effects

    side_effects.record(
        workflow_id,
        command_id,
        getattr(instance, "definition_id", ""),
        getattr(instance, "definition_version", 0),
        wanted,
        metadata,
    )


def _children(effects: Sequence[Effect]) -> list[HistoryEntry]:
    """Start the children ``call`` steps asked for (other instances: no lock of ours).

    Each start is logged on the parent as ``CHILD_STARTED`` with the child's
    id: that entry (on the parent's history index) is how ``wf.children``
    and a parent's cancel find the children, without scanning instances.
    """
    starts = [e for e in effects if isinstance(e, StartChild)]
    if not starts:
        return []
    from ..operations import start

    entries: list[HistoryEntry] = []
    for effect in starts:
        ref = start(
            effect.definition_id,
            effect.payload,
            idempotency_key=effect.idempotency_key,
            version=effect.version,
            _parent=effect.parent,
        )
        entries.append(
            HistoryEntry(
                "CHILD_STARTED",
                {
                    "childId": str(ref.id),
                    "workflow": effect.definition_id,
                    "step": effect.parent.get("stepId"),
                },
            )
        )
    return entries


def _timers(
    workflow_id: Any, command_id: int, effects: Sequence[Effect], metadata: dict[str, Any] | None
) -> dict[Any, Any]:
    """The timer statements; returns the due date of each task opened (its DUE timer's)."""
    specs: list[TimerSpec] = []
    for effect in effects:
        if isinstance(effect, FireTimer):
            timers.mark_fired(effect.timer_id)
        elif isinstance(effect, CancelTimers | CancelTasks | CompleteTask | CloseAll):
            timers.cancel_scheduled(
                workflow_id, keep_command_id=command_id, **_timer_filter(effect)
            )
        elif isinstance(effect, SupersedeBranches):
            timers.cancel_scheduled(
                workflow_id,
                keep_command_id=command_id,
                branch_token_ids=[t.id for t in effect.tokens],
            )
        elif isinstance(effect, ScheduleTimer):
            specs.append(
                TimerSpec(
                    uuid7(),
                    effect.step_id,
                    effect.purpose,
                    effect.delay_seconds,
                    effect.fire_at,
                    target=effect.target,
                    metadata=metadata,
                    **_branch_of(effect),
                )
            )
        elif isinstance(effect, OpenTask):
            specs.extend(_task_timers(effect, metadata))
    due_at: dict[Any, Any] = {}
    if specs:
        recorded = timers.record(workflow_id, specs)
        for spec, (_, fire_at) in zip(specs, recorded, strict=True):
            if spec.purpose == "TASK_DUE":
                due_at[spec.task_id] = fire_at
    return due_at


def _timer_filter(effect: Effect) -> dict[str, Any]:
    """Which scheduled timers leaving a step (or ending) cancels."""
    if isinstance(effect, CompleteTask):
        return {"task_id": effect.task_id, "purposes": list(TASK_TIMERS)}
    if isinstance(effect, CloseAll):
        return {}
    assert isinstance(effect, CancelTimers | CancelTasks)
    purposes = list(effect.purposes) if isinstance(effect, CancelTimers) else list(TASK_TIMERS)
    found: dict[str, Any] = {"step_id": effect.step_id, "purposes": purposes or None}
    if effect.branch_token_id is not None:
        found["branch_token_ids"] = [effect.branch_token_id]
    return found


def _tasks(workflow_id: Any, effects: Sequence[Effect], due_at: dict[Any, Any]) -> None:
    for effect in effects:
        if isinstance(effect, CompleteTask):
            if not tasks.mark_completed(
                effect.task_id, effect.command_id, effect.decision, effect.result
            ):
                raise timers.TimerConflict("the task changed under the execution lock")
        elif isinstance(effect, CancelTasks):
            if effect.branch_token_id is None:
                tasks.cancel_open(workflow_id)
            else:
                tasks.cancel_open(workflow_id, branch_token_ids=[effect.branch_token_id])
        elif isinstance(effect, CloseAll):
            tasks.cancel_open(workflow_id)
        elif isinstance(effect, SupersedeBranches):
            tasks.cancel_open(workflow_id, branch_token_ids=[t.id for t in effect.tokens])
    for effect in effects:
        if isinstance(effect, OpenTask):
            tasks.insert_open(
                effect.task_id,
                workflow_id,
                step_id=effect.step_id,
                name=effect.title,
                assignee=effect.assignee,
                candidate_users=list(effect.candidate_users),
                candidate_groups=list(effect.candidate_groups),
                decisions_snapshot=effect.decisions,
                due_at=due_at.get(effect.task_id),
                require_version_stability=effect.require_version_stability,
                **_branch_of(effect),
            )


def _branches(
    workflow_id: Any, effects: Sequence[Effect], metadata: dict[str, Any] | None
) -> list[dict[str, Any]]:
    branch_effects = (
        CreateBranches,
        UpdateBranches,
        SupersedeBranches,
        OpenJoin,
        Arrive,
        WithdrawArrival,
        DecideJoin,
    )
    if not any(isinstance(effect, branch_effects) for effect in effects):
        return []
    settled: list[dict[str, Any]] = []
    for effect in effects:
        if isinstance(effect, CreateBranches):
            branches.create(
                workflow_id,
                [
                    branches.NewBranch(
                        t.id,
                        t.fork_key,
                        t.branch_id,
                        t.status,
                        t.current_step,
                        t.state,
                        t.item,
                        metadata or {},
                    )
                    for t in effect.tokens
                ],
            )
        elif isinstance(effect, UpdateBranches):
            retried = {str(e.token_id) for e in effects if isinstance(e, WithdrawArrival)}
            branches.update(
                workflow_id,
                [
                    branches.BranchChange(
                        t.id, t.status, t.current_step, t.state, retried=str(t.id) in retried
                    )
                    for t in effect.tokens
                ],
            )
        elif isinstance(effect, SupersedeBranches):
            branches.supersede(workflow_id, [t.id for t in effect.tokens])
            settled.extend(
                commands.settle_parked_for_branches(
                    workflow_id, [(t.fork_key, t.branch_id) for t in effect.tokens]
                )
            )
    # per join, in one statement each: open, every arrival of the drive, decide
    arrivals: dict[str, list[dict[str, Any]]] = {}
    for effect in effects:
        if isinstance(effect, WithdrawArrival):  # before the arrivals: it may arrive anew
            joins.withdraw(workflow_id, effect.join_key, effect.token_id)
    for effect in effects:
        if isinstance(effect, OpenJoin):
            joins.open(workflow_id, effect.join_key, effect.fork_key, effect.expected)
        elif isinstance(effect, Arrive):
            arrivals.setdefault(effect.join_key, []).extend(effect.arrivals)
    for join_key, arrived in arrivals.items():
        joins.arrive(workflow_id, join_key, arrived)
    for effect in effects:
        if isinstance(effect, DecideJoin):
            joins.decide(workflow_id, effect.join_key)
    return settled


def _task_timers(effect: OpenTask, metadata: dict[str, Any] | None) -> list[TimerSpec]:
    """The task's REMINDER timers, then its DUE timer: queue order is fire-time order.

    Timers that come due together (time skipping, an executor that was
    down) run in queue order, so the reminders (each before the due date)
    are recorded first, earliest first.
    """
    task_id = effect.task_id
    found = [
        _spec(task_id, effect, "TASK_REMINDER", seconds, metadata)
        for seconds in sorted(effect.reminder_seconds)
    ]
    if effect.due_seconds is not None:
        found.append(_spec(task_id, effect, "TASK_DUE", effect.due_seconds, metadata))
    return found


def _spec(
    task_id: uuid.UUID, effect: OpenTask, purpose: str, seconds: float, metadata: Any
) -> TimerSpec:
    return TimerSpec(
        uuid7(),
        effect.step_id,
        purpose,
        seconds,
        None,
        task_id=task_id,
        metadata=metadata,
        **_branch_of(effect),
    )


def _branch_of(effect: ScheduleTimer | OpenTask) -> dict[str, Any]:
    if effect.branch_token_id is None:
        return {}
    return {
        "branch_token_id": effect.branch_token_id,
        "fork_step_id": effect.fork_step_id,
        "branch_id": effect.branch_id,
    }


__all__ = ["persist"]
