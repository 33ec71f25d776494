"""The data a drive works with and returns: facts in, decisions and effects out.

``Run`` is one drive in progress (the state, the decisions logged so far,
the effects asked for); step kinds read and extend it. ``DriveResult`` (also
named ``Transition``) is what the segment persists: the new status, step and
state, the decisions for the log, the effects, or -- when the current step
refused the event -- how the command settles instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..definitions import Plan, StepContext
from ..exceptions import NonRetryable
from .effects import (
    CancelTasks,
    CancelTimers,
    Effect,
    EmitEvent,
    OpenTask,
    RecordSideEffect,
    ScheduleTimer,
)

__all__ = [
    "BRANCH_ATTRIBUTE",
    "STEP_ATTRIBUTE",
    "Decision",
    "DriveResult",
    "Halt",
    "Run",
    "RunFacts",
    "Transition",
    "failed_branch_of",
    "mark_branch",
    "mark_step",
    "refused_input",
]

STEP_ATTRIBUTE = "_vertique_step"
# the path of the branch whose step raised ("" for the instance's own token):
# a terminal failure there fails only that branch (see RunFacts.failed_branches)
BRANCH_ATTRIBUTE = "_vertique_branch"


def mark_step(exc: BaseException, step_id: str) -> None:
    """Remember which step raised, so the executor can say where (never what)."""
    if not hasattr(exc, STEP_ATTRIBUTE):
        setattr(exc, STEP_ATTRIBUTE, step_id)


def mark_branch(exc: BaseException, path: str) -> None:
    """Remember which branch's step raised (the first mark wins, as for the step)."""
    if not hasattr(exc, BRANCH_ATTRIBUTE):
        setattr(exc, BRANCH_ATTRIBUTE, path)


def failed_branch_of(exc: BaseException) -> tuple[str, str] | None:
    """(branch path, step id) when a branch's step raised ``exc``; None for the instance."""
    path = getattr(exc, BRANCH_ATTRIBUTE, "")
    step = getattr(exc, STEP_ATTRIBUTE, None)
    if not path or not step:
        return None
    return path, step


@dataclass(frozen=True)
class RunFacts:
    """What the engine may know about the instance and the command."""

    instance_id: Any
    definition_id: str
    definition_version: int
    business_key: str | None
    scope: str
    command_id: int | None
    command_kind: str
    actor: Any = None
    # MAX_PAYLOAD_BYTES, handed in by the segment (the engine reads no settings):
    # the largest state a drive may leave to be stored; None checks no size.
    max_state_bytes: int | None = None
    # branch steps that failed terminally in an earlier run of this command's
    # segment (rolled back): (branch path, step id, the stored error text).
    # The drive fails that branch there instead of running the step again, so
    # its join's policy decides (see Drive.branch_path).
    failed_branches: tuple[tuple[str, str, str], ...] = ()
    # set by the segment when someone listens (an ``event`` recorder or a
    # ``workflow_event`` receiver): the drive then appends its EmitEvent
    # effects (engine/emitted.py); otherwise it derives none
    emit_events: bool = False

    def failed_at(self, path: str, step_id: str) -> str | None:
        """The error text when the branch ``path`` failed terminally at ``step_id``."""
        for failed_path, failed_step, error in self.failed_branches:
            if failed_path == path and failed_step == step_id:
                return error
        return None


@dataclass(frozen=True)
class Decision:
    """One step the drive took: the state before and after it, as JSON."""

    step_id: str
    outcome: str
    before: dict[str, Any]
    after: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)
    # set for a step a branch token took: {forkStepId, branchId, tokenId}; its
    # states are the branch's own, logged apart from the instance's state
    branch: dict[str, Any] | None = None


@dataclass(frozen=True)
class Halt:
    """The drive stops at a step: the instance waits there or has ended."""

    status: str
    waiting: tuple[str, ...] = ()
    error_type: str | None = None
    error_message: str | None = None


