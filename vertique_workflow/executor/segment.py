"""One command, end to end: claim, segment, settle.

The claim commits on its own. The segment then runs in one transaction: the
execution lock, the fence on the claim token, the instance and the plan of
its pin, the engine's drive, and every write (instance, history, commands,
queue) — so a transition, its history and the ORM writes of its actions
commit or roll back together; the segment runs under its deadline
(``deadline.py``). Errors take one of three ways: a retryable database error
or the deadline returns the command with its attempt restored; an exception
from workflow code rolls the segment back and returns the command after the
failing step's backoff with its attempt spent (dead-lettered when the step's
attempts are spent); ``NonRetryable``, an exception class the step's policy
never retries, or a broken plan fail the command and its instance. RETRY
commands run the recovery segment (``recovery.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, transaction

from .. import context, document_plans, failures
from ..conf import workflow_settings
from ..definitions import Plan, catalog
from ..engine.decision_log import HistoryEntry
from ..engine.drive import STEP_ATTRIBUTE, DriveResult, RunFacts, Snapshot, drive
from ..engine.events import (
    CHILD_ENDED,
    SERVICE_RESULT,
    BranchRetry,
    ChildEnded,
    Completion,
    Event,
    Refusal,
    ServiceResult,
    Signal,
    Start,
    TimerFired,
)
from ..engine.tokens import JoinView, Token
from ..engine.transition import failed_branch_of
from ..exceptions import NonRetryable, WorkflowDefinitionError
from ..pins import DEFAULT_SCOPE, resident_plan
from ..side_effects.events import listening
from ..store import branches as branch_store
from ..store import commands, db, history, instances, tasks, timers
from ..store import joins as join_store
from ..store import segment as segment_store
from ..store.commands import Head
from ..store.instances import InstanceRow
from . import backoff, deadline, effects, recovery, transition

logger = logging.getLogger("vertique_workflow.executor")

# The command kinds this release's engine runs. Others (MIGRATION, and the
# branch-addressed RETRY commands migration 0003 converted) are deferred like
# a plan this node lacks, never failed: a release that runs them will.
SUPPORTED_KINDS = ("START", "SIGNAL", "RETRY", "TIMER", "COMPLETION")


def default_node_id() -> str:
    return workflow_settings.NODE_ID or f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Outcome:
    """What happened to one command (``workflow_id``, ``kind``, ``step`` and
    ``elapsed_ms`` are filled where known, for the executor's per-command log line).

    ``chained``: the command the segment claimed after its ``COMMIT``, in the
    same round trip (``chain=True``); the worker holds its claim and runs it
    next (or releases it).
    """

    result: str  # COMPLETED PARKED SETTLED DEAD DEFERRED RETRIED FAILED RELEASED BUSY LOST REJECTED
    command_id: int
    workflow_id: Any = None
    kind: str | None = None
    step: str | None = None
    elapsed_ms: float | None = None
    chained: commands.ClaimedCommand | None = None


@dataclass(frozen=True)
class Claimed:
    """A claim this worker holds: enough to run and settle the command."""

    command_id: int
    workflow_id: Any
    token: Any
    attempts: int
    kind: str = ""


def resident_pins() -> list[tuple[str, str, int]]:
    """(definition scope, id, version) of every pin this node can run.

    By version, not by hash: a node runs the instances of every (id, version)
    it holds code for, including instances started under an earlier hash of
    that version (see :func:`vertique_workflow.pins.resident_plan`). Document
    pins join once this process has compiled their plan (publication, the
    startup restore, or a first command taken by the peek path).
    """
    code = [(DEFAULT_SCOPE, plan.id, plan.version) for plan in catalog.all()]
    return code + document_plans.resident_pins()


def run_next(
    node_id: str, should_stop: Callable[[], bool] | None = None, *, chain: bool = False
) -> Outcome | None:
    """Claim and run the oldest runnable head in one claim statement; None: nothing claimed.

    ``chain``: the segment's persist also claims the next command behind its
    ``COMMIT`` (:attr:`Outcome.chained`; see :func:`run_claimed`).
    """
    claimed = commands.claim_next(**_claim_arguments(node_id))
    if claimed is None:
        return None
    return run_next_claimed(claimed, node_id, should_stop, chain=chain)


def claim_notified(
    node_id: str, hint_ms: int | None
) -> commands.ClaimedCommand | commands.AvailabilityDelays:
    """A notified worker's one statement: the claim of :func:`run_next`, or the delays.

    Run the claim with :func:`run_next_claimed`; the delays (nothing was
    claimable by the common path) schedule the worker as
    :func:`vertique_workflow.store.commands.availability_delays` would.
    """
    return commands.claim_next_or_delays(**_claim_arguments(node_id), hint_ms=hint_ms)


def _claim_arguments(node_id: str) -> dict[str, Any]:
    """What the common path's claim statement is given, in either of its forms."""
    return {
        "node_id": node_id,
        "lease_seconds": workflow_settings.LEASE_SECONDS,
        "max_attempts": workflow_settings.MAX_ATTEMPTS,
        "resident": resident_pins(),
        "kinds": SUPPORTED_KINDS,
    }


def run_next_claimed(
    claimed: commands.ClaimedCommand,
    node_id: str,
    should_stop: Callable[[], bool] | None = None,
    *,
    chain: bool = False,
) -> Outcome:
    """Run a command claimed by the common path's claim statement, to settlement.

    The claim may be one a segment made behind its ``COMMIT``
    (:attr:`Outcome.chained`); ``chain`` as in :func:`run_next`.
    """
    claim = Claimed(claimed.id, claimed.workflow_id, claimed.token, claimed.attempts, claimed.kind)
    if should_stop is not None and should_stop():
        commands.release(claim.command_id, claim.token)
        return Outcome("RELEASED", claim.command_id, claim.workflow_id, claim.kind)
    # the claim admits resident pins only: code plans and compiled documents
    plan = resident_plan(
        claimed.definition_id, claimed.definition_version, scope=claimed.definition_scope_key
    )
    return run_claimed(claim, plan, node_id, chain=chain)


def run_head(head: Head, node_id: str, should_stop: Callable[[], bool] | None = None) -> Outcome:
    """Run one claimable head from peek to settlement (the general path).

    Handles what ``run_next`` leaves: heads of ended instances (settled),
    heads out of attempts (dead-lettered), heads whose plan this node lacks
    (deferred). ``should_stop`` is asked between the claim and the segment: a
    process shutting down releases a claim it has not started.
    """
    plan = None
    if not head.instance_ended:
        plan = resident_plan(
            head.definition_id, head.definition_version, scope=head.definition_scope_key
        )
        reason = None
        if plan is None:
            reason = _not_runnable(head)
        elif head.kind not in SUPPORTED_KINDS:
            reason = f"this release does not run {head.kind} commands yet"
        if reason is not None:
            with transaction.atomic(using=db.alias()):
                count = commands.defer(head.id, head, reason, node_id)
            return Outcome("DEFERRED" if count else "BUSY", head.id, head.workflow_id, head.kind)
    with transaction.atomic(using=db.alias()):
        claim = commands.claim(
            head.id,
            head.workflow_id,
            node_id=node_id,
            lease_seconds=workflow_settings.LEASE_SECONDS,
            max_attempts=workflow_settings.MAX_ATTEMPTS,
        )
    if claim is None:
        return Outcome("BUSY", head.id, head.workflow_id, head.kind)
    if claim.outcome != "CLAIMED":
        return Outcome(claim.outcome, head.id, head.workflow_id, head.kind)
    if should_stop is not None and should_stop():
        commands.release(head.id, claim.token)
        return Outcome("RELEASED", head.id, head.workflow_id, head.kind)
    return run_claimed(
        Claimed(head.id, head.workflow_id, claim.token, claim.attempts, head.kind), plan, node_id
    )


def _not_runnable(head: Head) -> str:
    return (
        f"this node has no plan of {head.definition_scope_key}/{head.definition_id} "
        f"v{head.definition_version}"
    )


def run_claimed(claim: Claimed, plan: Plan | None, node_id: str, *, chain: bool = False) -> Outcome:
    """Run the segment of a claimed command and settle whatever happens.

    ``chain``: where the segment's persist carries its ``COMMIT`` (nothing
    follows it in the transaction), it also sends the common path's claim
    behind it, in the same round trip (``commands.claim_after_commit``): a
    transaction of its own that runs only once the segment has committed.
    What it claimed comes back as :attr:`Outcome.chained`, for the worker to
    run next — one wait on the server less for each command of a busy
    queue. A segment whose writes fail, or that commits otherwise, claims
    nothing so; a ``COMMIT`` that fails has ended the transaction, and the
    claim behind it runs as its own (the failed command takes its retry).

    The segment runs under its deadline (``executor/deadline.py``). Failures:
    a retryable database error or the deadline restores the attempt and backs
    off by the transient count; ``NonRetryable``, an exception class the
    step's policy never retries, or a broken plan fail the command and the
    instance at once; any other exception spends the attempt, backs off by
    the step's policy and is dead-lettered when the step's attempts are spent.
    A step of a *branch* that fails terminally (``NonRetryable``, never
    retried, or its attempts spent) fails only its branch: the rolled-back
    segment runs again with that branch failed at that step, so the branch
    arrives FAILED at its join and the join's policy decides.
    The stored texts come from :mod:`vertique_workflow.failures`; what the
    code raised is logged here, with instance, command and step, only.
    """
    after = commands.claim_after_commit(**_claim_arguments(node_id)) if chain else None
    outcome = _run_segment(claim, plan, node_id, after)
    if after is not None and after.error is not None and db.sqlstate(after.error) != "25P02":
        logger.warning(
            "the claim sent behind the commit of command %s failed (%s); the worker claims again",
            claim.command_id,
            type(after.error).__name__,
        )
    chained = commands.claimed_after_commit(after)
    return outcome if chained is None else replace(outcome, chained=chained)


def _run_segment(
    claim: Claimed, plan: Plan | None, node_id: str, after: db.AfterCommit | None
) -> Outcome:
    """:func:`run_claimed` without the chained claim: the segment and its settlement."""
    started = time.monotonic()
    failed_branches: tuple[tuple[str, str, str], ...] = ()
    while True:
        bound: deadline.Deadline | None = None
        try:
            with (
                deadline.bounded(workflow_settings.SEGMENT_DEADLINE_MS) as bound,
                transaction.atomic(using=db.alias()),
            ):
                result, step = _segment(claim, plan, node_id, failed_branches, after)
            return _outcome(claim, result, step, started)
        except NonRetryable as exc:
            failed = _branch_failure(claim, exc, exc.reason_code, failed_branches)
            if failed is None:
                return _fail(claim, exc.reason_code, exc, started)
        except WorkflowDefinitionError as exc:
            return _fail(claim, "DEFINITION_BROKEN", exc, started)
        except DatabaseError as exc:
            _drop_broken_connection()
            if (bound is not None and bound.expired()) or db.is_retryable(exc):
                return _transient(claim, exc, bound, started)
            failed = _branch_code_error(claim, plan, exc, failed_branches)
            if failed is None:
                return _code_error(claim, plan, exc, started)
        except Exception as exc:  # workflow code raised: the segment rolled back
            failed = _branch_code_error(claim, plan, exc, failed_branches)
            if failed is None:
                return _code_error(claim, plan, exc, started)
        failed_branches = failed


def _branch_code_error(
    claim: Claimed,
    plan: Plan | None,
    exc: BaseException,
    failed_branches: tuple[tuple[str, str, str], ...],
) -> tuple[tuple[str, str, str], ...] | None:
    """The failed branches to run again with, when ``exc`` is terminal for a branch step."""
    policy = _step_policy(plan, getattr(exc, STEP_ATTRIBUTE, None))
    if policy.never_retried(exc):
        return _branch_failure(claim, exc, "NON_RETRYABLE", failed_branches)
    if claim.attempts >= policy.max_attempts:
        return _branch_failure(claim, exc, "ATTEMPTS_EXHAUSTED", failed_branches, policy)
    return None


def _branch_failure(
    claim: Claimed,
    exc: BaseException,
    code: str,
    failed_branches: tuple[tuple[str, str, str], ...],
    policy: backoff.Effective | None = None,
) -> tuple[tuple[str, str, str], ...] | None:
    """Add the branch whose step raised ``exc`` to ``failed_branches`` (None: not a branch).

    A branch already failed there that raises again (the failure is not one
    the drive can route to the join) fails the command as before.
    """
    where = failed_branch_of(exc)
    if where is None:
        return None
    path, step = where
    if any(p == path and s == step for p, s, _ in failed_branches):
        return None
    kind = claim.kind or "claimed"
    if policy is not None:
        error = failures.attempts_exhausted(
            step, kind, claim.attempts, policy.max_attempts, "STEP_FAILED"
        )
    else:
        error = failures.non_retryable(code, step, kind, claim.attempts)
    logger.warning(
        "command %s (%s) of %s: step %s of branch %s failed terminally (%s); the branch fails",
        claim.command_id,
        kind,
        claim.workflow_id,
        step,
        path,
        code,
        exc_info=exc,
    )
    return (*failed_branches, (path, step, error))


def _outcome(claim: Claimed, result: str, step: str | None, started: float) -> Outcome:
    return Outcome(
        result,
        claim.command_id,
        claim.workflow_id,
        claim.kind or None,
        step,
        (time.monotonic() - started) * 1000.0,
    )


def _drop_broken_connection() -> None:
    """A session the deadline (or the network) ended: reconnect for the settlement."""
    wrapper = db.connection()
    raw = wrapper.connection
    if raw is not None and (raw.closed or raw.broken):
        wrapper.close()


def _transient(
    claim: Claimed, exc: BaseException, bound: deadline.Deadline | None, started: float
) -> Outcome:
    if bound is not None and bound.expired():
        message = f"the segment passed its deadline of {bound.ms} ms (SEGMENT_DEADLINE_MS)"
    else:
        message = f"database error {db.sqlstate(exc) or 'without SQLSTATE'}; attempt restored"
    logger.warning(
        "command %s of %s: transient failure (%s): %s",
        claim.command_id,
        claim.workflow_id,
        type(exc).__name__,
        message,
    )
    commands.retry_transient(
        claim.command_id,
        claim.token,
        failures.transient(message),
        base_ms=int(workflow_settings.BACKOFF_BASE_MS),
        max_ms=int(workflow_settings.BACKOFF_MAX_MS),
    )
    return _outcome(claim, "RETRIED", None, started)


def _step_policy(plan: Plan | None, step: str | None) -> backoff.Effective:
    policy = None
    if plan is not None and step is not None and step in plan.steps:
        policy = plan.steps[step].retry
    return backoff.effective(policy)


def _code_error(claim: Claimed, plan: Plan | None, exc: BaseException, started: float) -> Outcome:
    step = getattr(exc, STEP_ATTRIBUTE, None)
    policy = _step_policy(plan, step)
    if policy.never_retried(exc):
        return _fail(claim, "NON_RETRYABLE", exc, started)
    exhausted = claim.attempts >= policy.max_attempts
    logger.warning(
        "command %s (%s) of %s: step %s raised (attempt %s of %s)%s",
        claim.command_id,
        claim.kind or "?",
        claim.workflow_id,
        step or "-",
        claim.attempts,
        policy.max_attempts,
        "; dead-lettered" if exhausted else "",
        exc_info=exc,
    )
    kind = claim.kind or "claimed"
    if exhausted:
        reason = failures.attempts_exhausted(
            step, kind, claim.attempts, policy.max_attempts, "STEP_FAILED"
        )

        def settle() -> str:
            outcome = commands.dead_letter(claim.command_id, claim.token, reason, step)
            if outcome == "DEAD" and claim.kind == "START":  # the instance FAILED with it
                _notify_parent_of_failure(claim.workflow_id)
            return outcome

        outcome = _settle_failure(claim, settle)
        return _outcome(claim, "DEAD" if outcome == "DEAD" else outcome, step, started)
    commands.retry_after_error(
        claim.command_id,
        claim.token,
        policy.delay_seconds(claim.attempts),
        failures.step_failed(step, kind, claim.attempts, policy.max_attempts),
    )
    return _outcome(claim, "RETRIED", step, started)


def _fail(claim: Claimed, code: str, exc: BaseException, started: float) -> Outcome:
    step = getattr(exc, STEP_ATTRIBUTE, None) or getattr(exc, "step_id", None)
    logger.error(
        "command %s (%s) of %s: step %s failed with %s, not retried",
        claim.command_id,
        claim.kind or "?",
        claim.workflow_id,
        step or "-",
        code,
        exc_info=exc,
    )
    reason = failures.non_retryable(code, step, claim.kind or "claimed", claim.attempts)

    def settle() -> str:
        outcome = commands.fail(claim.command_id, claim.token, code, reason, step)
        if outcome == "FAILED":
            _notify_parent_of_failure(claim.workflow_id)
        return outcome

    return _outcome(claim, _settle_failure(claim, settle), step, started)


def _notify_parent_of_failure(workflow_id: Any) -> None:
    """A child FAILED by its executor tells its parent, in the same transaction.

    An instance failed here ran no drive, so its WORKFLOW_FAILED event is
    emitted here too (when someone listens), in the same transaction.
    """
    row = instances.get(workflow_id)
    if row is not None and row.status == "FAILED" and listening():
        from ..side_effects.events import WORKFLOW_FAILED, EmitEvent, emit

        data = {"errorType": row.error_type}
        failed = EmitEvent(WORKFLOW_FAILED, row.current_step_id, data)
        emit([failed], row.id, None, row.definition_id, row.definition_version)
    if row is not None and row.status == "FAILED" and (row.metadata or {}).get("parent"):
        from ..operations import notify_parent

        notify_parent(row, "FAILED", row.state_json, row.error_type)


def _settle_failure(claim: Claimed, settle: Callable[[], str]) -> str:
    """Run a failure disposition in transactions of its own until the lock is free."""
    for _ in range(50):
        with transaction.atomic(using=db.alias()):
            outcome = settle()
        if outcome != "BUSY":
            return {"FAILED": "FAILED", "DEAD": "DEAD"}.get(outcome, "LOST")
        time.sleep(0.05)  # a recording holds the execution lock for a moment
    return "BUSY"


def _segment(
    claim: Claimed,
    plan: Plan | None,
    node_id: str,
    failed_branches: tuple[tuple[str, str, str], ...] = (),
    after: db.AfterCommit | None = None,
) -> tuple[str, str | None]:
    """The segment's statements and drive; returns (result, the step the instance is at).

    ``after``: the next claim, sent behind the persist's ``COMMIT`` when it carries one.
    """
    loaded = segment_store.begin_fence_and_load(
        claim.workflow_id,
        claim.command_id,
        claim.token,
        lock_timeout_ms=workflow_settings.LOCK_TIMEOUT_MS,
        transaction_timeout_ms=(
            workflow_settings.SEGMENT_DEADLINE_MS
            if deadline.server_has_transaction_timeout()
            else None
        ),
    )
    if loaded is None:
        return "LOST", None
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
        failed_branches=failed_branches,
        emit_events=listening(),
    )
    if command.kind == "RETRY" and not (command.target or {}).get("branchId"):
        return recovery.run(plan, loaded, claim.token, facts, _common(loaded, node_id)), None
    event, bound = _event(command)
    snapshot = _snapshot(plan, row, event)
    with context.bound(bound):
        refusal = _refused_before_drive(plan, command, row, event)
        if refusal is not None:
            result = DriveResult(
                applied=False,
                status=row.status,
                current_step=row.current_step_id,
                state=row.state_json,
                refusal=refusal,
            )
        else:
            result = drive(plan, snapshot, event, facts)
        settled = _settle_segment(claim, loaded, result, event, node_id, after)
    return settled, result.current_step


