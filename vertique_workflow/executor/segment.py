"""One command, end to end: claim, segment, settle.

The claim commits on its own. The segment then runs in one transaction: the
execution lock, the fence on the claim token, the instance and the plan of
its pin, the engine's drive, and every write (instance, history, commands,
queue) — so a transition, its history and the ORM writes of its actions
commit or roll back together. Errors take one of three ways: a retryable
database error returns the command with its attempt restored; an exception
from workflow code rolls the segment back and returns the command after a
backoff with its attempt spent (dead-lettered at MAX_ATTEMPTS); a
``NonRetryable`` error or a broken plan fails the command and its instance.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction

from .. import context
from ..conf import workflow_settings
from ..definitions import Plan, catalog
from ..engine import decision_log
from ..engine.decision_log import HistoryEntry
from ..engine.drive import STEP_ATTRIBUTE, DriveResult, RunFacts, drive
from ..exceptions import NonRetryable, WorkflowDefinitionError
from ..pins import resident_plan
from ..store import commands, db, history
from ..store import segment as segment_store
from ..store.commands import Head
from ..store.instances import InstanceRow

logger = logging.getLogger("vertique_workflow.executor")

# The command kinds this release's engine runs. Others (TIMER and RETRY
# commands converted by migration 0003, COMPLETION, MIGRATION) are deferred
# like a plan this node lacks, never failed: a release that runs them will.
SUPPORTED_KINDS = ("START", "SIGNAL")


def default_node_id() -> str:
    return workflow_settings.NODE_ID or f"{socket.gethostname()}:{os.getpid()}"


def backoff_seconds(attempt: int) -> float:
    """Exponential backoff of the n-th failed attempt, capped by BACKOFF_MAX_MS."""
    base = workflow_settings.BACKOFF_BASE_MS * (2 ** max(attempt - 1, 0))
    return min(base, workflow_settings.BACKOFF_MAX_MS) / 1000.0


@dataclass(frozen=True)
class Outcome:
    """What happened to one command."""

    result: str  # COMPLETED PARKED SETTLED DEAD DEFERRED RETRIED FAILED RELEASED BUSY LOST
    command_id: int


@dataclass(frozen=True)
class Claimed:
    """A claim this worker holds: enough to run and settle the command."""

    command_id: int
    workflow_id: Any
    token: Any
    attempts: int


def resident_pins() -> list[tuple[str, int, str]]:
    """(definition id, version, plan hash) of every plan this node can run."""
    return [(plan.id, plan.version, plan.plan_hash) for plan in catalog.all()]


def run_next(node_id: str, should_stop: Callable[[], bool] | None = None) -> Outcome | None:
    """Claim and run the oldest runnable head in one claim statement; None: nothing claimed."""
    claimed = commands.claim_next(
        node_id=node_id,
        lease_seconds=workflow_settings.LEASE_SECONDS,
        max_attempts=workflow_settings.MAX_ATTEMPTS,
        resident=resident_pins(),
        kinds=SUPPORTED_KINDS,
    )
    if claimed is None:
        return None
    claim = Claimed(claimed.id, claimed.workflow_id, claimed.token, claimed.attempts)
    if should_stop is not None and should_stop():
        commands.release(claim.command_id, claim.token)
        return Outcome("RELEASED", claim.command_id)
    plan = resident_plan(claimed.definition_id, claimed.definition_version, claimed.plan_hash)
    return run_claimed(claim, plan, node_id)


def run_head(head: Head, node_id: str, should_stop: Callable[[], bool] | None = None) -> Outcome:
    """Run one claimable head from peek to settlement (the general path).

    Handles what ``run_next`` leaves: heads of ended instances (settled),
    heads out of attempts (dead-lettered), heads whose plan this node lacks
    (deferred). ``should_stop`` is asked between the claim and the segment: a
    process shutting down releases a claim it has not started.
    """
    plan = None
    if not head.instance_ended:
        plan = resident_plan(head.definition_id, head.definition_version, head.plan_hash)
        reason = None
        if plan is None:
            reason = _not_runnable(head)
        elif head.kind not in SUPPORTED_KINDS:
            reason = f"this release does not run {head.kind} commands yet"
        if reason is not None:
            with transaction.atomic(using=db.alias()):
                count = commands.defer(head.id, head, reason)
            return Outcome("DEFERRED" if count else "BUSY", head.id)
    with transaction.atomic(using=db.alias()):
        claim = commands.claim(
            head.id,
            head.workflow_id,
            node_id=node_id,
            lease_seconds=workflow_settings.LEASE_SECONDS,
            max_attempts=workflow_settings.MAX_ATTEMPTS,
        )
    if claim is None:
        return Outcome("BUSY", head.id)
    if claim.outcome != "CLAIMED":
        return Outcome(claim.outcome, head.id)
    if should_stop is not None and should_stop():
        commands.release(head.id, claim.token)
        return Outcome("RELEASED", head.id)
    return run_claimed(
        Claimed(head.id, head.workflow_id, claim.token, claim.attempts), plan, node_id
    )


def _not_runnable(head: Head) -> str:
    return (
        f"this node has no plan for {head.definition_scope_key}/{head.definition_id} "
        f"v{head.definition_version} ({head.plan_hash[:12]})"
    )


def run_claimed(claim: Claimed, plan: Plan | None, node_id: str) -> Outcome:
    """Run the segment of a claimed command and settle whatever happens."""
    try:
        with transaction.atomic(using=db.alias()):
            result = _segment(claim, plan, node_id)
        return Outcome(result, claim.command_id)
    except (NonRetryable, WorkflowDefinitionError) as exc:
        return _fail(claim, exc)
    except DatabaseError as exc:
        if db.is_retryable(exc):
            commands.retry_transient(
                claim.command_id,
                claim.token,
                backoff_seconds(1),
                f"database error {db.sqlstate(exc) or 'unknown'}",
            )
            return Outcome("RETRIED", claim.command_id)
        return _code_error(claim, exc)
    except Exception as exc:  # workflow code raised: the segment rolled back
        return _code_error(claim, exc)


def _code_error(claim: Claimed, exc: BaseException) -> Outcome:
    step = getattr(exc, STEP_ATTRIBUTE, None)
    where = f"step {step!r}" if step else "workflow code"
    maximum = workflow_settings.MAX_ATTEMPTS
    logger.warning(
        "command %s of %s: %s raised (attempt %s of %s)",
        claim.command_id,
        claim.workflow_id,
        where,
        claim.attempts,
        maximum,
        exc_info=exc,
    )
    commands.retry_after_error(
        claim.command_id,
        claim.token,
        backoff_seconds(claim.attempts),
        "STEP_FAILED",
        f"{where} raised an error (attempt {claim.attempts} of {maximum})",
    )
    return Outcome("RETRIED", claim.command_id)


def _fail(claim: Claimed, exc: BaseException) -> Outcome:
    code = "NON_RETRYABLE" if isinstance(exc, NonRetryable) else "DEFINITION_BROKEN"
    message = str(exc)[:1000] or code
    for _ in range(50):
        with transaction.atomic(using=db.alias()):
            outcome = commands.fail(claim.command_id, claim.token, code, message)
        if outcome != "BUSY":
            return Outcome("FAILED" if outcome == "FAILED" else "LOST", claim.command_id)
    return Outcome("BUSY", claim.command_id)


def _segment(claim: Claimed, plan: Plan | None, node_id: str) -> str:
    segment_store.begin(
        claim.workflow_id,
        deadline_ms=workflow_settings.SEGMENT_DEADLINE_MS,
        lock_timeout_ms=workflow_settings.LOCK_TIMEOUT_MS,
    )
    loaded = segment_store.fence_and_load(claim.command_id, claim.token)
    if loaded is None:
        return "LOST"
    command, row = loaded.command, loaded.instance
    if plan is None:
        raise WorkflowDefinitionError(
            "no resident plan for the instance's pin", definition_id=row.definition_id
        )
    facts = RunFacts(
        instance_id=row.id,
        definition_id=row.definition_id,
        definition_version=row.definition_version,
        business_key=row.business_key,
        scope=row.scope_key,
        command_id=command.id,
        command_kind=command.kind,
        actor=command.actor,
        max_state_bytes=workflow_settings.MAX_PAYLOAD_BYTES,
    )
    signal_name = (command.target or {}).get("name") if command.kind == "SIGNAL" else None
    if signal_name is not None and (command.target or {}).get("branchId"):
        # no step of this release runs branches: a branch-addressed signal waits
        result = DriveResult(
            applied=False, status=row.status, current_step=row.current_step_id, state=row.state_json
        )
    else:
        result = _drive(plan, command, row, signal_name, facts)
    return _settle_segment(claim, loaded, result, signal_name, node_id)


def _drive(
    plan: Plan, command: Any, row: InstanceRow, signal_name: str | None, facts: RunFacts
) -> DriveResult:
    with context.bound(command.context):
        return drive(
            plan,
            kind=command.kind,
            state_json=row.state_json,
            current_step=row.current_step_id,
            payload=command.payload,
            signal_name=signal_name,
            facts=facts,
        )


def _settle_segment(
    claim: Claimed,
    loaded: segment_store.Loaded,
    result: DriveResult,
    signal_name: str | None,
    node_id: str,
) -> str:
    command, row = loaded.command, loaded.instance
    common = {
        "command_id": command.id,
        "executor_id": command.claimed_by or node_id,
        "definition_scope_key": row.definition_scope_key,
        "definition_id": row.definition_id,
        "definition_version": row.definition_version,
        "plan_hash": row.plan_hash,
        **command.actor.history_columns(),
    }
    if not result.applied:
        commands.park(command.id, claim.token)
        history.append(
            row.id,
            [
                HistoryEntry(
                    "SIGNAL_PARKED",
                    {
                        "commandId": command.id,
                        "signal": str(signal_name)[:255],
                        "step": row.current_step_id,
                    },
                )
            ],
            **common,
        )
        return "PARKED"
    ended = result.status == "COMPLETED"
    if not segment_store.persist(
        instance=row,
        command_id=command.id,
        token=claim.token,
        status=result.status,
        current_step=result.current_step,
        state=result.state,
        error_type=result.error_type,
        error_message=result.error_message,
        ended=ended or result.status == "FAILED",
        subject=command.target if command.kind == "START" else None,
        entries=_entries(command.kind, row, result, signal_name),
        common=common,
    ):
        raise _OptimisticConflict()
    if loaded.has_parked_or_dead:
        if ended:
            commands.settle_ended(row.id, cancelled=False)
        elif result.status == "WAITING" and result.waiting:
            commands.requeue_parked(row.id, list(result.waiting))
    return "COMPLETED"


class _OptimisticConflict(DatabaseError):
    """The instance or command changed under the execution lock: retried as transient."""

    sqlstate = "40001"


def _entries(
    kind: str, row: InstanceRow, result: DriveResult, signal_name: str | None
) -> list[HistoryEntry]:
    entries: list[HistoryEntry] = []
    if kind == "START":
        entries.append(
            HistoryEntry(
                "WORKFLOW_STARTED",
                {"definitionId": row.definition_id, "version": row.definition_version},
            )
        )
        baseline = True
    else:
        # an instance converted by 0003 logs one baseline at its first segment
        baseline = not row.baseline_logged
        entries.append(HistoryEntry("SIGNAL_APPLIED", {"signal": str(signal_name)[:255]}))
    logged, _ = decision_log.decision_entries(
        result.decisions,
        state_version=row.version,
        baseline_needed=baseline,
        redacted_fields=workflow_settings.REDACTED_FIELDS,
        max_patch_bytes=workflow_settings.HISTORY_PATCH_MAX_BYTES,
    )
    entries.extend(logged)
    if result.status == "COMPLETED":
        entries.append(
            HistoryEntry("WORKFLOW_COMPLETED", {"step": result.current_step}, outcome="COMPLETED")
        )
    elif result.status == "FAILED":
        entries.append(
            HistoryEntry("WORKFLOW_FAILED", {"reason": result.error_message}, outcome="FAILED")
        )
    return entries