@dataclass
class DriveResult:
    """The outcome of one drive: a transition to persist, or a refusal.

    ``applied`` is False when the current step refused the event;
    ``refusal`` then says how the command settles (``PARK`` a signal,
    ``STALE`` a timer, ``REJECT`` a completion) and nothing else changes.
    ``waiting`` names the signals the step the instance now waits at accepts.
    """

    applied: bool
    status: str
    current_step: str | None
    state: dict[str, Any] | None
    decisions: list[Decision] = field(default_factory=list)
    error_type: str | None = None
    error_message: str | None = None
    waiting: tuple[str, ...] = ()
    effects: list[Effect] = field(default_factory=list)
    refusal: Any = None  # events.Refusal when not applied
    # branches that now wait: (fork key, branch id, the signal names they accept)
    branch_waits: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.status in ("COMPLETED", "COMPENSATED", "FAILED")


Transition = DriveResult


@dataclass
class Run:
    """One drive in progress, handed to the step kinds.

    ``before`` is the JSON of the state as last logged: taken once per step
    that runs code (a fresh copy, so code that mutates the state in place
    cannot alter the log).
    """

    plan: Plan
    facts: RunFacts
    state: Any
    before: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    # the branch token this run drives (None: the instance's own token) and
    # the drive it belongs to (forks and joins move other tokens through it)
    token: Any = None
    drive: Any = None

    @property
    def key(self) -> str | None:
        """The token's id as text; None for the instance's own token."""
        return None if self.token is None else str(self.token.id)

    def branch_detail(self) -> dict[str, Any] | None:
        token = self.token
        if token is None:
            return None
        return {"forkStepId": token.fork_key, "branchId": token.branch_id, "tokenId": str(token.id)}

    def context(self, step_id: str, **extra: Any) -> StepContext:
        facts = self.facts
        if self.token is not None:
            extra.setdefault("branch_id", self.token.branch_id)
            extra.setdefault("fork_step_id", self.token.fork_step)
            extra.setdefault("branch_item", self.token.item)
        return StepContext(
            instance_id=facts.instance_id,
            step_id=step_id,
            definition_id=facts.definition_id,
            definition_version=facts.definition_version,
            command_id=facts.command_id,
            command_kind=facts.command_kind,
            business_key=facts.business_key,
            scope=facts.scope,
            actor=facts.actor,
            **extra,
        )

    def call(self, step_id: str, callback: Any, *args: Any) -> Any:
        """Run workflow code of ``step_id``; an exception is marked with the step."""
        try:
            return callback(*args)
        except Exception as exc:
            mark_step(exc, step_id)
            mark_branch(exc, "" if self.token is None else self.drive.branch_path(self.token))
            raise

    def log(self, step_id: str, outcome: str, detail: dict[str, Any] | None = None) -> None:
        """Log a step that may have changed the state (the state's JSON is taken again)."""
        after = self.plan.state_to_json(self.state)
        self.decisions.append(
            Decision(step_id, outcome, self.before, after, detail or {}, self.branch_detail())
        )
        self.before = after

    def note(self, step_id: str, outcome: str, detail: dict[str, Any] | None = None) -> None:
        """Log a step that cannot have changed the state (a wait entered, a timer set)."""
        self.decisions.append(
            Decision(step_id, outcome, self.before, self.before, detail or {}, self.branch_detail())
        )

    def effect(self, effect: Effect) -> None:
        """Ask for an effect; a branch's timers and tasks carry the branch's identity."""
        token = self.token
        if token is not None and isinstance(
            effect, ScheduleTimer | OpenTask | RecordSideEffect | EmitEvent
        ):
            effect = dataclasses.replace(
                effect,
                branch_token_id=token.id,
                fork_step_id=token.fork_key,
                branch_id=token.branch_id,
            )
        elif token is not None and isinstance(effect, CancelTimers | CancelTasks):
            effect = dataclasses.replace(effect, branch_token_id=token.id)
        self.effects.append(effect)


def refused_input(code: str, exc: Exception, step_id: str) -> NonRetryable:
    """A validation error of the engine's own: the same input fails every attempt.

    ``PAYLOAD_INVALID``: the command's payload does not fit (the start payload
    the state type, a signal payload the default merge). ``STATE_INVALID``: the
    stored state no longer fits the state type. The message names fields,
    never values; it goes to the log only (``detail``).
    """
    refused = NonRetryable(code, str(exc))
    mark_step(refused, step_id)
    return refused
