"""The decision log: history entries that let anyone rebuild the state.

Each step the drive takes becomes a DECISION entry (``entry_version`` 2)
holding the RFC 6902 patch from the state before to the state after it
(``[]`` when nothing changed). A STATE_BASELINE entry holds the full state:
at an instance's first segment, and after a change too large to log as a
patch (that DECISION stores ``patch_json`` NULL). :func:`replay` folds the
entries back into the state. Redacted fields never enter any entry.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from .transition import Decision, DriveResult

ENTRY_VERSION_DECISION_LOG = 2
NO_PATCH = object()  # the entry carries no patch column at all (not a decision)


@dataclass
class HistoryEntry:
    """One row to append to workflow_history (the store assigns sequence)."""

    event_type: str
    payload: dict[str, Any] | None = None
    step_id: str | None = None
    outcome: str | None = None
    patch: Any = NO_PATCH
    entry_version: int = 1
    state_version_before: int | None = None
    state_version_after: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def patch_json(self) -> list[Any] | None:
        return None if self.patch is NO_PATCH else self.patch


def redact(value: Any, fields: frozenset[str]) -> Any:
    """A copy of ``value`` without any dict key named in ``fields`` (at any depth)."""
    if not fields:
        return value
    if isinstance(value, dict):
        return {k: redact(v, fields) for k, v in value.items() if k not in fields}
    if isinstance(value, list):
        return [redact(v, fields) for v in value]
    return value


def baseline(
    state: dict[str, Any], version: int, step_id: str | None, fields: frozenset[str]
) -> HistoryEntry:
    return HistoryEntry(
        "STATE_BASELINE",
        {"state": redact(state, fields)},
        step_id=step_id,
        outcome="BASELINE",
        entry_version=ENTRY_VERSION_DECISION_LOG,
        state_version_before=version,
        state_version_after=version,
    )


def decision_entries(
    decisions: Sequence[Decision],
    *,
    state_version: int,
    baseline_needed: bool,
    redacted_fields: Iterable[str] = (),
    max_patch_bytes: int = 65536,
) -> tuple[list[HistoryEntry], int]:
    """History entries of a drive's decisions, and the state version after them."""
    fields = frozenset(redacted_fields)
    entries: list[HistoryEntry] = []
    version = state_version
    first = next((d for d in decisions if d.branch is None), None)
    if baseline_needed and first is not None:
        entries.append(baseline(first.before, version, first.step_id, fields))
    for decision in decisions:
        before = redact(decision.before, fields)
        after = redact(decision.after, fields)
        # an unchanged state (a decision, an end) needs no diff: make_patch is the
        # costliest Python of a segment
        patch = [] if before == after else jsonpatch.make_patch(before, after).patch
        oversized = bool(patch) and len(json.dumps(patch, separators=(",", ":"))) > max_patch_bytes
        if decision.branch is not None:
            entries.append(_branch_entry(decision, patch, oversized))
            continue
        changed = bool(patch)
        entry = HistoryEntry(
            "DECISION",
            {"outcome": decision.outcome, **decision.detail},
            step_id=decision.step_id,
            outcome=decision.outcome,
            patch=None if oversized else patch,
            entry_version=ENTRY_VERSION_DECISION_LOG,
            state_version_before=version,
            state_version_after=version + (1 if changed else 0),
        )
        entries.append(entry)
        version = entry.state_version_after or version
        if oversized:
            entries.append(baseline(decision.after, version, decision.step_id, fields))
    return entries, version


def _branch_entry(decision: Decision, patch: list[Any], oversized: bool) -> HistoryEntry:
    """A step a branch token took: its patch is over the branch's own state.

    ``BRANCH_DECISION`` entries carry no state version (they do not change
    the instance's state) and :func:`replay` of the instance state skips
    them; the branch, fork and token they belong to are in the payload.
    """
    return HistoryEntry(
        "BRANCH_DECISION",
        {"outcome": decision.outcome, **decision.detail, **(decision.branch or {})},
        step_id=decision.step_id,
        outcome=decision.outcome,
        patch=None if oversized else patch,
        entry_version=ENTRY_VERSION_DECISION_LOG,
    )


def replay(entries: Iterable[tuple[str, dict[str, Any] | None, list[Any] | None]]) -> Any:
    """Fold (event_type, payload, patch) entries, in sequence order, into the state.

    Only decision-log entries should be passed. Raises ``ValueError`` when the
    entries hold no baseline to start from.
    """
    state: Any = None
    for event_type, payload, patch in entries:
        if event_type == "STATE_BASELINE":
            state = copy.deepcopy((payload or {}).get("state"))
        elif event_type == "DECISION" and patch:
            if state is None:
                raise ValueError("decision log has a patch before any baseline")
            state = jsonpatch.apply_patch(state, patch)
    if state is None:
        raise ValueError("decision log holds no STATE_BASELINE")
    return state


def ending_entries(result: DriveResult) -> list[HistoryEntry]:
    """The history entry of a drive that ended the instance (none otherwise).

    A failure is the reference's FAILED entry (step id null, the step in the
    payload); ``WORKFLOW_FAILED`` is the event's name, not the entry's.
    """
    if result.status == "COMPLETED":
        return [
            HistoryEntry("WORKFLOW_COMPLETED", {"step": result.current_step}, outcome="COMPLETED")
        ]
    if result.status == "COMPENSATED":
        return [
            HistoryEntry(
                "WORKFLOW_COMPENSATED",
                {"reason": result.error_message, "step": result.current_step},
                outcome="COMPENSATED",
            )
        ]
    if result.status == "FAILED":
        return [
            HistoryEntry(
                "FAILED",
                {"reason": result.error_message, "step": result.current_step},
                outcome="FAILED",
            )
        ]
    return []