def _event(command: Any) -> tuple[Event, dict[str, Any] | None]:
    """The engine event the fenced command brings, and the durable context to bind.

    A command binds the context its recorder captured (an explicit carrier
    overrides it); a TIMER binds the context stored on its timer row (the
    drive that scheduled it), its command stores none.
    """
    bound = command.context if command.explicit_carrier is None else command.explicit_carrier
    target = command.target or {}
    if command.kind == "START":
        return Start(command.payload), bound
    if command.kind == "RETRY":  # branch-addressed (the others run the recovery segment)
        return BranchRetry(str(target.get("forkStepId")), str(target.get("branchId"))), bound
    if command.kind == "SIGNAL" and target.get("name") == CHILD_ENDED:
        outcome = command.payload or {}
        return ChildEnded(
            target.get("childId"),
            target.get("stepId"),
            str(outcome.get("status")),
            outcome.get("state"),
            outcome.get("errorType"),
            branch_token_id=target.get("branchTokenId"),
        ), bound
    if command.kind == "SIGNAL" and target.get("name") == SERVICE_RESULT:
        outcome = command.payload or {}
        return ServiceResult(
            str(target.get("dispatchKey")),
            target.get("stepId"),
            str(outcome.get("status")),
            outcome.get("result"),
            outcome.get("error"),
            int(outcome.get("attempts") or 0),
            branch_token_id=target.get("branchTokenId"),
        ), bound
    if command.kind == "SIGNAL":
        branch = (target["forkStepId"], target["branchId"]) if target.get("branchId") else None
        return Signal(str(target.get("name")), command.payload, branch), bound
    if command.kind == "TIMER":
        timer = timers.get(command.timer_id) if command.timer_id is not None else None
        return TimerFired(
            command.timer_kind,
            command.timer_id,
            None if timer is None else timer.step_id,
            command.task_id,
            scheduled=timer is not None and timer.status == "SCHEDULED",
            branch_token_id=None if timer is None else timer.branch_token_id,
        ), (None if timer is None else timer.metadata) or None
    if command.kind == "COMPLETION":
        task = tasks.get(command.task_id) if command.task_id is not None else None
        return Completion(
            command.task_id,
            None if task is None else task.step_id,
            str(target.get("decision")),
            command.payload,
            subject_version=target.get("subjectVersion"),
            reserved=task is not None
            and task.status == "COMPLETING"
            and task.reservation_command_id == command.id,
            branch_token_id=None if task is None else task.branch_token_id,
        ), bound
    raise WorkflowDefinitionError(f"command kind {command.kind!r} is not supported by this release")


