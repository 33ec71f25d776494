"""The record side: start, signal, cancel, retry, get, and the human-task operations.

Each operation runs in ``transaction.atomic()`` on the workflow database, so
it joins the caller's transaction: the workflow rows commit or roll back with
the application's own writes. It never runs workflow code; it validates,
deduplicates, writes a command and returns. Executors run the command later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction

from . import context, failures, ids, payloads
from .conf import workflow_settings
from .engine.decision_log import HistoryEntry, replay
from .exceptions import WorkflowConflict, WorkflowError, WorkflowNotFound, WorkflowValidationError
from .pins import Pin, resolve_start_pin, signal_schema_source
from .store import branches as branches_store
from .store import commands, db, dedup, history, instances, pipelined_start, signal_record
from .store import definitions as registry
from .store import retention as retention_store
from .store import tasks as tasks_store
from .store import timers as timers_store

DEFAULT_SCOPE = "default"
KEY_MAX = 255


@dataclass(frozen=True)
class InstanceRef:
    """What ``start`` returns: the instance id and whether this call created it."""

    id: uuid.UUID
    definition_id: str
    definition_version: int
    created: bool


@dataclass(frozen=True)
class SignalReceipt:
    """What ``signal`` returns: the recorded command, or the earlier one for a replay."""

    instance_id: uuid.UUID
    name: str
    command_id: int | None
    duplicate: bool


@dataclass(frozen=True)
class InstanceView:
    """A read of an instance for views, tests and the admin."""

    id: uuid.UUID
    definition_id: str
    definition_version: int
    status: str
    current_step: str | None
    state: Any
    business_key: str | None
    scope: str
    error_type: str | None
    error_message: str | None
    version: int
    created_at: Any
    updated_at: Any
    completed_at: Any
    dead_commands: int = 0
    parked_commands: int = 0
    last_failure: Failure | None = None

    @property
    def needs_attention(self) -> bool:
        """FAILED, or holding dead-lettered commands: something only ``retry`` repairs."""
        return self.status == "FAILED" or self.dead_commands > 0


@dataclass(frozen=True)
class Failure:
    """The last failure of an instance that needs attention (from its history).

    ``reason_code`` and ``step`` are read from the stored text; ``message``
    is that text (``<REASON_CODE>: <sentence>``, never exception text).
    """

    reason_code: str | None
    step: str | None
    at: Any
    message: str
    command_id: int | None


@dataclass(frozen=True)
class RetryReceipt:
    """What ``retry`` returns: the RETRY command, or the open one a repeat found."""

    instance_id: uuid.UUID
    command_id: int
    duplicate: bool


def _fingerprint(**parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _require_key(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > KEY_MAX:
        raise WorkflowValidationError(
            f"{what} must be a non-empty string of at most {KEY_MAX} characters"
        )
    if "\x00" in value:  # a text column cannot hold it: a database error otherwise
        raise WorkflowValidationError(f"{what} holds a NUL character (\\u0000)")
    return value


def _require_payload(value: Any, what: str) -> None:
    """The JSON rules and the size limit (payloads.check), before any read or write."""
    payloads.check(value, what, max_bytes=workflow_settings.MAX_PAYLOAD_BYTES)


def _uuid(value: Any, missing: str = "no workflow instance with that id") -> uuid.UUID:
    """An id as a UUID; text that is not one names nothing (``WorkflowNotFound``)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise WorkflowNotFound(missing) from None


def _atomic() -> Any:
    return transaction.atomic(using=db.alias())


def start(
    definition_id: str,
    payload: dict[str, Any] | None = None,
    *,
    idempotency_key: str,
    business_key: str | None = None,
    scope: str = DEFAULT_SCOPE,
    version: int | None = None,
    actor: context.Actor | None = None,
    subject: Any = None,
    _parent: dict[str, Any] | None = None,
) -> InstanceRef:
    """Record a new instance of ``definition_id`` and its START command.

    Joins the caller's transaction. The same ``idempotency_key`` with the same
    arguments returns the same instance (``created=False``); with other
    arguments it raises ``WorkflowConflict``, as does a business key already
    used in the scope. A payload failing the start schema raises
    ``WorkflowValidationError``; nothing is written then.
    """
    _require_key(definition_id, "definition_id")
    _require_key(idempotency_key, "idempotency_key")
    _require_key(scope, "scope")
    if business_key is not None:
        _require_key(business_key, "business_key")
    if version is not None and (not isinstance(version, int) or version < 1):
        raise WorkflowValidationError("version must be a positive integer")
    if payload is not None and not isinstance(payload, dict):
        raise WorkflowValidationError("the start payload must be a JSON object")
    _require_payload(payload, "the start payload")
    _require_payload(subject, "the subject")
    fingerprint = _fingerprint(payload=payload, business_key=business_key, version=version)
    request = _StartRequest(
        definition_id,
        payload,
        idempotency_key,
        business_key,
        scope,
        version,
        actor,
        subject,
        _parent,
        fingerprint,
    )
    if db.connection().in_atomic_block:
        return _record_start(request, mode=_CALLER)
    # Called outside a transaction: the writes in one transaction of our own,
    # pipelined with its commit (store.pipelined_start: one or two waits on the
    # server) where the connection allows, else Django's atomic around the reads
    # and the writes.
    if pipelined_start.available():
        try:
            return _record_start(request, mode=_PIPELINED)
        except pipelined_start.StricterIsolation:
            pass  # the session's transactions are not READ COMMITTED: the reference's FOR SHARE
    with _atomic():
        return _record_start(request, mode=_OWN)


# How ``_record_start`` writes: in the caller's transaction (a savepoint), in
# Django's atomic that ``start`` opened, or pipelined in a transaction of its own.
_CALLER, _OWN, _PIPELINED = "caller", "own", "pipelined"


