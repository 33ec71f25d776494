"""Pure orchestration: drive a plan over a state. No SQL, no store imports."""

from .decision_log import HistoryEntry, decision_entries, replay
from .drive import Decision, DriveResult, RunFacts, drive

__all__ = [
    "Decision",
    "DriveResult",
    "HistoryEntry",
    "RunFacts",
    "decision_entries",
    "drive",
    "replay",
]