def _snapshot(plan: Plan, row: InstanceRow, event: Event | None = None) -> Snapshot:
    """The instance as the engine sees it; with its joins and branch tokens when it forks.

    Tokens are read as the event needs them: an event for one branch reads
    that branch's tokens (and those enclosing it), any other event none, and
    the drive reads every token only when it needs them (``more_branches``).
    """
    marks = compensation_reader(plan, row.id)
    if not plan.fork_of_join:
        return Snapshot(row.status, row.current_step_id, row.state_json, compensation_marks=marks)
    joins = {
        j.join_key: JoinView(j.join_key, j.fork_key, j.expected, tuple(j.arrived), j.decided)
        for j in join_store.for_instance(row.id)
    }
    address = _branch_address(event)
    preloaded = () if address is None else _tokens(branch_store.addressed(row.id, **address))
    return Snapshot(
        row.status,
        row.current_step_id,
        row.state_json,
        preloaded,
        joins,
        more_branches=lambda: _tokens(branch_store.for_instance(row.id)),
        compensation_marks=marks,
    )


def compensation_reader(plan: Plan, workflow_id: Any) -> Callable[[], list[Any]] | None:
    """The history reader of a plan's compensations (None: the plan declares none)."""
    if not plan.compensation_steps:
        return None
    return lambda: history.compensation_marks(workflow_id)


