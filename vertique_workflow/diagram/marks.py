"""Where an instance stands on its diagram: current and visited steps, branch tokens.

Read through the public operations (``get``, ``branches``), the pin's plan
(``pins.resident_plan``) and one aggregate of the history
(``store.history.step_marks``: a few rows per step and token, so a
100,000-entry history costs what a short one does).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..definitions.plan import Plan
from ..store import history

__all__ = ["BranchMark", "Marks", "instance_marks", "marks_from_history"]


@dataclass(frozen=True)
class BranchMark:
    """A branch token standing at a step: drawn as a badge ``<branch id> · <status>``."""

    step_id: str
    branch_id: str
    status: str


@dataclass(frozen=True)
class Marks:
    """What to highlight: the steps tokens stand at, the steps taken, the branch badges."""

    current: frozenset[str] = frozenset()
    visited: frozenset[str] = frozenset()
    branches: tuple[BranchMark, ...] = ()


# the history entries that name the step a token took (column step_id, or payload "step")
_STEP_ENTRIES = frozenset(
    {
        "DECISION",
        "BRANCH_DECISION",
        "STATE_BASELINE",
        "TIMER_FIRED",
        "CHILD_ENDED",
        "SERVICE_RESULT",
        "WORKFLOW_COMPLETED",
        "FAILED",
    }
)


def _entry_step(entry: dict[str, Any]) -> str | None:
    if entry.get("event_type") not in _STEP_ENTRIES:
        return None
    step = entry.get("step_id")
    if step is None:
        payload = entry.get("payload_json")
        step = payload.get("step") if isinstance(payload, dict) else None
    return step if isinstance(step, str) else None


def marks_from_history(plan: Plan, entries: Iterable[dict[str, Any]], upto_sequence: int) -> Marks:
    """The marks of the moment right after history entry ``upto_sequence``.

    Visited: every step an entry up to that sequence names. Current: the
    step of the last such entry of the instance's own token (a DECISION is
    logged when a step runs or a token enters a wait, timer, task, fork,
    join or call, so that is where it stood). Each branch token seen so far
    gets a badge at the step of its last BRANCH_DECISION, with that entry's
    outcome (``WAITING``, ``ARRIVED``, ``BRANCH_FAILED``, ...) as its status:
    a token's status of the past is not stored, the outcome says the same.
    """
    visited: set[str] = set()
    current: str | None = None
    tokens: dict[str, BranchMark] = {}
    for entry in entries:
        sequence = entry.get("sequence")
        if not isinstance(sequence, int) or sequence > upto_sequence:
            continue
        step = _entry_step(entry)
        if step is None or step not in plan.steps:
            continue
        visited.add(step)
        payload = entry.get("payload_json") if isinstance(entry.get("payload_json"), dict) else {}
        if entry["event_type"] == "BRANCH_DECISION":
            token = str(payload.get("tokenId") or payload.get("branchId") or "")
            branch = str(payload.get("branchId") or "?")
            status = str(entry.get("outcome") or payload.get("outcome") or "")
            tokens[token] = BranchMark(step, branch, status)
        else:
            current = step
    return Marks(
        current=frozenset() if current is None else frozenset({current}),
        visited=frozenset(visited),
        branches=tuple(tokens.values()),
    )


def instance_marks(instance_id: Any, *, upto_sequence: int | None = None) -> tuple[Plan, Marks]:
    """The pinned plan of an instance and where it stands (or stood after ``upto_sequence``).

    Now: visited is every step a history entry names; current is the
    instance's current step plus the steps its live branch tokens stand at
    (RUNNING, WAITING, RETRY_SCHEDULED); every token (live or ended) gets a
    badge at its step. With ``upto_sequence`` only entries up to that
    sequence count (see :func:`marks_from_history`). Steps the plan does
    not have (the pin's plan lost them) are left out. Raises
    ``WorkflowNotFound`` for an unknown instance, and when this node has no
    plan for the instance's pin (a document that cannot be rebuilt here, or
    code not deployed on this node).
    """
    from .. import operations
    from ..exceptions import WorkflowNotFound
    from ..pins import resident_plan
    from ..store.branches import LIVE_STATUSES
    from ..store.instances import get as instance_row

    view = operations.get(instance_id)
    row = instance_row(view.id)
    scope = row.definition_scope_key if row is not None else view.scope
    plan = resident_plan(view.definition_id, view.definition_version, scope=scope)
    if plan is None:
        raise WorkflowNotFound(
            f"this node has no plan for workflow {view.definition_id!r} version "
            f"{view.definition_version} (scope {scope!r})"
        )
    found = history.step_marks(view.id, sorted(_STEP_ENTRIES), upto_sequence)
    if upto_sequence is not None:
        return plan, _marks_then(plan, found)
    visited = frozenset(m.step_id for m in found if m.step_id in plan.steps)
    current = set()
    if view.current_step in plan.steps:
        current.add(view.current_step)
    badges = []
    for branch in operations.branches(view.id):
        if branch.current_step not in plan.steps:
            continue
        badges.append(BranchMark(branch.current_step, branch.branch_id, branch.status))
        if branch.status in LIVE_STATUSES:
            current.add(branch.current_step)
    return plan, Marks(frozenset(current), visited, tuple(badges))


def _marks_then(plan: Plan, found: Iterable[history.StepMark]) -> Marks:
    """:func:`marks_from_history`'s rule over the store's per-step aggregates.

    The same answer from a few rows instead of every entry: visited is every
    step named; current the step of the own token's latest entry; each
    token's badge the step (and outcome) of its latest entry, badges in the
    order tokens first appear.
    """
    known = [m for m in found if m.step_id in plan.steps]
    own = [m for m in known if not m.branch]
    current = max(own, key=lambda m: m.last_sequence).step_id if own else None
    latest: dict[str, history.StepMark] = {}
    first: dict[str, int] = {}
    for mark in (m for m in known if m.branch):
        token = mark.token or ""
        first[token] = min(first.get(token, mark.first_sequence), mark.first_sequence)
        if token not in latest or mark.last_sequence > latest[token].last_sequence:
            latest[token] = mark
    badges = tuple(
        BranchMark(latest[t].step_id, latest[t].branch_id or "?", latest[t].last_outcome)
        for t in sorted(latest, key=lambda t: first[t])
    )
    return Marks(
        current=frozenset() if current is None else frozenset({current}),
        visited=frozenset(m.step_id for m in known),
        branches=badges,
    )
