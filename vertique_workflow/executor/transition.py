"""Writing a drive's outcome: the pieces every segment kind shares.

A START or SIGNAL segment and a RETRY segment both turn a ``DriveResult``
into history entries (the decision log and the ending entry), persist it in
one statement (instance, history, command completion) and then settle the
instance's parked commands. One place for each, so the kinds cannot drift.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError

from ..conf import workflow_settings
from ..engine import decision_log
from ..engine.decision_log import HistoryEntry, ending_entries
from ..engine.drive import DriveResult
from ..store import commands, db, history
from ..store import segment as segment_store
from ..store.instances import InstanceRow


class OptimisticConflict(DatabaseError):
    """The instance or command changed under the execution lock: retried as transient."""

    sqlstate = "40001"


def logged_entries(
    result: DriveResult, row: InstanceRow, *, baseline_needed: bool
) -> list[HistoryEntry]:
    """The decision log of a drive (redacted, patches or baselines) and its ending entry.

    ``baseline_needed``: the drive started the state (a START, a fresh start
    of a retry), so its first decision's state is the baseline. An instance
    from before 0003 (``baseline_logged`` FALSE) that is not started afresh
    logs its stored state as the baseline first, at its current version;
    :func:`persist` consumes the mark with it. State versions continue from
    the instance's ``version`` (docs/execution.md, "State versions").
    """
    entries: list[HistoryEntry] = []
    if not baseline_needed and not row.baseline_logged and row.state_json is not None:
        entries.append(
            decision_log.baseline(
                row.state_json,
                row.version,
                row.current_step_id,
                frozenset(workflow_settings.REDACTED_FIELDS),
            )
        )
    logged, _ = decision_log.decision_entries(
        result.decisions,
        state_version=row.version,
        baseline_needed=baseline_needed,
        redacted_fields=workflow_settings.REDACTED_FIELDS,
        max_patch_bytes=workflow_settings.HISTORY_PATCH_MAX_BYTES,
    )
    return [*entries, *logged, *ending_entries(result)]


def persist(
    row: InstanceRow,
    command_id: int,
    token: Any,
    result: DriveResult,
    *,
    entries: list[HistoryEntry],
    common: dict[str, Any],
    subject: Any = None,
    kind: str | None = None,
    commit: bool = False,
    then: db.AfterCommit | None = None,
) -> None:
    """The instance, the entries and the command's completion in one statement.

    ``kind``: the command's kind when known (a SIGNAL's settlement also lowers
    the open-signal count; any other kind runs the shorter statement).
    ``commit``: the segment writes nothing after this statement, so its
    transaction may commit in the same round trip (``store/segment.persist``),
    and ``then`` (the worker's next claim) go behind that ``COMMIT``.

    ``common`` may hold ``fallback_actor``: the actor of entries that name no
    command with one (the segment command's). The instance's new version is
    the state version the entries reached (one past the version read at
    least); a STATE_BASELINE among them consumes a pre-0003 instance's mark.
    """
    common = dict(common)
    actor = common.pop("fallback_actor", None) or history.NO_ACTOR
    reached = [e.state_version_after for e in entries if e.state_version_after is not None]
    if not segment_store.persist(
        instance=row,
        command_id=command_id,
        token=token,
        status=result.status,
        current_step=result.current_step,
        state=result.state,
        error_type=result.error_type,
        error_message=result.error_message,
        ended=result.status in ("COMPLETED", "COMPENSATED", "FAILED"),
        subject=subject,
        entries=entries,
        common=common,
        actor=actor,
        new_version=max([row.version + 1, *reached]),
        legacy_baseline=not row.baseline_logged
        and any(e.event_type == "STATE_BASELINE" for e in entries),
        signal=kind is None or kind == "SIGNAL",
        commit=commit,
        then=then,  # sent only with the COMMIT (store/segment.persist)
    ):
        raise OptimisticConflict()


def settle_parked(row: InstanceRow, result: DriveResult) -> None:
    """An ended instance settles its parked and dead commands; a wait re-queues what it accepts."""
    if result.status in ("COMPLETED", "COMPENSATED"):
        commands.settle_ended(row.id, cancelled=False)
    elif result.status == "WAITING" and result.waiting:
        commands.requeue_parked(row.id, list(result.waiting))


__all__ = ["OptimisticConflict", "logged_entries", "persist", "settle_parked"]