@dataclass(frozen=True)
class _StartRequest:
    """``start``'s arguments, checked, and the fingerprint of those a replay must repeat."""

    definition_id: str
    payload: dict[str, Any] | None
    idempotency_key: str
    business_key: str | None
    scope: str
    version: int | None
    actor: context.Actor | None
    subject: Any
    parent: dict[str, Any] | None
    fingerprint: str


def _record_start(request: _StartRequest, *, mode: str) -> InstanceRef:
    """The reads and writes of ``start``, in the transaction ``mode`` says.

    In a caller's transaction the writes are a savepoint, so a refusal or a
    lost race leaves that transaction usable and nothing written; in a
    transaction of ``start``'s own no savepoint is needed (nothing else is in it).
    Pipelined, a start of an id whose selection this process remembers is
    judged on it and recorded in one wait when the selection is unchanged
    (``store.pipelined_start``); anything else reads afresh.
    """
    definition_id, scope, key = request.definition_id, request.scope, request.idempotency_key
    if mode == _OWN:  # a stricter session: the reference's FOR SHARE admission, read afresh
        earlier, selection = registry.start_read(scope, definition_id, key)
    else:
        started = _start_on_remembered_selection(request, mode)
        if started is not None:
            return started
        # the key and the selection read in one statement (one wait on the server)
        earlier, selection, digest = registry.start_read_with_digest(scope, definition_id, key)
        pipelined_start.remember(scope, definition_id, selection, digest)
    if earlier is not None:
        return _replayed_start(earlier, request.fingerprint)
    pin = resolve_start_pin(definition_id, scope, request.version, selection)
    pin.check_start_payload(request.payload or {})
    instance_id, record = _start_record(pin, request)
    with _start_errors(request, mode):
        if mode == _PIPELINED:
            claimed = pipelined_start.admit_and_record(record)
        else:
            with _atomic() if mode == _CALLER else contextlib.nullcontext():
                pin.admit()
                # one statement, the key first: a concurrent start with the same key
                # then resolves as a replay, not as a business-key conflict
                claimed = instances.record_prepared_start(record)
    if not claimed:  # another transaction committed the same key first: a replay
        earlier = dedup.find("START", scope, definition_id, key)
        assert earlier is not None
        return _replayed_start(earlier, request.fingerprint)
    return InstanceRef(instance_id, definition_id, pin.version, created=True)


def _start_on_remembered_selection(request: _StartRequest, mode: str) -> InstanceRef | None:
    """A start judged on the remembered selection, in one pipeline; None: read afresh.

    Pipelined (outside a transaction) the pipeline commits; in the caller's
    transaction it writes under a savepoint of its own. None when nothing is
    remembered, when the remembered selection refuses the start (the fresh
    read judges again, and its refusal is the one raised), and when the
    guarded record wrote nothing: the key exists (the fresh read finds the
    replay), the pin is refused, or the selection's rows changed since they
    were remembered (forgotten then).
    """
    remembered = pipelined_start.remembered(request.scope, request.definition_id)
    if remembered is None:
        return None
    in_transaction = mode == _CALLER
    selection, digest = remembered
    try:
        pin = resolve_start_pin(request.definition_id, request.scope, request.version, selection)
        pin.check_start_payload(request.payload or {})
    except WorkflowError:
        return None
    instance_id, record = _start_record(pin, request)
    with _start_errors(request, mode):
        if in_transaction:
            recorded = pipelined_start.record_on_remembered_in_transaction(record, digest)
        else:
            recorded = pipelined_start.record_on_remembered(record, digest)
    if not recorded:
        pipelined_start.forget(request.scope, request.definition_id)
        return None
    return InstanceRef(instance_id, request.definition_id, pin.version, created=True)


def _start_record(pin: Pin, request: _StartRequest) -> tuple[uuid.UUID, dict[str, Any]]:
    """A new instance id (time-ordered, :mod:`.ids`) and the record statement's parameters."""
    instance_id = ids.uuid7()
    # captured once: the instance's metadata and the START command hold the same document
    captured = context.capture()
    parent = request.parent
    record = instances.record_start_params(
        instance_id,
        scope_key=request.scope,
        definition_id=request.definition_id,
        idempotency_key=request.idempotency_key,
        fingerprint=request.fingerprint,
        definition_version=pin.version,
        plan_hash=pin.plan_hash,
        definition_scope_key=pin.scope,
        business_key=request.business_key,
        subject=request.subject,
        metadata={**(captured or {}), **({"parent": parent} if parent else {})},
        payload=request.payload or {},
        context=captured,
        actor=context.stored_actor(request.actor),
    )
    return instance_id, record


@contextlib.contextmanager
def _start_errors(request: _StartRequest, mode: str) -> Iterator[None]:
    """A start's database errors as the caller sees them (conflict, lock timeout, others)."""
    try:
        yield
    except DatabaseError as exc:
        if db.sqlstate(exc) == "23505":
            raise WorkflowConflict(
                f"business key already used by another instance of {request.definition_id!r} "
                f"in scope {request.scope!r}"
            ) from None
        if registry.is_lock_timeout(exc):
            if mode == _CALLER:
                # the reference: the data-access error, the caller's transaction lost
                transaction.set_rollback(True, using=db.alias())
                raise
            raise registry.lock_timeout_error(exc, request.definition_id) from exc
        raise db.translate(exc, "start") from None


class _LostKeyRace(Exception):
    """Another transaction committed the same idempotency key first."""


def _replayed_start(earlier: tuple[Any, str, Any], fingerprint: str) -> InstanceRef:
    workflow_id, stored, _ = earlier
    if stored != fingerprint:
        raise WorkflowConflict("idempotency key already used for a different start")
    row = instances.get(workflow_id)
    if row is None:  # purged by retention: the key outlived its instance
        raise WorkflowNotFound("the instance started with that idempotency key no longer exists")
    return InstanceRef(row.id, row.definition_id, row.definition_version, created=False)


