"""Pure orchestration: drive a plan over a state. No SQL, no store imports."""

from .drive import Decision, DriveResult, RunFacts, drive
from .decision_log import HistoryEntry, decision_entries, replay

__all__ = ["Decision", "DriveResult", "HistoryEntry", "RunFacts", "decision_entries", "drive",
           "replay"]
