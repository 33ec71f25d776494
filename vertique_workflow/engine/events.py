"""Events: what a command brings to the engine.

Each command kind becomes one event; the step a token stands at says
whether it accepts it (``engine/steps/``). An event a step does not accept
is *refused*, and the event says how its command settles then: a signal is
parked until a step accepts it, a timer settles STALE (the wait it was set
for was left), a task completion is REJECTED and its task reopened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .decision_log import HistoryEntry

__all__ = [
    "CHILD_ENDED",
    "SERVICE_RESULT",
    "BranchRetry",
    "ChildEnded",
    "Completion",
    "Event",
    "Refusal",
    "Resume",
    "ServiceResult",
    "Signal",
    "Start",
    "TimerFired",
    "late_callback",
]


@dataclass(frozen=True)
class Refusal:
    """How a refused event's command settles: ``PARK``, ``STALE`` or ``REJECT``, and why."""

    disposition: str
    reason_code: str
    sentence: str
    # the history entry of the refusal; None: the disposition's own
    # (SIGNAL_PARKED / COMMAND_PARKED, COMMAND_STALE, COMMAND_REJECTED)
    entry: str | None = None


def late_callback(kind: str) -> Refusal:
    """An event for a branch that was superseded (or has ended): ignored, never raised.

    The command settles STALE and the history records
    ``BRANCH_LATE_CALLBACK_IGNORED``, so a zombie callback cannot change
    the instance's state.
    """
    return Refusal(
        "STALE",
        "BRANCH_LATE_CALLBACK_IGNORED",
        f"the {kind} command's branch no longer runs",
        entry="BRANCH_LATE_CALLBACK_IGNORED",
    )


@dataclass(frozen=True)
class Start:
    """START: the start payload becomes the first state."""

    payload: Any
    kind: ClassVar[str] = "START"


@dataclass(frozen=True)
class Resume:
    """RETRY of a failed instance: drive on from ``step_id`` with the stored state."""

    step_id: str
    kind: ClassVar[str] = "RETRY"


@dataclass(frozen=True)
class Signal:
    """SIGNAL ``name`` with its payload (already checked against its schema when recorded)."""

    name: str
    payload: Any
    branch: tuple[str, str] | None = None  # (fork step id, branch id)
    kind: ClassVar[str] = "SIGNAL"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal("PARK", "SIGNAL_PARKED", "no step accepts the signal now")

    def entry(self) -> HistoryEntry:
        payload: dict[str, Any] = {"signal": self.name[:255]}
        if self.branch is not None:
            payload.update(forkStepId=self.branch[0], branchId=self.branch[1])
        return HistoryEntry("SIGNAL_APPLIED", payload)


@dataclass(frozen=True)
class TimerFired:
    """TIMER: a timer of ``timer_kind`` (FIRE, TIMEOUT, DUE, REMINDER) reached its time.

    ``scheduled`` is False when the timer row is no longer SCHEDULED (it was
    cancelled or has fired): such a timer applies nowhere.
    """

    timer_kind: str
    timer_id: Any
    step_id: str | None
    task_id: Any = None
    scheduled: bool = True
    branch_token_id: Any = None
    kind: ClassVar[str] = "TIMER"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal(
            "STALE",
            "TIMER_STALE",
            f"the {self.timer_kind} timer of step {str(self.step_id)[:64]!r} "
            "fired after the instance left that step",
        )

    def entry(self) -> HistoryEntry:
        return HistoryEntry(
            "TIMER_FIRED",
            {"timerId": str(self.timer_id), "timerKind": self.timer_kind, "step": self.step_id},
        )


@dataclass(frozen=True)
class Completion:
    """COMPLETION of the human task ``task_id`` with ``decision`` and its payload.

    ``reserved`` is True when the task is COMPLETING under this command's
    reservation; ``subject_version`` is the version the completing user
    reviewed (checked when the task requires version stability).
    """

    task_id: Any
    step_id: str | None
    decision: str
    payload: Any
    subject_version: Any = None
    reserved: bool = True
    branch_token_id: Any = None
    kind: ClassVar[str] = "COMPLETION"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal(
            "REJECT",
            "TASK_NOT_CURRENT",
            f"the task of step {str(self.step_id)[:64]!r} is not the step the instance waits at",
        )

    def entry(self) -> HistoryEntry:
        return HistoryEntry(
            "TASK_COMPLETED", {"taskId": str(self.task_id), "decision": self.decision[:255]}
        )


@dataclass(frozen=True)
class BranchRetry:
    """RETRY addressed to a branch (one migration 0003 converted): re-drive it once.

    The branch runs its current step again; a branch that was superseded,
    has ended, or whose join has decided settles the command STALE.
    """

    fork_step_id: str
    branch_id: str
    kind: ClassVar[str] = "RETRY"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal(
            "STALE",
            "BRANCH_RETRY_STALE",
            "the branch no longer runs, or its join has decided",
        )

    def entry(self) -> HistoryEntry:
        return HistoryEntry(
            "BRANCH_RETRIED", {"forkStepId": self.fork_step_id, "branchId": self.branch_id}
        )


# The reserved signal name of a child's outcome (``call``); never a declared signal.
CHILD_ENDED = "vertique.child_ended"


@dataclass(frozen=True)
class ChildEnded:
    """A child workflow a ``call`` step started has ended (a SIGNAL the child's end records).

    ``status`` is the child's ended status, ``state`` its final state JSON.
    A parent that no longer waits at that step settles it STALE.
    """

    child_id: Any
    step_id: str | None
    status: str
    state: Any = None
    error_type: str | None = None
    branch_token_id: Any = None
    kind: ClassVar[str] = "SIGNAL"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal(
            "STALE",
            "CHILD_STALE",
            f"the parent no longer waits at call step {str(self.step_id)[:64]!r}",
        )

    def entry(self) -> HistoryEntry:
        return HistoryEntry(
            "CHILD_ENDED",
            {"childId": str(self.child_id), "status": self.status, "step": self.step_id},
        )


# The reserved signal name of a service call's outcome (``service``); never declared.
SERVICE_RESULT = "vertique.service_result"

RESERVED_SIGNALS = frozenset({CHILD_ENDED, SERVICE_RESULT})


@dataclass(frozen=True)
class ServiceResult:
    """The outcome of a ``service`` step's call (a SIGNAL the relay records).

    ``status`` is ``COMPLETED`` or ``FAILED``; ``result`` the handler's JSON
    result; ``error`` the failure's reason code. Its dedup key is the
    dispatch key, so a result delivered twice is recorded once; a result
    for a step the instance no longer waits at settles STALE.
    """

    dispatch_key: str
    step_id: str | None
    status: str
    result: Any = None
    error: str | None = None
    attempts: int = 0
    branch_token_id: Any = None
    kind: ClassVar[str] = "SIGNAL"

    def refused(self, step_id: str | None) -> Refusal:
        return Refusal(
            "STALE",
            "SERVICE_RESULT_STALE",
            f"the instance no longer waits at service step {str(self.step_id)[:64]!r}",
        )

    def entry(self) -> HistoryEntry:
        payload: dict[str, Any] = {
            "dispatchKey": self.dispatch_key[:255],
            "status": self.status,
            "step": self.step_id,
            "attempts": self.attempts,
        }
        if self.error is not None:
            payload["error"] = self.error
        return HistoryEntry("SERVICE_RESULT", payload)


Event = Start | Resume | Signal | TimerFired | Completion | ChildEnded | ServiceResult | BranchRetry