def _branch_address(event: Event | None) -> dict[str, Any] | None:
    """How the store finds the tokens ``event`` is for (None: no branch in particular)."""
    if isinstance(event, Signal) and event.branch is not None:
        return {"fork_step_id": event.branch[0], "branch_id": event.branch[1]}
    if isinstance(event, BranchRetry):
        return {"fork_step_id": event.fork_step_id, "branch_id": event.branch_id}
    token_id = getattr(event, "branch_token_id", None)
    return None if token_id is None else {"token_id": token_id}


def _tokens(rows: Any) -> tuple[Token, ...]:
    return tuple(
        Token(t.id, t.fork_step_id, t.branch_id, t.status, t.current_step_id, t.state, t.item)
        for t in rows
    )


def _refused_before_drive(
    plan: Plan, command: Any, row: InstanceRow, event: Event
) -> Refusal | None:
    """Park what this instance cannot take now, before the engine sees it.

    A FAILED instance parks every signal, timer and completion until its
    retry (FAILED is retryable; the retry re-offers them). A plan without
    forks has no branch a branch-addressed signal, timer or completion (one
    converted by migration 0003) could apply to: it waits, parked.
    """
    branch = not plan.fork_of_join and (
        bool((command.target or {}).get("branchId"))
        if isinstance(event, Signal)
        else getattr(event, "branch_token_id", None) is not None
    )
    if row.status == "FAILED" or branch:
        return Refusal("PARK", "PARKED", "the instance cannot take this command now")
    return None


