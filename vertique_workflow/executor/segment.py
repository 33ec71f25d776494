"""One command, end to end: claim, segment, settle.

The claim commits in a transaction of its own. The segment then runs in one
transaction: the execution lock, the fence on the claim token, the instance
and the plan of its pin, the engine's drive, and every write (instance,
history, commands, queue) — so a transition, its history and the ORM writes
of its actions commit or roll back together. Errors take one of three ways:
a retryable database error returns the command with its attempt restored; an
exception from workflow code rolls the segment back and returns the command
after a backoff with its attempt spent (dead-lettered at MAX_ATTEMPTS); a
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
from ..definitions import Plan
from ..engine import decision_log
from ..engine.decision_log import HistoryEntry
from ..engine.drive import STEP_ATTRIBUTE, DriveResult, RunFacts, drive
from ..exceptions import NonRetryable, WorkflowDefinitionError
from ..pins import resident_plan
from ..store import commands, db, history, instances
from ..store.commands import Head

logger = logging.getLogger("vertique_workflow.executor")


def default_node_id() -> str:
    return workflow_settings.NODE_ID or f"{socket.gethostname()}:{os.getpid()}"


def backoff_seconds(attempt: int) -> float:
    """Exponential backoff of the n-th failed attempt, capped by BACKOFF_MAX_MS."""
    base = workflow_settings.BACKOFF_BASE_MS * (2 ** max(attempt - 1, 0))
    return min(base, workflow_settings.BACKOFF_MAX_MS) / 1000.0


@dataclass(frozen=True)
class Outcome:
    """What happened to one head: CLAIMED-and-ran, or why not."""

    result: str  # COMPLETED PARKED SETTLED DEAD DEFERRED RETRIED FAILED BUSY LOST
    command_id: int


def run_head(head: Head, node_id: str, should_stop: Callable[[], bool] | None = None) -> Outcome:
    """Run one claimable head from peek to settlement.

    ``should_stop`` is asked between the claim and the segment: a process
    shutting down releases a claim it has not started (attempt restored).
    """
    plan = None
    if not head.instance_ended:
        plan = resident_plan(head.definition_id, head.definition_version, head.plan_hash)
        if plan is None:
            with transaction.atomic(using=db.alias()):
                count = commands.defer(head.id, head, _not_runnable(head))
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
        with transaction.atomic(using=db.alias()):
            commands.release(head.id, claim.token)
        return Outcome("RELEASED", head.id)
    return run_claimed(head, claim.token, claim.attempts, plan, node_id)


def _not_runnable(head: Head) -> str:
    return (
        f"this node has no plan for {head.definition_scope_key}/{head.definition_id} "
        f"v{head.definition_version} ({head.plan_hash[:12]})"
    )


def run_claimed(head: Head, token: Any, attempts: int, plan: Plan | None, node_id: str) -> Outcome:
    try:
        with transaction.atomic(using=db.alias()):
            result = _segment(head, token, plan, node_id)
        return Outcome(result, head.id)
    except (NonRetryable, WorkflowDefinitionError) as exc:
        return _fail(head, token, exc)
    except DatabaseError as exc:
        if db.is_retryable(exc):
            with transaction.atomic(using=db.alias()):
                commands.retry_transient(
                    head.id,
                    token,
                    backoff_seconds(1),
                    f"database error {db.sqlstate(exc) or 'unknown'}",
                )
            return Outcome("RETRIED", head.id)
        return _code_error(head, token, attempts, exc)
    except Exception as exc:  # workflow code raised: the segment rolled back
        return _code_error(head, token, attempts, exc)


def _code_error(head: Head, token: Any, attempts: int, exc: BaseException) -> Outcome:
    step = getattr(exc, STEP_ATTRIBUTE, None)
    where = f"step {step!r}" if step else "workflow code"
    logger.warning(
        "command %s of %s: %s raised (attempt %s of %s)",
        head.id,
        head.workflow_id,
        where,
        attempts,
        workflow_settings.MAX_ATTEMPTS,
        exc_info=exc,
    )
    with transaction.atomic(using=db.alias()):
        commands.retry_after_error(
            head.id,
            token,
            backoff_seconds(attempts),
            "STEP_FAILED",
            f"{where} raised an error (attempt {attempts} of {workflow_settings.MAX_ATTEMPTS})",
        )
    return Outcome("RETRIED", head.id)


def _fail(head: Head, token: Any, exc: BaseException) -> Outcome:
    code = "NON_RETRYABLE" if isinstance(exc, NonRetryable) else "DEFINITION_BROKEN"
    message = str(exc)[:1000] or code
    for _ in range(50):
        with transaction.atomic(using=db.alias()):
            outcome = commands.fail(head.id, token, code, message)
        if outcome != "BUSY":
            return Outcome("FAILED" if outcome == "FAILED" else "LOST", head.id)
    return Outcome("BUSY", head.id)


def _segment(head: Head, token: Any, plan: Plan | None, node_id: str) -> str:
    commands.set_statement_deadline(workflow_settings.SEGMENT_DEADLINE_MS)
    commands.lock_instance(head.workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
    command = commands.fence(head.id, token)
    if command is None:
        return "LOST"
    row = instances.get(command.workflow_id)
    assert row is not None  # the command's foreign key guarantees it
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
    )
    signal_name = (command.target or {}).get("name") if command.kind == "SIGNAL" else None
    with context.bound(command.context):
        result = drive(
            plan,
            kind=command.kind,
            state_json=row.state_json,
            current_step=row.current_step_id,
            payload=command.payload,
            signal_name=signal_name,
            facts=facts,
        )
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
        commands.park(command.id, token)
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
    entries = _entries(command.kind, row, result, signal_name)
    ended = result.status == "COMPLETED"
    if not instances.update_after_segment(
        row.id,
        expected_version=row.version,
        status=result.status,
        current_step=result.current_step,
        state=result.state,
        error_type=result.error_type,
        error_message=result.error_message,
        ended=ended or result.status == "FAILED",
        subject=command.target if command.kind == "START" else None,
    ):
        raise _OptimisticConflict()
    history.append(row.id, entries, **common)
    if commands.complete(command.id, token) != 1:
        raise _OptimisticConflict()
    if ended:
        commands.settle_ended(row.id, cancelled=False)
    elif result.status == "WAITING" and result.waiting:
        commands.requeue_parked(row.id, list(result.waiting))
    return "COMPLETED"


class _OptimisticConflict(DatabaseError):
    """The instance or command changed under the execution lock: a bug, retried."""

    sqlstate = "40001"


def _entries(
    kind: str, row: instances.InstanceRow, result: DriveResult, signal_name: str | None
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
        baseline = instances.consume_legacy_baseline(row.id)
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