def signal(
    instance_id: Any,
    name: str,
    payload: Any = None,
    *,
    dedup_key: str,
    branch: tuple[str, str] | None = None,
    actor: context.Actor | None = None,
    carrier: dict[str, Any] | None = None,
) -> SignalReceipt:
    """Record a signal for an instance (applied later by an executor).

    ``branch`` addresses the signal to one branch of a fork, as
    ``(fork_step_id, branch_id)``; it is recorded in the command's target. Only
    a wait of that branch accepts it; it is parked while the branch does not
    exist yet or waits elsewhere, and settled STALE
    (``BRANCH_LATE_CALLBACK_IGNORED``) when the branch was superseded or has
    ended.

    A committed duplicate (same key, same name and payload) returns the
    earlier receipt; the same key with another signal raises
    ``WorkflowConflict``. Undeclared names and payloads failing the declared
    schema raise ``WorkflowValidationError``; an ended instance or an instance
    at its open-signal cap raises ``WorkflowConflict``. Refusals write nothing.

    ``carrier`` is an explicit durable context for the workflow code this
    signal runs: a mapping of registered durable-context names to JSON values
    (the shape ``context.capture()`` holds under ``"context"``). When given,
    the executor binds it instead of the context captured from the caller;
    an unregistered name or the identity namespace raises
    ``WorkflowValidationError``. It is stored as ``{"context": {...}}`` in
    the command's ``explicit_carrier_json`` and, like the captured context,
    is not part of the dedup fingerprint.
    """
    from .engine.events import RESERVED_SIGNALS

    if name in RESERVED_SIGNALS:
        raise WorkflowValidationError(
            f"signal name {name!r} is reserved (child workflows and service results)"
        )
    workflow_id = _uuid(instance_id)
    _require_key(name, "signal name")
    _require_key(dedup_key, "dedup_key")
    _require_payload(payload, "the signal payload")
    explicit = context.explicit_carrier(carrier, max_bytes=workflow_settings.MAX_PAYLOAD_BYTES)
    target: dict[str, Any] = {"name": name, **(_branch_target(branch) or {})}
    fingerprint = _fingerprint(name=name, payload=payload, branch=branch)
    namespace = str(workflow_id)
    # Outside a caller's transaction: one of our own for the reads and the writes
    # (one commit); inside one, the writes are a savepoint of it. One read, then the
    # lock and the writes in one pipeline (store.signal_record).
    owned = not db.connection().in_atomic_block
    try:
        with _atomic() if owned else contextlib.nullcontext():
            found = signal_record.read(DEFAULT_SCOPE, namespace, dedup_key, workflow_id)
            if found.earlier is not None:
                return _replayed_signal(found.earlier, fingerprint, workflow_id, name)
            row = found.instance
            if row is None:
                raise WorkflowNotFound("no workflow instance with that id")
            declaration = (found.declaration_found, found.declared)
            signal_schema_source(row, declaration).check_signal(name, payload)
            if row.ended:
                raise WorkflowConflict(f"the instance has ended ({row.status}); signal refused")
            cap = workflow_settings.OPEN_SIGNALS_CAP
            written = signal_record.lock_and_write(
                {
                    **commands.insert_params(
                        workflow_id,
                        "SIGNAL",
                        payload=payload,
                        dedup_key=dedup_key,
                        target=target,
                        context=context.capture(),
                        carrier=explicit,
                        actor=context.stored_actor(actor),
                    ),
                    "cap": cap,
                    "scope": DEFAULT_SCOPE,
                    "namespace": namespace,
                    "fingerprint": fingerprint,
                },
                lock_timeout_ms=workflow_settings.LOCK_TIMEOUT_MS,
                savepoint=not owned,
            )
            if written.command_id is None:
                if not owned:
                    signal_record.roll_back()  # a lost race raised the count: undone
                if not written.raised:
                    raise WorkflowConflict(
                        f"the instance holds {cap} open signals (OPEN_SIGNALS_CAP); signal refused"
                    )
                raise _LostKeyRace  # owned: the atomic rolls the raised count back
            if not owned:
                signal_record.release()
            command_id = written.command_id
    except _LostKeyRace:
        # another transaction committed the key first; our writes rolled back
        earlier = dedup.find("SIGNAL", DEFAULT_SCOPE, namespace, dedup_key)
        assert earlier is not None
        return _replayed_signal(earlier, fingerprint, workflow_id, name)
    except DatabaseError as exc:
        raise db.translate(exc, "signal") from None
    return SignalReceipt(workflow_id, name, command_id, duplicate=False)


def _replayed_signal(
    earlier: tuple[Any, str, Any], fingerprint: str, workflow_id: uuid.UUID, name: str
) -> SignalReceipt:
    stored_workflow, stored, _ = earlier
    if stored != fingerprint or stored_workflow != workflow_id:
        raise WorkflowConflict("dedup key already used for a different signal")
    return SignalReceipt(workflow_id, name, None, duplicate=True)


def _emit_cancelled(row: Any, reason: str) -> None:
    """WORKFLOW_CANCELLED, in the cancel's transaction (a cancel runs no segment)."""
    from .side_effects import events as workflow_events

    if workflow_events.listening():
        workflow_events.emit(
            [
                workflow_events.EmitEvent(
                    workflow_events.WORKFLOW_CANCELLED,
                    row.current_step_id,
                    {"reason": reason[:255]},
                )
            ],
            row.id,
            None,
            row.definition_id,
            row.definition_version,
        )


