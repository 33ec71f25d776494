"""The loop: drive a plan from one event until the instance waits or ends.

``drive(plan, snapshot, event, facts)`` takes the instance as stored (its
status, step and state) and the event a command brings, and returns a
``Transition``: the new status, step and state, the decisions for the log
and the effects for the segment to persist -- or, when the step the
instance stands at refuses the event, how its command settles. What a kind
of step does lives in ``engine/steps/``; this loop never names a kind. The
engine never touches the database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..definitions import Plan, Step
from ..exceptions import NonRetryable, WorkflowDefinitionError, WorkflowValidationError
from ..ids import uuid7
from ..payloads import json_size
from .effects import (
    CreateBranches,
    OpenJoin,
    ScheduleTimer,
    SupersedeBranches,
    UpdateBranches,
    WithdrawArrival,
)
from .effects import OpenTask as OpenTaskEffect
from .events import (
    BranchRetry,
    Completion,
    Event,
    Refusal,
    Resume,
    Signal,
    Start,
    TimerFired,
    late_callback,
)
from .steps import KINDS, StepKind
from .tokens import LIVE, JoinView, Progress, Token, scoped_key
from .transition import (
    STEP_ATTRIBUTE,
    Decision,
    DriveResult,
    Halt,
    Run,
    RunFacts,
    Transition,
    mark_branch,
    mark_step,
    refused_input,
)

# A plan that never reaches a wait or an end inside one segment is a bug in
# the plan (a decision loop); it fails instead of spinning forever.
MAX_STEPS_PER_SEGMENT = 10_000

STEP_NOT_IN_PLAN = "STEP_NOT_IN_PLAN"


@dataclass(frozen=True)
class Snapshot:
    """The instance as the segment read it, under the execution lock.

    ``current_step`` is where the instance's own token stands (the step it
    waits at, or the step it failed at); ``state`` the stored state JSON.
    ``branches`` are the branch tokens of its forks and ``joins`` their
    joins' progress by join key (read only for plans that fork).
    ``more_branches``, when set, reads every token of the instance:
    ``branches`` then holds only those the event addresses (and the
    branches enclosing them), and the drive reads the rest only when it
    needs them -- a join that decides, a fork's siblings -- so a signal to
    one branch of a wide fan-out reads a few tokens, not all of them.
    """

    status: str
    current_step: str | None
    state: dict[str, Any] | None
    branches: tuple[Token, ...] = ()
    joins: Mapping[str, JoinView] = field(default_factory=dict)
    more_branches: Callable[[], Sequence[Token]] | None = None
    # reads the history's compensation marks (engine/compensation.py), set for
    # plans that declare compensations; read only when a step needs them
    compensation_marks: Callable[[], Sequence[Any]] | None = None


def state_of(plan: Plan, state_json: Any, code: str, step_id: str) -> Any:
    """``plan.state_from_json``, failing non-retryably (``code``, at ``step_id``) on a misfit."""
    try:
        return plan.state_from_json(state_json)
    except WorkflowValidationError as exc:
        raise refused_input(code, exc, step_id) from exc


def current_step_of(plan: Plan, step_id: str) -> Step:
    """The step an instance stands at (the wait it waits at, or the step it failed at).

    An instance keeps its step id across a code change of its version (the
    pin resolves by scope, id and version, not by hash). When the code of
    that version no longer has the step, the instance cannot continue: the
    command fails non-retryably with ``STEP_NOT_IN_PLAN`` (marked with the
    step) instead of being deferred or parked forever. Restoring the step in
    the code of that version (keep the old class as that version, put the
    changed graph in a new version) and retrying the failed instance repairs
    it; see docs/changing-workflows.md.
    """
    step = plan.steps.get(step_id)
    if step is None:
        exc = NonRetryable(
            STEP_NOT_IN_PLAN,
            f"workflow {plan.id!r} version {plan.version} has no step {str(step_id)[:64]!r} "
            "any more; restore it in that version's code and retry the instance",
        )
        mark_step(exc, step_id)
        raise exc
    return step


def check_state_size(result: DriveResult, limit: int | None) -> None:
    """Refuse to leave a state larger than ``limit`` bytes of JSON (``STATE_TOO_LARGE``).

    Measured once per drive, on the state the segment would store; only when
    it is too large are the steps measured, to name the first one whose state
    went over the limit (a retry would grow it the same way).
    """
    if limit is None or not result.applied or result.state is None:
        return
    size = json_size(result.state)
    if size <= limit:
        return
    step = next(
        (d.step_id for d in result.decisions if json_size(d.after) > limit),
        result.current_step or "",
    )
    exc = NonRetryable(
        "STATE_TOO_LARGE",
        f"the state would be {size} bytes of JSON, over MAX_PAYLOAD_BYTES ({limit})",
    )
    if step:
        mark_step(exc, step)
    raise exc


def drive(plan: Plan, snapshot: Snapshot, event: Event, facts: RunFacts) -> Transition:
    """The transition ``event`` makes from ``snapshot`` (the segment's one engine call)."""
    tokens = Drive(plan, facts, snapshot)
    if isinstance(event, Start):
        state = state_of(plan, event.payload or {}, "PAYLOAD_INVALID", plan.start)
        tokens.go(tokens.main_run(state), plan.start)
    elif isinstance(event, Resume):
        step = current_step_of(plan, event.step_id)  # a lost step fails as STEP_NOT_IN_PLAN
        state = state_of(plan, snapshot.state, "STATE_INVALID", event.step_id)
        # an instance failed at a join (JOIN_FAILED) runs its branches again, from the fork
        again = plan.fork_of_join.get(step.id, step.id) if step.kind == "join" else step.id
        tokens.go(tokens.main_run(state), again)
    else:
        refusal = tokens.deliver(event)
        if refusal is not None:
            return DriveResult(
                applied=False,
                status=snapshot.status,
                current_step=snapshot.current_step,
                state=snapshot.state,
                refusal=refusal,
            )
    tokens.execute()
    result = tokens.result()
    check_state_size(result, facts.max_state_bytes)
    if facts.emit_events:
        from .emitted import emitted

        result.effects.extend(emitted(event, result, snapshot))
    return result


def _kind(plan: Plan, step: Step) -> StepKind:
    kind = KINDS.get(step.kind)
    if kind is None:
        raise WorkflowDefinitionError(
            f"step kind {step.kind!r} is not supported by this release",
            definition_id=plan.id,
            step_id=step.id,
        )
    return kind


# How a branch token's run halts, as the token's stored status.
_BRANCH_STATUS = {"WAITING": "WAITING", "ARRIVED": "COMPLETED", "BRANCH_FAILED": "FAILED"}


class Drive:
    """One transition in progress: the instance's token and its branch tokens.

    Runs are driven one after another from ``pending`` (a fork adds one per
    branch; a decided join adds the token that forked), each until it halts:
    waits, ends, arrives at its join or fails there. ``result`` turns the
    halts into the transition: the instance's status, step and state, and
    the branch tokens to create, move or supersede.
    """

    def __init__(self, plan: Plan, facts: RunFacts, snapshot: Snapshot) -> None:
        self.plan, self.facts, self.snapshot = plan, facts, snapshot
        self.decisions: list[Decision] = []
        self.effects: list[Any] = []
        self.tokens: dict[str, Token] = {str(t.id): t for t in snapshot.branches}
        self._unread: Callable[[], Sequence[Token]] | None = snapshot.more_branches
        self._marks: Sequence[Any] | None = None
        self.runs: dict[str | None, Run] = {}
        self.halts: dict[str | None, tuple[Step, Halt]] = {}
        self.pending: list[tuple[Run, str]] = []
        self.created: set[str] = set()
        self.superseded: set[str] = set()
        self.joins: dict[str, Progress] = {
            key: Progress(
                view.join_key, view.fork_key, view.expected, list(view.arrived), view.decided
            )
            for key, view in snapshot.joins.items()
        }

    # -- runs ---------------------------------------------------------------

    def _new_run(self, state: Any, token: Token | None) -> Run:
        run = Run(
            self.plan,
            self.facts,
            state,
            self.plan.state_to_json(state),
            self.decisions,
            self.effects,
            token=token,
            drive=self,
        )
        self.runs[run.key] = run
        return run

    def main_run(self, state: Any = None) -> Run:
        """The run of the instance's own token (built from the snapshot's state when needed)."""
        run = self.runs.get(None)
        if run is None:
            if state is None:
                step = self.snapshot.current_step or self.plan.start
                state = state_of(self.plan, self.snapshot.state, "STATE_INVALID", step)
            run = self._new_run(state, None)
        return run

    def token_run(self, token: Token) -> Run:
        """The run of a branch token (its state built from the stored branch state)."""
        run = self.runs.get(str(token.id))
        if run is None:
            state = state_of(self.plan, token.state, "STATE_INVALID", token.current_step or "")
            run = self._new_run(state, token)
        return run

    def parent_run(self, token: Token) -> Run:
        """The run of the token that forked ``token``'s branch."""
        if token.parent_id is None:
            return self.main_run()
        return self.token_run(self.token(token.parent_id))

    def all_tokens(self) -> dict[str, Token]:
        """Every token of the instance (read once, on first need; the drive's changes kept)."""
        unread, self._unread = self._unread, None
        if unread is not None:
            merged = {str(t.id): self.tokens.get(str(t.id), t) for t in unread()}
            for key, token in self.tokens.items():
                merged.setdefault(key, token)
            self.tokens.clear()
            self.tokens.update(merged)
        return self.tokens

    def compensation_marks(self) -> Sequence[Any]:
        """The history's compensation marks (read once, on first need; none without a reader)."""
        if self._marks is None:
            reader = self.snapshot.compensation_marks
            self._marks = () if reader is None else tuple(reader())
        return self._marks

    def token(self, key: str) -> Token:
        """The token ``key`` (reading every token when the snapshot did not hold it)."""
        found = self.tokens.get(key)
        return found if found is not None else self.all_tokens()[key]

    def go(self, run: Run, step_id: str) -> None:
        """Drive ``run`` from ``step_id`` (after the runs already pending)."""
        self.pending.append((run, step_id))

    def spawn(
        self,
        parent: Run,
        fork_key: str,
        join_key: str,
        branches: list[tuple[str, str, Any]],
        base: dict[str, Any] | None = None,
    ) -> None:
        """Create one branch token per (branch id, first step, item) and drive each.

        Each branch starts from ``base`` (the forking token's state JSON by
        default), a copy of its own.
        """
        base = parent.before if base is None else base
        self.effects.append(OpenJoin(join_key, fork_key, len(branches)))
        self.joins[join_key] = Progress(join_key, fork_key, len(branches))
        for branch_id, first_step, item in branches:
            token = Token(uuid7(), fork_key, branch_id, "RUNNING", first_step, base, item)
            key = str(token.id)
            self.tokens[key] = token
            self.created.add(key)
            state = self.plan.state_from_json(base)
            self.go(self._new_run(state, token), first_step)

    def siblings(self, fork_key: str) -> list[Token]:
        """Every branch token of the fork ``fork_key``, as it stands now in this drive."""
        return [t for t in self.all_tokens().values() if t.fork_key == fork_key]

    def supersede(self, tokens: list[Token]) -> None:
        """Supersede live branch tokens (and, through their keys, every nested branch)."""
        for token in tokens:
            key = str(token.id)
            if key in self.superseded or not self._live(token):
                continue
            self.superseded.add(key)
            nested = [t for t in self.all_tokens().values() if t.parent_id == key]
            self.supersede(nested)

    def _live(self, token: Token) -> bool:
        halt = self.halts.get(str(token.id))
        if halt is not None:
            return _BRANCH_STATUS.get(halt[1].status) == "WAITING"
        return token.live

    def progress(self, join_key: str) -> Progress:
        return self.joins[join_key]

    def execute(self) -> None:
        """Drive every pending run until each halts (a superseded branch stops where it is)."""
        while self.pending:
            run, step_id = self.pending.pop(0)
            if run.key is not None and run.key in self.superseded:
                continue
            self._run(run, step_id)

    def branch_path(self, token: Token) -> str:
        """``fork/branch`` of ``token`` from the outermost fork: stable across reruns.

        Token ids are new in every run of a segment, so a branch that failed
        terminally in a rolled-back run is found again by its path.
        """
        parts = [f"{token.fork_step}/{token.branch_id}"]
        parent = token.parent_id
        while parent is not None:
            outer = self.token(parent)
            parts.append(f"{outer.fork_step}/{outer.branch_id}")
            parent = outer.parent_id
        return " > ".join(reversed(parts))

    def _failed_earlier(self, run: Run, step: Step) -> Halt | None:
        """Fail ``run``'s branch at ``step`` when the step failed terminally before."""
        if run.token is None or not self.facts.failed_branches:
            return None
        error = self.facts.failed_at(self.branch_path(run.token), step.id)
        if error is None:
            return None
        from .steps.fail import fail_branch

        code = error.split(":", 1)[0]
        return fail_branch(run, step, "STEP_FAILED", {"reason": code}, error)

    def _enter(self, run: Run, step: Step) -> str | Halt:
        moved = self._failed_earlier(run, step)
        if moved is not None:
            return moved
        try:
            return _kind(self.plan, step).enter(run, step)
        except Exception as exc:  # code the engine ran for a branch: say which
            if run.token is not None:
                mark_branch(exc, self.branch_path(run.token))
            raise

    def _run(self, run: Run, step_id: str) -> None:
        plan = self.plan
        for _ in range(MAX_STEPS_PER_SEGMENT):
            step = plan.step(step_id)
            moved = self._enter(run, step)
            if isinstance(moved, Halt):
                self.halts[run.key] = (step, moved)
                return
            step_id = moved
        exc = NonRetryable(
            "STEP_LIMIT_EXCEEDED", f"ran {MAX_STEPS_PER_SEGMENT} steps without waiting or ending"
        )
        mark_step(exc, step_id)
        raise exc

    # -- events ---------------------------------------------------------------

    def addressed(self, event: Signal | TimerFired | Completion) -> Token | Refusal | None:
        """The branch token an event is for: None for the instance's own token.

        A signal for a branch that does not exist yet is parked (its fork may
        create it); an event for a branch that was superseded or has ended is
        a late callback.
        """
        if isinstance(event, Signal):
            if event.branch is None:
                return None
            fork, branch_id = event.branch
            found = [
                t
                for t in self.tokens.values()
                if t.branch_id == branch_id and fork in (t.fork_key, t.fork_step)
            ]
            live = [t for t in found if t.live]
            if live:
                return live[0]
            return late_callback(event.kind) if found else event.refused(None)
        token_id = event.branch_token_id
        if token_id is None:
            return None
        token = self.tokens.get(str(token_id))
        if token is None or not token.live:
            return late_callback(event.kind)
        return token

    def retry_branch(self, event: BranchRetry) -> Refusal | None:
        """Re-drive a branch from its current step once; STALE when it no longer runs.

        A live branch (one migration 0003 converted from RETRY_SCHEDULED) runs
        its current step again; a branch that *failed* (``wf.retry(...,
        branch=...)``) does too, its arrival taken back from the join, as
        long as the join has not decided. A superseded or completed branch,
        or a decided join, settles the command STALE.
        """
        found = [
            t
            for t in self.tokens.values()
            if t.branch_id == event.branch_id and event.fork_step_id in (t.fork_key, t.fork_step)
        ]
        live = [t for t in found if t.live]
        token = live[0] if live else (found[-1] if found else None)
        if token is None or token.current_step is None or token.status not in {*LIVE, "FAILED"}:
            return event.refused(None)
        fork = self.plan.steps.get(token.fork_step)
        join_key = (
            None
            if fork is None or fork.fork is None
            else scoped_key(fork.fork.join, token.parent_id)
        )
        progress = self.joins.get(join_key) if join_key is not None else None
        if progress is not None and progress.decided:
            return event.refused(None)
        if token.status == "FAILED" and (progress is None or join_key is None):
            return event.refused(None)
        current_step_of(self.plan, token.current_step)
        if token.status == "FAILED":
            assert progress is not None and join_key is not None
            progress.arrived = [a for a in progress.arrived if a["tokenId"] != str(token.id)]
            self.effects.append(WithdrawArrival(join_key, token.id))
            token = dataclasses.replace(token, status="RUNNING")
            self.tokens[str(token.id)] = token
        self.go(self.token_run(token), token.current_step)
        return None

    def deliver(self, event: Signal | TimerFired | Completion) -> Refusal | None:
        """Offer ``event`` to the step its token waits at; a refusal changes nothing."""
        if isinstance(event, BranchRetry):
            return self.retry_branch(event)
        token = self.addressed(event)
        if isinstance(token, Refusal):
            return token
        step_id = self.snapshot.current_step if token is None else token.current_step
        step = current_step_of(self.plan, step_id) if step_id else None
        kind = _kind(self.plan, step) if step is not None else None
        if step is None or kind is None or kind.refusal is None:
            return event.refused(step_id)
        refusal = kind.refusal(step, event)
        if refusal is not None:
            return refusal
        assert kind.accept is not None
        run = self.main_run() if token is None else self.token_run(token)
        failed = self._failed_earlier(run, step)
        if failed is not None:
            self.halts[run.key] = (step, failed)
            return None
        try:
            moved = kind.accept(run, step, event)  # a kind may still refuse, having seen the state
        except Exception as exc:
            if token is not None:
                mark_branch(exc, self.branch_path(token))
            raise
        if isinstance(moved, Refusal):
            return moved
        if isinstance(moved, Halt):
            self.halts[run.key] = (step, moved)
        else:
            self.go(run, moved)
        return None

    # -- the transition -------------------------------------------------------

    def result(self) -> DriveResult:
        snapshot = self.snapshot
        main = self.halts.get(None)
        if main is None:
            result = DriveResult(
                True,
                snapshot.status,
                snapshot.current_step,
                snapshot.state,
                self.decisions,
                effects=self.effects,
            )
        else:
            step, halt = main
            result = DriveResult(
                True,
                halt.status,
                step.id,
                self.runs[None].before,
                self.decisions,
                error_type=halt.error_type,
                error_message=halt.error_message,
                waiting=halt.waiting,
                effects=self.effects,
            )
        if self.tokens:
            self._branch_effects(result)
        return result

    def _branch_effects(self, result: DriveResult) -> None:
        created: list[Token] = []
        moved: list[Token] = []
        superseded: list[Token] = []
        for key, (step, halt) in self.halts.items():
            if key is None:
                continue
            token = self.tokens[key]
            status = _BRANCH_STATUS.get(halt.status, "COMPLETED")
            if key in self.superseded:
                status = "SUPERSEDED"
            now = Token(
                token.id,
                token.fork_key,
                token.branch_id,
                status,
                step.id,
                self.runs[key].before,
                token.item,
            )
            (created if key in self.created else moved).append(now)
            if status == "WAITING":
                result.branch_waits.append((token.fork_key, token.branch_id, halt.waiting))
        for key in self.superseded:
            if key not in self.halts:
                token = self.tokens[key]
                if key in self.created:  # created and superseded before it ran
                    created.append(
                        Token(
                            token.id,
                            token.fork_key,
                            token.branch_id,
                            "SUPERSEDED",
                            token.current_step,
                            token.state,
                            token.item,
                        )
                    )
                else:
                    superseded.append(token)
            elif key not in self.created:
                superseded.append(self.tokens[key])
        doomed = {str(t.id) for t in created if t.status == "SUPERSEDED"}
        if doomed:  # what a branch superseded in this same drive asked for is not written
            result.effects[:] = [
                e
                for e in result.effects
                if not (
                    isinstance(e, ScheduleTimer | OpenTaskEffect)
                    and str(e.branch_token_id) in doomed
                )
            ]
        moved = [t for t in moved if str(t.id) not in {str(s.id) for s in superseded}]
        if created:
            result.effects.append(CreateBranches(tuple(created)))
        if superseded:
            result.effects.append(SupersedeBranches(tuple(superseded)))
        if moved:
            result.effects.append(UpdateBranches(tuple(moved)))


__all__ = [
    "STEP_ATTRIBUTE",
    "STEP_NOT_IN_PLAN",
    "Completion",
    "Decision",
    "Drive",
    "DriveResult",
    "Resume",
    "RunFacts",
    "Signal",
    "Snapshot",
    "Start",
    "TimerFired",
    "Transition",
    "check_state_size",
    "current_step_of",
    "drive",
    "state_of",
]
