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
        patch = state_patch(before, after)
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


def state_patch(before: Any, after: Any) -> list[dict[str, Any]]:
    """The RFC 6902 patch from one state to the next, as ``jsonpatch.make_patch`` gives it.

    make_patch is the costliest Python of a segment (about 28 µs even for a
    one-key change: its diff builder, pointers and operation objects), and
    most steps either change nothing or set top-level keys: that patch is
    read off directly (:func:`_top_level_patch`); everything else goes to
    jsonpatch.
    """
    if before is after:  # a step that cannot have changed the state
        return []
    patch = _top_level_patch(before, after)
    if patch is None:
        patch = jsonpatch.make_patch(before, after).patch
    return patch


_SCALARS = (str, int, float, bool, type(None))


def _top_level_patch(before: Any, after: Any) -> list[dict[str, Any]] | None:
    """make_patch's operations when only top-level keys are added or replaced, else None.

    Within that shape make_patch emits an ``add`` for each new key in the new
    state's order, then a ``replace`` for each changed key in the old state's
    order, and nothing else: with no key removed there is no ``move`` to
    pair, and a replaced value is a scalar, so there is nothing to descend
    into. Values are compared as make_patch compares them, as JSON text
    (``1``, ``1.0`` and ``true`` differ, and so do ``0.0`` and ``-0.0``,
    which ``==`` would not tell). A removed key, or a list or object value
    that changed, leaves the patch to jsonpatch. The states are the drive's
    JSON copies, never changed afterwards, so the added values are not
    copied again.
    """
    if type(before) is not dict or type(after) is not dict:
        return None
    replaced: list[dict[str, Any]] = []
    kept: list[str] = []  # keys of list and object values that == takes for unchanged
    for key, old in before.items():
        if key not in after:
            return None
        new = after[key]
        if new is old:
            continue
        old_type, new_type = type(old), type(new)
        if old_type in _SCALARS and new_type in _SCALARS:
            if (
                old_type is not new_type
                or old != new
                or (old_type is float and str(old) != str(new))
            ):
                replaced.append({"op": "replace", "path": _pointer(key), "value": new})
        elif old != new:
            return None
        else:
            kept.append(key)
    if kept and json.dumps([before[k] for k in kept]) != json.dumps([after[k] for k in kept]):
        return None  # equal to Python, not as JSON (1 and true, 0.0 and -0.0, member order)
    added = [
        {"op": "add", "path": _pointer(key), "value": value}
        for key, value in after.items()
        if key not in before
    ]
    return added + replaced


def _pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of a top-level key."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


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