def cancel(instance_id: Any, *, reason: str, actor: context.Actor | None = None) -> bool:
    """Cancel an instance and every open command of it; False when it had already ended.

    Its SCHEDULED timers (with their TIMER commands) and its OPEN and
    COMPLETING tasks are cancelled and its live branch tokens superseded in
    the same transaction, in lock order.

    Runs under the execution lock, so it waits for a running segment and the
    segment that comes after it finds the instance cancelled.
    """
    workflow_id = _uuid(instance_id)
    _require_key(reason, "reason")
    stored = context.stored_actor(actor)
    with _atomic():
        # the live children first, each under its own lock and before the
        # parent's: a child's end writes into the parent's queue, so no path
        # may hold the parent's rows while it waits for a child's lock
        for child in instances.children(workflow_id):
            if not child.ended:
                cancel(child.id, reason="the parent workflow was cancelled", actor=actor)
        try:
            commands.lock_instance(workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
            row = instances.get(workflow_id)
            if row is None:
                raise WorkflowNotFound("no workflow instance with that id")
            if row.ended:
                return False
            message = commands.error_text("CANCELLED", reason)
            # the lock order: timers (with their commands), tasks, instances, queues
            cancelled: list[dict[str, Any]] = []
            timers_store.cancel_all_for_instance(workflow_id, cancelled_commands=cancelled)
            tasks_store.cancel_open(workflow_id)
            live = branches_store.for_instance(workflow_id, live_only=True)
            if live:
                branches_store.supersede(workflow_id, [t.id for t in live])
            instances.mark_cancelled(workflow_id, message)
            cancelled.extend(commands.cancel_all(workflow_id))
            cancelled.sort(key=lambda c: c["id"])
            entries = [
                HistoryEntry(
                    "COMMAND_CANCELLED",
                    {
                        "commandId": c["id"],
                        "seq": c["seq"],
                        "kind": c["kind"],
                        **(
                            {"signal": str((c.get("target") or {}).get("name", ""))[:255]}
                            if c["kind"] == "SIGNAL"
                            else {}
                        ),
                    },
                    extra={"command_id": c["id"]},
                )
                for c in cancelled
            ]
            entries.append(
                HistoryEntry("WORKFLOW_CANCELLED", {"reason": reason[:255]}, outcome="CANCELLED")
            )
            history.append(workflow_id, entries, **stored.history_columns())
            _emit_cancelled(row, reason)
            notify_parent(row, "CANCELLED", None, "CANCELLED")
        except DatabaseError as exc:
            raise db.translate(exc, "cancel") from None
    return True


def get(instance_id: Any) -> InstanceView:
    """The current snapshot of an instance (``WorkflowNotFound`` when absent).

    Besides the row it reports the dead-lettered and parked command counts
    and, when the instance needs attention (FAILED, or dead letters), its
    last failure: step, reason code and when. A dead-lettered signal leaves
    the instance WAITING, so look at ``dead_commands`` (or
    ``needs_attention``), not only at ``status``. Signals sent to a FAILED
    instance are parked until a ``retry`` revives it.
    """
    row = instances.get(_uuid(instance_id))
    if row is None:
        raise WorkflowNotFound("no workflow instance with that id")
    dead, parked = commands.health(row.id)
    last = None
    if row.status == "FAILED" or dead:
        entry = history.last_failure(row.id)
        if entry is not None:
            reason, at, command_id = entry
            parsed = failures.parse(reason)
            last = Failure(parsed.code, parsed.step, at, reason, command_id)
    return InstanceView(
        id=row.id,
        definition_id=row.definition_id,
        definition_version=row.definition_version,
        status=row.status,
        current_step=row.current_step_id,
        state=row.state_json,
        business_key=row.business_key,
        scope=row.scope_key,
        error_type=row.error_type,
        error_message=row.error_message,
        version=row.version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        completed_at=row.completed_at,
        dead_commands=dead,
        parked_commands=parked,
        last_failure=last,
    )


def retry(
    instance_id: Any,
    *,
    actor: context.Actor | None = None,
    reason: str | None = None,
    idempotency_key: str | None = None,
    branch: tuple[str, str] | None = None,
) -> RetryReceipt:
    """Record a RETRY command: repair a FAILED instance and re-offer its dead letters.

    Joins the caller's transaction and runs nothing itself: the executor's
    RETRY segment supersedes a dead START and starts again from the START
    payload, resumes an instance failed by a command where it stood and runs
    that command again, re-drives an instance failed by a ``fail`` step, and
    offers every dead-lettered command again with fresh attempts (see
    docs/execution.md). Fix the cause first (deploy the code, restore the
    record): a retry re-runs the same code path.

    An instance that is neither FAILED nor holding dead letters is refused
    with ``WorkflowConflict``, as is an ended one. While a RETRY is still
    open, another call returns it (``duplicate=True``). ``idempotency_key``
    makes a repeat return the first receipt even after that retry ran; the
    same key for another instance or reason raises ``WorkflowConflict``.
    ``reason`` is stored as the actor's reason. Refusals write nothing.

    ``branch`` (``(fork_step_id, branch_id)``, as for :func:`signal`) retries
    one branch instead: a branch that failed terminally (its step's attempts
    spent, or an error never retried) runs its failed step again, its
    arrival taken back from the join, while the join has not decided; the
    instance need not be FAILED (an any or n-of-m join may still wait). The
    command settles STALE (``BRANCH_RETRY_STALE``) when the branch was
    superseded or completed, or its join has decided.
    """
    workflow_id = _uuid(instance_id)
    target = _branch_target(branch)
    if reason is not None:
        _require_key(reason, "reason")
    if idempotency_key is not None:
        _require_key(idempotency_key, "idempotency_key")
    fingerprint = _fingerprint(reason=reason, branch=branch)
    namespace = str(workflow_id)
    if idempotency_key is not None:
        earlier = dedup.find("RETRY", DEFAULT_SCOPE, namespace, idempotency_key)
        if earlier is not None:
            return _replayed_retry(earlier, fingerprint, workflow_id)
    stored = context.stored_actor(actor)
    if reason is not None and stored.reason is None:
        stored = dataclasses.replace(stored, reason=reason)
    try:
        with _atomic():
            commands.lock_instance(workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
            row = instances.get(workflow_id)
            if row is None:
                raise WorkflowNotFound("no workflow instance with that id")
            if row.ended:
                raise WorkflowConflict(f"the instance has ended ({row.status}); retry refused")
            has_dead, open_retry = commands.retry_needed(workflow_id)
            if target is None and row.status != "FAILED" and not has_dead:
                raise WorkflowConflict(
                    f"the instance is {row.status} with no dead-lettered command: nothing to retry"
                )
            if target is None and open_retry is not None:
                return RetryReceipt(workflow_id, open_retry, duplicate=True)
            command_id, _ = commands.insert(
                workflow_id, "RETRY", target=target, context=context.capture(), actor=stored
            )
            if row.archived_at is not None:
                retention_store.unarchive(workflow_id)  # a retried instance is live again
            if idempotency_key is not None and not dedup.claim(
                "RETRY",
                DEFAULT_SCOPE,
                namespace,
                idempotency_key,
                workflow_id,
                fingerprint,
                {"commandId": command_id},
            ):
                raise _LostKeyRace
    except _LostKeyRace:
        assert idempotency_key is not None
        earlier = dedup.find("RETRY", DEFAULT_SCOPE, namespace, idempotency_key)
        assert earlier is not None
        return _replayed_retry(earlier, fingerprint, workflow_id)
    except DatabaseError as exc:
        raise db.translate(exc, "retry") from None
    return RetryReceipt(workflow_id, command_id, duplicate=False)


def _branch_target(branch: Any) -> dict[str, str] | None:
    """The command target addressing ``branch`` (``(fork_step_id, branch_id)``), or None."""
    if branch is None:
        return None
    if (
        not isinstance(branch, tuple)
        or len(branch) != 2
        or not all(isinstance(part, str) and part for part in branch)
    ):
        raise WorkflowValidationError("branch must be a (fork_step_id, branch_id) pair")
    return {"forkStepId": branch[0], "branchId": branch[1]}


def _replayed_retry(
    earlier: tuple[Any, str, Any], fingerprint: str, workflow_id: uuid.UUID
) -> RetryReceipt:
    stored_workflow, stored, result = earlier
    if stored != fingerprint or stored_workflow != workflow_id:
        raise WorkflowConflict("idempotency key already used for a different retry")
    return RetryReceipt(
        workflow_id, int((db.load_json(result) or {}).get("commandId", 0)), duplicate=True
    )


def history_of(instance_id: Any) -> list[dict[str, Any]]:
    """Every history entry of an instance, in sequence order."""
    return history.entries(_uuid(instance_id))


def state_at(instance_id: Any, sequence: int) -> Any:
    """The state right after history entry ``sequence``, rebuilt from the decision log.

    Replays the last STATE_BASELINE up to that entry and the DECISION patches
    after it. Fields named in REDACTED_FIELDS were never logged, so they are
    absent from the result. Raises ``WorkflowNotFound`` when no decision log
    reaches that entry (an instance from before the log, or a bad sequence).
    """
    entries = history.decision_log(_uuid(instance_id), sequence)
    try:
        return replay(entries)
    except ValueError:
        raise WorkflowNotFound("no decision log reaches that history entry") from None


# -- human tasks (record side) ---------------------------------------------

TASK_COMPLETION = "TASK_COMPLETION"
TASK_REASSIGNMENT = "TASK_REASSIGNMENT"
TASK_PERMISSION = "vertique_workflow.change_workflowtask"


@dataclass(frozen=True)
class TaskView:
    """A read of a human task for views, the admin and ``can_complete``.

    ``decisions`` lists the declared decision names; ``reservation_command_id``
    is the COMPLETION command of a COMPLETING task.
    """

    id: uuid.UUID
    instance_id: uuid.UUID
    step_id: str
    name: str
    status: str
    assignee: str | None
    candidate_users: tuple[str, ...]
    candidate_groups: tuple[str, ...]
    decisions: tuple[str, ...]
    decision: str | None
    result: Any
    due_at: Any
    scope: str
    definition_id: str | None
    version: int
    reservation_command_id: int | None
    created_at: Any
    updated_at: Any
    completed_at: Any


@dataclass(frozen=True)
class TaskPage:
    """One page of ``tasks()``; pass ``next_cursor`` back for the next (None: last page)."""

    items: list[TaskView]
    next_cursor: str | None


@dataclass(frozen=True)
class TaskCompletionReceipt:
    """What ``complete_task`` returns: the COMPLETION command, or the earlier one for a replay.

    The task is COMPLETING once this commits; the executor's segment completes
    it and moves the workflow on, or rejects the command and reopens the task.
    """

    task_id: uuid.UUID
    instance_id: uuid.UUID
    decision: str
    command_id: int
    duplicate: bool


@dataclass(frozen=True)
class TaskReassignment:
    """What ``reassign_task`` returns (``duplicate``: a replay of an earlier call)."""

    task_id: uuid.UUID
    instance_id: uuid.UUID
    previous_assignee: str | None
    assignee: str | None
    duplicate: bool


def _task_uuid(value: Any) -> uuid.UUID:
    return _uuid(value, "no task with that id")


def _task_view(row: tasks_store.TaskRow) -> TaskView:
    return TaskView(
        id=row.id,
        instance_id=row.workflow_id,
        step_id=row.step_id,
        name=row.name,
        status=row.status,
        assignee=row.assignee,
        candidate_users=row.candidate_users,
        candidate_groups=row.candidate_groups,
        decisions=tasks_store.decision_names(row.decisions_snapshot),
        decision=row.decision,
        result=row.result,
        due_at=row.due_at,
        scope=row.scope_key,
        definition_id=row.definition_id,
        version=row.version,
        reservation_command_id=row.reservation_command_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        completed_at=row.completed_at,
    )


def get_task(task_id: Any) -> TaskView:
    """The current row of a human task (``WorkflowNotFound`` when absent)."""
    row = tasks_store.get(_task_uuid(task_id))
    if row is None:
        raise WorkflowNotFound("no task with that id")
    return _task_view(row)


def _refuse_task_state(row: tasks_store.TaskRow, what: str) -> None:
    if row.status == "COMPLETING":
        raise WorkflowConflict(f"the task is being completed; {what} refused")
    if row.status != "OPEN":
        raise WorkflowConflict(f"the task is {row.status}; {what} refused")
    if row.instance_status is not None and row.instance_status in instances.ENDED:
        raise WorkflowConflict(f"the instance has ended ({row.instance_status}); {what} refused")


def _check_decision(row: tasks_store.TaskRow, decision: str, payload: Any) -> None:
    declared = row.decisions_snapshot
    if decision not in declared:
        allowed = ", ".join(sorted(declared)) or "none"
        raise WorkflowValidationError(
            f"task {row.name[:64]!r} declares no decision {decision[:64]!r} (allowed: {allowed})"
        )
    schema = (declared.get(decision) or {}).get("payloadSchema")
    if schema is not None:
        payloads.check_schema(schema, payload, f"payload of decision {decision!r}")


def complete_task(
    task_id: Any,
    decision: str,
    payload: Any = None,
    *,
    idempotency_key: str,
    actor: context.Actor | None = None,
    subject_version: int | None = None,
) -> TaskCompletionReceipt:
    """Record the completion of a human task (the first of its two transactions).

    Joins the caller's transaction. Under the instance's execution lock it
    writes the dedup row, the COMPLETION command (decision, reviewed
    ``subject_version`` and actor in its target) and the OPEN -> COMPLETING
    reservation; the executor's segment then completes the task and moves
    the workflow on, or rejects the command and reopens the task.

    A committed ``idempotency_key`` (per task) answers its earlier receipt
    (``duplicate=True``) before any other check, whatever the decision and
    payload. The same key used by a concurrent call with another decision
    or payload, not yet committed when this call began, raises
    ``WorkflowConflict``; with the same ones it answers the other call's
    receipt. Refusals write nothing: ``WorkflowNotFound`` for an unknown task;
    ``WorkflowValidationError`` for an undeclared decision (the message lists
    the declared ones) or a payload failing the decision's schema (path and
    rule, never the value); ``WorkflowConflict`` for a task that is being
    completed (COMPLETING), completed or cancelled, or whose instance ended.
    Two users completing one task concurrently: one wins, the other gets
    ``WorkflowConflict``.
    """
    tid = _task_uuid(task_id)
    _require_key(decision, "decision")
    _require_key(idempotency_key, "idempotency_key")
    if subject_version is not None and (
        not isinstance(subject_version, int) or isinstance(subject_version, bool)
    ):
        raise WorkflowValidationError("subject_version must be an integer")
    namespace = str(tid)
    earlier = dedup.find(TASK_COMPLETION, DEFAULT_SCOPE, namespace, idempotency_key)
    if earlier is not None:
        return _replayed_completion(earlier, tid, None)
    _require_payload(payload, "the decision payload")
    fingerprint = _fingerprint(decision=decision, payload=payload, subject_version=subject_version)
    row = tasks_store.get(tid)
    if row is None:
        raise WorkflowNotFound("no task with that id")
    stored = context.stored_actor(actor)
    target = {
        "decision": decision,
        "subjectVersion": subject_version,
        "actor": None if actor is None else {"kind": stored.kind, "id": stored.id},
    }
    try:
        with _atomic():
            commands.lock_instance(row.workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
            # a racer of the same key that committed while we waited for the lock
            raced = dedup.find(TASK_COMPLETION, DEFAULT_SCOPE, namespace, idempotency_key)
            if raced is not None:
                raise _LostKeyRace
            locked = tasks_store.get(tid, lock=True)
            if locked is None:
                raise WorkflowNotFound("no task with that id")
            _refuse_task_state(locked, "completion")
            _check_decision(locked, decision, payload)
            command_id, _ = commands.insert(
                locked.workflow_id,
                "COMPLETION",
                payload=payload,
                dedup_key=idempotency_key,
                target=target,
                context=context.capture(),
                actor=stored,
                task_id=tid,
            )
            # the key after the command (its id is the stored result); a lost
            # race rolls both back (the savepoint)
            if not dedup.claim(
                TASK_COMPLETION,
                DEFAULT_SCOPE,
                namespace,
                idempotency_key,
                locked.workflow_id,
                fingerprint,
                {"decision": decision, "commandId": command_id},
            ):
                raise _LostKeyRace
            if not tasks_store.reserve(tid, command_id):
                raise WorkflowConflict("the task is being completed; completion refused")
    except _LostKeyRace:
        earlier = dedup.find(TASK_COMPLETION, DEFAULT_SCOPE, namespace, idempotency_key)
        assert earlier is not None
        return _replayed_completion(earlier, tid, fingerprint)
    except DatabaseError as exc:
        raise db.translate(exc, "complete_task") from None
    return TaskCompletionReceipt(tid, locked.workflow_id, decision, command_id, duplicate=False)


def _replayed_completion(
    earlier: tuple[Any, str, Any], task_id: uuid.UUID, fingerprint: str | None
) -> TaskCompletionReceipt:
    """A committed key answers its receipt; a racer's (``fingerprint`` given) must match it."""
    workflow_id, stored, result = earlier
    if fingerprint is not None and stored != fingerprint:
        raise WorkflowConflict("idempotency key already used for a different completion")
    result = db.load_json(result) or {}
    return TaskCompletionReceipt(
        task_id,
        workflow_id,
        str(result.get("decision", "")),
        int(result.get("commandId", 0)),
        duplicate=True,
    )


def reassign_task(
    task_id: Any,
    *,
    assignee: str | None,
    idempotency_key: str,
    actor: context.Actor | None = None,
) -> TaskReassignment:
    """Give an OPEN task another assignee (None: nobody), with a TASK_REASSIGNED entry.

    Joins the caller's transaction and runs under the instance's execution
    lock. The same ``idempotency_key`` (per task) with the same assignee
    answers the earlier result (``duplicate=True``); with another assignee it
    raises ``WorkflowConflict``. A task that is being completed (COMPLETING),
    completed or cancelled, or whose instance ended, raises
    ``WorkflowConflict``; an unknown task ``WorkflowNotFound``. Refusals
    write nothing.
    """
    tid = _task_uuid(task_id)
    if assignee is not None:
        _require_key(assignee, "assignee")
    _require_key(idempotency_key, "idempotency_key")
    namespace = str(tid)
    fingerprint = _fingerprint(assignee=assignee)
    earlier = dedup.find(TASK_REASSIGNMENT, DEFAULT_SCOPE, namespace, idempotency_key)
    if earlier is not None:
        return _replayed_reassignment(earlier, tid, fingerprint)
    row = tasks_store.get(tid)
    if row is None:
        raise WorkflowNotFound("no task with that id")
    stored = context.stored_actor(actor)
    try:
        with _atomic():
            commands.lock_instance(row.workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
            if dedup.find(TASK_REASSIGNMENT, DEFAULT_SCOPE, namespace, idempotency_key):
                raise _LostKeyRace
            locked = tasks_store.get(tid, lock=True)
            if locked is None:
                raise WorkflowNotFound("no task with that id")
            _refuse_task_state(locked, "reassignment")
            result = {"from": locked.assignee, "to": assignee}
            if not dedup.claim(
                TASK_REASSIGNMENT,
                DEFAULT_SCOPE,
                namespace,
                idempotency_key,
                locked.workflow_id,
                fingerprint,
                result,
            ):
                raise _LostKeyRace
            outcome = tasks_store.reassign(tid, assignee)
            if outcome != "REASSIGNED":  # the row lock makes this unreachable
                raise WorkflowConflict(f"the task is {outcome}; reassignment refused")
            history.append(
                locked.workflow_id,
                [
                    HistoryEntry(
                        "TASK_REASSIGNED",
                        {"taskId": str(tid), "from": locked.assignee, "to": assignee},
                        step_id=locked.step_id,
                    )
                ],
                **stored.history_columns(),
            )
    except _LostKeyRace:
        earlier = dedup.find(TASK_REASSIGNMENT, DEFAULT_SCOPE, namespace, idempotency_key)
        assert earlier is not None
        return _replayed_reassignment(earlier, tid, fingerprint)
    except DatabaseError as exc:
        raise db.translate(exc, "reassign_task") from None
    return TaskReassignment(tid, locked.workflow_id, locked.assignee, assignee, duplicate=False)


def _replayed_reassignment(
    earlier: tuple[Any, str, Any], task_id: uuid.UUID, fingerprint: str
) -> TaskReassignment:
    workflow_id, stored, result = earlier
    if stored != fingerprint:
        raise WorkflowConflict("idempotency key already used for a different reassignment")
    result = db.load_json(result) or {}
    return TaskReassignment(
        task_id, workflow_id, result.get("from"), result.get("to"), duplicate=True
    )


def tasks(
    *,
    assignee: str | None = None,
    candidate_user: str | None = None,
    candidate_groups: list[str] | tuple[str, ...] | None = None,
    status: str | list[str] | tuple[str, ...] | None = None,
    definition_id: str | None = None,
    scope: str | None = None,
    due_before: Any = None,
    include_archived: bool = False,
    limit: int = 50,
    cursor: str | None = None,
) -> TaskPage:
    """Human tasks, newest change first, one keyset page at a time.

    Every filter given must hold: ``assignee`` exactly, ``candidate_user``
    named among the candidate users, ``candidate_groups`` any of them among
    the candidate groups, ``status`` one status or several, the instance's
    ``definition_id``, ``scope`` exactly (None: every scope; a filter, not an
    authorization boundary), ``due_before`` a due date before that instant.
    Tasks of archived instances are hidden unless ``include_archived``.
    ``limit`` is bounded to 1..500. ``cursor`` is the ``next_cursor`` of the
    previous page; a cursor this API did not write raises
    ``WorkflowValidationError``.
    """
    statuses = [status] if isinstance(status, str) else status
    if candidate_groups is not None and isinstance(candidate_groups, str):
        candidate_groups = [candidate_groups]
    try:
        page = tasks_store.query(
            assignee=assignee,
            candidate_user=candidate_user,
            candidate_groups=candidate_groups,
            statuses=statuses,
            definition_id=definition_id,
            scope=scope,
            due_before=due_before,
            include_archived=include_archived,
            limit=limit,
            cursor=cursor,
        )
    except ValueError:
        raise WorkflowValidationError("the cursor is not a task cursor") from None
    return TaskPage([_task_view(r) for r in page.rows], page.next_cursor)


def can_complete(user: Any, task: Any) -> bool:
    """Whether a Django user may complete (or act on) a task: the admin's rule.

    True for an active, authenticated user who is the task's assignee, one of
    its candidate users, a member of one of its candidate groups
    (``user.groups``), or holds the model permission
    ``vertique_workflow.change_workflowtask`` (superusers hold every
    permission). Anonymous and inactive users: False. ``task`` is a
    ``TaskView``, a store row or a task id (an unknown id: False). Names
    compare with ``user.get_username()``. It does not look at the status.
    """
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if not getattr(user, "is_active", False):
        return False
    if not isinstance(task, (TaskView, tasks_store.TaskRow)):
        try:
            task = tasks_store.get(_task_uuid(task))
        except WorkflowNotFound:
            return False
        if task is None:
            return False
    name = user.get_username()
    if task.assignee is not None and task.assignee == name:
        return True
    if name in task.candidate_users:
        return True
    groups = getattr(user, "groups", None)  # a custom user model may have none
    if (
        task.candidate_groups
        and groups is not None
        and groups.filter(name__in=task.candidate_groups).exists()
    ):
        return True
    has_perm = getattr(user, "has_perm", None)
    return bool(has_perm is not None and has_perm(TASK_PERMISSION))


# -- branches (read side) ----------------------------------------------------


@dataclass(frozen=True)
class BranchView:
    """A read of one branch token for the admin and tools.

    ``fork_step_id`` is the fork step; ``fork_key`` the stored key, which for
    a fork nested in a branch is ``"<fork step>@<parent token id>"`` and then
    names the parent branch in ``parent_token_id``. ``state`` is the branch's
    own state, ``item`` its fan-out item (None for a fixed branch).
    """

    token_id: uuid.UUID
    instance_id: uuid.UUID
    fork_step_id: str
    fork_key: str
    parent_token_id: uuid.UUID | None
    branch_id: str
    status: str
    current_step: str | None
    state: Any
    item: Any
    created_at: Any
    updated_at: Any


def branches(instance_id: Any) -> list[BranchView]:
    """Every branch token of an instance, by fork then creation order (``WorkflowNotFound``).

    Reads without locks; the durable context captured at the fork is not shown.
    """
    wid = _uuid(instance_id)
    if instances.get(wid) is None:
        raise WorkflowNotFound("no workflow instance with that id")
    views = []
    for row in branches_store.for_instance(wid):
        fork_step, parent = branches_store.split_key(row.fork_step_id)
        views.append(
            BranchView(
                token_id=row.id,
                instance_id=row.workflow_id,
                fork_step_id=fork_step,
                fork_key=row.fork_step_id,
                parent_token_id=parent,
                branch_id=row.branch_id,
                status=row.status,
                current_step=row.current_step_id,
                state=row.state,
                item=row.item,
                created_at=row.created_at,
                updated_at=row.updated_at,
            )
        )
    return views


def notify_parent(child: Any, status: str, state: Any, error_type: str | None) -> None:
    """Record a child's end on the parent that started it (``call``), deduplicated.

    Runs in the transaction that ended the child: a SIGNAL command of the
    reserved name ``vertique.child_ended`` on the parent, addressed to the
    call step (and its branch), with the child's status and final state; its
    dedup key is the child's id and status, so a child that ends twice the
    same way (a retried failure) is recorded once. A child without a parent,
    or whose parent has ended, records nothing.
    """
    from .engine.events import CHILD_ENDED

    parent = (child.metadata or {}).get("parent") if child.metadata else None
    if not parent:
        return
    parent_id = _uuid(parent["id"])
    parent_row = instances.get(parent_id)
    if parent_row is None or parent_row.ended:
        return
    key = f"{CHILD_ENDED}:{child.id}:{status}"
    if dedup.find("SIGNAL", DEFAULT_SCOPE, str(parent_id), key) is not None:
        return
    target = {k: v for k, v in parent.items() if k != "id"}
    target.update(name=CHILD_ENDED, childId=str(child.id))
    payload = {"childId": str(child.id), "status": status, "state": state, "errorType": error_type}
    commands.raise_open_signals(parent_id, 2**31 - 1)
    command_id, _ = commands.insert(
        parent_id,
        "SIGNAL",
        payload=payload,
        dedup_key=key,
        target=target,
        actor=context.stored_actor(context.Actor.system("workflow", reason="child ended")),
    )
    dedup.claim(
        "SIGNAL", DEFAULT_SCOPE, str(parent_id), key, parent_id, key, {"commandId": command_id}
    )


def record_service_result(
    call: Any, status: str, result: Any, error: str | None, attempts: int
) -> bool:
    """Record a service call's outcome on its instance as a deduplicated signal (the relay).

    Runs in the relay's delivery transaction: under the instance's execution
    lock, a SIGNAL command of the reserved name ``vertique.service_result``
    addressed to the service step (and its branch), its dedup key the
    dispatch key -- so a result delivered twice (a relay that died after
    recording, a duplicate from a task backend) is recorded once. Returns
    False when nothing was recorded: a duplicate, or an instance that has
    ended (the call is cancelled then).
    """
    from .engine.events import SERVICE_RESULT

    workflow_id = _uuid(call.workflow_id)
    key = call.dispatch_key
    namespace = str(workflow_id)
    if dedup.find("SIGNAL", DEFAULT_SCOPE, namespace, key) is not None:
        return False
    commands.lock_instance(workflow_id, workflow_settings.LOCK_TIMEOUT_MS)
    row = instances.get(workflow_id)
    if row is None or row.ended:
        return False
    if not dedup.claim(
        "SIGNAL", DEFAULT_SCOPE, namespace, key, workflow_id, key, {"stepId": call.step_id}
    ):
        return False
    target: dict[str, Any] = {
        "name": SERVICE_RESULT,
        "stepId": call.step_id,
        "dispatchKey": key,
    }
    if call.branch_token_id is not None:
        target.update(
            branchTokenId=str(call.branch_token_id),
            forkStepId=call.fork_step_id,
            branchId=call.branch_id,
        )
    payload = {"status": status, "result": result, "error": error, "attempts": attempts}
    commands.raise_open_signals(workflow_id, 2**31 - 1)
    commands.insert(
        workflow_id,
        "SIGNAL",
        payload=payload,
        dedup_key=key,
        target=target,
        context=call.context,
        actor=context.stored_actor(
            context.Actor.system("workflow", reason=f"service {call.handler}"[:255])
        ),
    )
    return True


def children(instance_id: Any) -> list[InstanceView]:
    """The child workflows ``call`` steps of ``instance_id`` started, oldest first.

    Each is the child's snapshot (``get``); ``WorkflowNotFound`` for an
    unknown parent.
    """
    workflow_id = _uuid(instance_id)
    if instances.get(workflow_id) is None:
        raise WorkflowNotFound("no workflow instance with that id")
    return [get(child.id) for child in instances.children(workflow_id)]


__all__ = [
    "BranchView",
    "Failure",
    "InstanceRef",
    "InstanceView",
    "RetryReceipt",
    "SignalReceipt",
    "TaskCompletionReceipt",
    "TaskPage",
    "TaskReassignment",
    "TaskView",
    "branches",
    "can_complete",
    "cancel",
    "children",
    "complete_task",
    "get",
    "get_task",
    "history_of",
    "reassign_task",
    "record_service_result",
    "retry",
    "signal",
    "start",
    "state_at",
    "tasks",
]
