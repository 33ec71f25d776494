"""Pure orchestration: events in, transitions with effects out. No SQL, no store imports."""

from .decision_log import HistoryEntry, decision_entries, replay
from .drive import Snapshot, drive
from .events import Completion, Resume, Signal, Start, TimerFired
from .transition import Decision, DriveResult, RunFacts, Transition

__all__ = [
    "Completion",
    "Decision",
    "DriveResult",
    "HistoryEntry",
    "Resume",
    "RunFacts",
    "Signal",
    "Snapshot",
    "Start",
    "TimerFired",
    "Transition",
    "decision_entries",
    "drive",
    "replay",
]