def _common(loaded: segment_store.Loaded, node_id: str) -> dict[str, Any]:
    """The columns every history entry of this segment carries.

    No actor columns: each entry is attributed, in the statement that inserts
    it, to the command it names, and ``fallback_actor`` (the segment
    command's actor) attributes any other (``store/history.py``).
    """
    command, row = loaded.command, loaded.instance
    return {
        "command_id": command.id,
        "executor_id": command.claimed_by or node_id,
        "definition_scope_key": row.definition_scope_key,
        "definition_id": row.definition_id,
        "definition_version": row.definition_version,
        "plan_hash": row.plan_hash,
        "fallback_actor": command.actor.history_columns(),
    }


def _settle_segment(
    claim: Claimed,
    loaded: segment_store.Loaded,
    result: DriveResult,
    event: Event,
    node_id: str,
    after: db.AfterCommit | None = None,
) -> str:
    command, row = loaded.command, loaded.instance
    common = _common(loaded, node_id)
    if not result.applied:
        return _settle_refused(claim, loaded, result.refusal, event, common)
    entries = _entries(event, row, result)
    entries.extend(effects.persist(row.id, command.id, result.effects, context.capture(), row))
    notifies_parent = result.ended and bool(row.metadata and row.metadata.get("parent"))
    transition.persist(
        row,
        command.id,
        claim.token,
        result,
        entries=entries,
        common=common,
        subject=command.target if command.kind == "START" else None,
        kind=command.kind,
        # the persist is the segment's last statement unless a parent is told or
        # parked commands settle: then its transaction commits in the same wait
        commit=not notifies_parent and not loaded.has_parked_or_dead,
        then=after,
    )
    if notifies_parent:
        from ..operations import notify_parent

        notify_parent(row, result.status, result.state, result.error_type)
    if loaded.has_parked_or_dead:
        transition.settle_parked(row, result)
        for fork_key, branch_id, names in result.branch_waits:
            if names:
                commands.requeue_parked_for_branch(row.id, fork_key, branch_id, list(names))
    return "COMPLETED"


