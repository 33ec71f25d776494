"""The segment of a RETRY command: repair a FAILED instance and its dead letters.

``wf.retry()`` records a RETRY command; its segment, under the execution
lock, does what the reference's recovery does:

- a dead START is SUPERSEDED and the START is re-read: an instance that
  never got past its start (PENDING when it failed) is started again from
  the START payload in this segment;
- an instance FAILED by a command (a non-retryable step error, a step its
  code no longer has, an exhausted START) resumes where it stood before that
  command (the FAILED history entry records it) and the failed command is
  offered again, so it runs next with its own payload and attribution;
- an instance FAILED by a ``fail`` step is re-driven from that step (the
  code may have changed since);
- every DEAD command is offered again in one statement (attempts 0, token and
  lease cleared, available now, ``open_signals`` raised by the re-offered
  signals without the cap check);
- reviving a FAILED instance passes pin admission, which accepts a
  DEPRECATED version.

A RETRY that finds nothing to do (a racing retry did it) is REJECTED with
``NOTHING_TO_RETRY``.
"""

from __future__ import annotations

from typing import Any

from .. import context, failures
from ..definitions import Plan
from ..engine.decision_log import HistoryEntry
from ..engine.drive import DriveResult, RunFacts, Snapshot, drive
from ..engine.events import Resume, Start
from ..exceptions import NonRetryable, WorkflowConflict
from ..store import commands, history
from ..store import definitions as registry
from ..store import segment as segment_store
from . import effects, transition


def run(
    plan: Plan,
    loaded: segment_store.Loaded,
    token: Any,
    facts: RunFacts,
    common: dict[str, Any],
) -> str:
    """The RETRY segment's drive and writes (the caller holds the lock and the fence)."""
    command, row = loaded.command, loaded.instance
    found = commands.recovery_facts(row.id)
    failed = row.status == "FAILED"
    if not failed and not found.has_dead:
        reason = failures.text("NOTHING_TO_RETRY", "the instance had nothing to retry")
        commands.reject(command.id, token, reason)
        history.append(
            row.id,
            [HistoryEntry("COMMAND_REJECTED", {"commandId": command.id, "reason": reason})],
            **common,
        )
        return "REJECTED"
    entries: list[HistoryEntry] = []
    failed_command: int | None = None
    result: DriveResult | None = None
    fresh_start = False
    superseded = commands.supersede_dead_start(row.id)
    if superseded is not None:
        entries.append(
            HistoryEntry(
                "COMMAND_SUPERSEDED",
                {"commandId": superseded[0], "seq": superseded[1], "kind": "START"},
                extra={"command_id": superseded[0]},
            )
        )
    if failed:
        _admit(plan, row)
        entry = found.failed_entry or {}
        resume_status = entry.get("resumeStatus")
        if resume_status == "PENDING" or superseded is not None:
            start_row = commands.read_start(row.id)
            payload = start_row[3] if start_row else {}
            with context.bound(command.context):
                result = drive(plan, _snapshot(plan, row), Start(payload), facts)
            fresh_start = True
        elif entry.get("commandId") is not None and resume_status is not None:
            failed_command = int(entry["commandId"])
            result = _restored(plan, resume_status, entry.get("resumeStep"), row.state_json)
        else:  # failed by a fail step: drive it again
            assert row.current_step_id is not None
            with context.bound(command.context):
                result = drive(plan, _snapshot(plan, row), Resume(row.current_step_id), facts)
    entries.insert(
        0,
        HistoryEntry("WORKFLOW_RETRIED", {"commandId": command.id, "wasFailed": failed}),
    )
    if result is None:  # only dead letters to re-offer: the instance stays as it is
        result = DriveResult(True, row.status, row.current_step_id, row.state_json)
    else:
        entries.extend(transition.logged_entries(result, row, baseline_needed=fresh_start))
        # what the re-drive asked for (timers, tasks, branches, children) is written too
        entries.extend(effects.persist(row.id, command.id, result.effects, context.capture(), row))
    transition.persist(
        row, command.id, token, result, entries=entries, common=common, kind=command.kind
    )
    offered = commands.reoffer(row.id, failed_command)
    if offered:
        history.append(
            row.id,
            [
                HistoryEntry(
                    "COMMAND_REOFFERED",
                    {"commandId": cid, "seq": seq, "kind": kind, "retryCommandId": command.id},
                    extra={"command_id": cid},
                )
                for cid, seq, kind in offered
            ],
            **{**common, "command_id": command.id},
        )
    if failed and result.status == "WAITING":
        commands.requeue_parked_callbacks(row.id)
    transition.settle_parked(row, result)
    return "COMPLETED"


def _snapshot(plan: Plan, row: Any) -> Snapshot:
    from .segment import compensation_reader

    return Snapshot(
        row.status,
        row.current_step_id,
        row.state_json,
        compensation_marks=compensation_reader(plan, row.id),
    )


def _admit(plan: Plan, row: Any) -> None:
    """Pin admission of a revival (DEPRECATED accepted), against the code that will drive it.

    The instance's version may have been rehashed since it started (a change
    of code within the version): the registry row then holds the hash of the
    code this node runs, which is what the revived instance runs on. A refusal
    (the version RETIRED, or its row drifted from this node's code) fails the
    RETRY at once instead of spending attempts on it.
    """
    try:
        registry.admit_pin(
            row.definition_scope_key,
            row.definition_id,
            row.definition_version,
            plan.plan_hash,
            resurrection=True,
        )
    except WorkflowConflict as exc:
        raise NonRetryable("PIN_REFUSED", str(exc)) from None


def _restored(plan: Plan, status: str, step: str | None, state: Any) -> DriveResult:
    """The instance as it stood before the command that failed it."""
    waiting: tuple[str, ...] = ()
    if step is not None and step in plan.steps and plan.steps[step].kind == "wait":
        waiting = tuple(plan.steps[step].signals)
    return DriveResult(True, status, step, state, waiting=waiting)