def _settle_refused(
    claim: Claimed,
    loaded: segment_store.Loaded,
    refusal: Refusal,
    event: Event,
    common: dict[str, Any],
) -> str:
    """A refused event: park its command, or settle it STALE or REJECTED; nothing else changes.

    A rejected completion reopens its task (lock order: the task before the
    command's settlement), so it can be completed again.
    """
    command, row = loaded.command, loaded.instance
    payload: dict[str, Any] = {"commandId": command.id, "seq": command.seq, "kind": command.kind}
    if refusal.disposition == "PARK":
        commands.park(command.id, claim.token)
        if isinstance(event, Signal):
            payload = {"commandId": command.id, "signal": event.name[:255]}
        payload["step"] = row.current_step_id
        entry = "SIGNAL_PARKED" if isinstance(event, Signal) else "COMMAND_PARKED"
        history.append(row.id, [HistoryEntry(entry, payload)], **common)
        return "PARKED"
    reason = failures.text(refusal.reason_code, refusal.sentence)
    if refusal.disposition == "STALE":
        commands.stale(command.id, claim.token, reason)
        entry = refusal.entry or "COMMAND_STALE"
        history.append(row.id, [HistoryEntry(entry, {**payload, "reason": reason})], **common)
        return "SETTLED"
    if isinstance(event, Completion) and event.reserved:
        tasks.reopen(event.task_id, command.id)
    commands.reject(command.id, claim.token, reason)
    history.append(
        row.id, [HistoryEntry("COMMAND_REJECTED", {**payload, "reason": reason})], **common
    )
    return "REJECTED"


def _entries(event: Event, row: InstanceRow, result: DriveResult) -> list[HistoryEntry]:
    if isinstance(event, Start):
        entries = [
            HistoryEntry(
                "WORKFLOW_STARTED",
                {"definitionId": row.definition_id, "version": row.definition_version},
            )
        ]
        baseline = True
    else:
        # an instance converted by 0003 logs one baseline at its first
        # segment: transition.logged_entries adds it from the stored state
        entries = [event.entry()]  # type: ignore[union-attr]
        baseline = False
    entries.extend(transition.logged_entries(result, row, baseline_needed=baseline))
    return entries
