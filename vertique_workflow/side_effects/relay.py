"""The relay: calls service handlers for the outbox's dispatches and records the outcomes.

``Relay.run_once`` claims due dispatches (``SKIP LOCKED``: relays on several
nodes share the work), calls each handler with no transaction open, bounded
by its step's timeout, and then, in one short transaction, records the
outcome on the instance as a deduplicated signal and settles the row with a
statement fenced by its claim. A failed call is retried by the step's
policy (``attempts``, ``backoff``, ``retry_on``) -- the row goes back to
PENDING with its backoff -- and a final failure is delivered like a
success, with its reason code, so the workflow takes its failure path.

Crash safety: the call happens at least once. A relay killed between the
call and the recording leaves its row CLAIMED; when the lease passes (the
step's timeout plus ``RELAY_LEASE_MARGIN_SECONDS``) another relay calls the
handler again with the same dispatch key, and the dedup key of the result
signal makes the workflow advance once. A hung handler is abandoned at its
timeout (its thread is a daemon; Python cannot stop it) and counts as a
failed attempt, ``HANDLER_TIMEOUT``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, connections, transaction
from django.utils.module_loading import import_string

from .. import failures
from ..conf import workflow_settings
from ..exceptions import NonRetryable
from ..executor.backoff import Effective
from .handlers import ServiceCall, get_handler

__all__ = ["Dispatch", "Relay", "RelayStats", "call_handler", "deliver"]

logger = logging.getLogger("vertique_workflow.relay")

HANDLER_FAILED = "HANDLER_FAILED"
HANDLER_TIMEOUT = "HANDLER_TIMEOUT"
HANDLER_NOT_REGISTERED = "HANDLER_NOT_REGISTERED"
RESULT_NOT_JSON = "SERVICE_RESULT_NOT_JSON"
ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"


class _Timeout(Exception):
    pass


@dataclass
class RelayStats:
    """What a relay did (``workflow_relay`` prints it; tests read it)."""

    called: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


@dataclass(frozen=True)
class Attempt:
    """One call's result: ``status`` COMPLETED, RETRY or FAILED, the result or the reason code."""

    status: str
    result: Any = None
    code: str | None = None
    sentence: str = ""


def _retryable(exc: BaseException, names: list[str]) -> bool:
    for name in names or ["builtins.Exception"]:
        try:
            cls = import_string(name)
        except ImportError:
            continue
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


@dataclass(frozen=True)
class Dispatch:
    """What one handler call needs: filled from an outbox row or from a task's JSON arguments.

    ``attempt`` counts from 1. The relay and the Django Tasks recorder share
    ``call_handler`` through it, so both classify a handler's end the same way.
    """

    workflow_id: Any
    step_id: str
    dispatch_key: str
    handler: str
    request: Any
    policy: dict[str, Any]
    attempt: int
    fork_step_id: str | None = None
    branch_id: str | None = None

    @classmethod
    def of(cls, claimed: Any) -> Dispatch:
        """The dispatch of a claimed outbox row (``store.outbox.ClaimedCall``)."""
        return cls(
            claimed.workflow_id,
            claimed.step_id,
            claimed.dispatch_key,
            claimed.handler,
            claimed.request,
            claimed.policy or {},
            claimed.attempts,
            claimed.fork_step_id,
            claimed.branch_id,
        )


def call_handler(claimed: Dispatch) -> Attempt:
    """Call the handler of a dispatch once, bounded by its timeout; classify the end."""
    policy = claimed.policy or {}
    timeout = float(policy.get("timeoutMs", 30000)) / 1000.0
    max_attempts = int(policy.get("attempts", 1))
    handler = get_handler(claimed.handler)
    if handler is None:
        return Attempt(
            "RETRY", code=HANDLER_NOT_REGISTERED, sentence="no handler of that name on this node"
        )
    call = ServiceCall(
        claimed.dispatch_key,
        claimed.workflow_id,
        claimed.step_id,
        claimed.attempt,
        max_attempts,
        timeout,
        claimed.fork_step_id,
        claimed.branch_id,
    )
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = handler(claimed.request, call)
        except BaseException as exc:  # reported to the relay's thread
            box["error"] = exc
        finally:
            connections.close_all()  # the handler's own ORM connections, if any

    worker = threading.Thread(target=run, name=f"service:{claimed.handler}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        logger.warning(
            "service handler %s for %s step %s did not return within %.1f s (attempt %s)",
            claimed.handler,
            claimed.workflow_id,
            claimed.step_id,
            timeout,
            claimed.attempt,
        )
        return Attempt("RETRY", code=HANDLER_TIMEOUT, sentence=f"no result within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, NonRetryable):
            return Attempt("FAILED", code=exc.reason_code, sentence="the handler refused the call")
        logger.warning(
            "service handler %s for %s step %s raised (attempt %s)",
            claimed.handler,
            claimed.workflow_id,
            claimed.step_id,
            claimed.attempt,
            exc_info=exc,
        )
        if isinstance(exc, Exception) and _retryable(exc, policy.get("retryOn") or []):
            return Attempt("RETRY", code=HANDLER_FAILED, sentence=type(exc).__name__)
        return Attempt("FAILED", code=HANDLER_FAILED, sentence=type(exc).__name__)
    result = box.get("result")
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        return Attempt("FAILED", code=RESULT_NOT_JSON, sentence="the result is not JSON")
    if result is not None and not isinstance(result, dict):
        return Attempt("FAILED", code=RESULT_NOT_JSON, sentence="the result is not a JSON object")
    return Attempt("COMPLETED", result=result)


def deliver(claimed: Any, status: str, result: Any, error: str | None) -> bool:
    """Record the outcome on the instance and settle the row, in one transaction.

    False when the claim was lost (another relay took the row after our
    lease passed): nothing is written, the other relay delivers.
    """
    from ..operations import record_service_result
    from ..store import db, outbox

    with transaction.atomic(using=db.alias()):
        recorded = record_service_result(claimed, status, result, error, claimed.attempts)
        state = "DELIVERED" if recorded else "CANCELLED"
        stored_error = error
        if not recorded and error is None:
            stored_error = failures.text(
                "RESULT_NOT_RECORDED", "the instance has ended or already had this result"
            )
        if not outbox.settle(claimed, state=state, outcome=status, error=stored_error):
            transaction.set_rollback(True, using=db.alias())
            return False
    return True


class Relay:
    """Claims and serves dispatches: ``run_once`` for one batch, ``run`` until stopped."""

    def __init__(
        self,
        node_id: str,
        *,
        batch: int | None = None,
        concurrency: int | None = None,
        lease_margin_seconds: float | None = None,
    ) -> None:
        self.node_id = node_id
        self.batch = batch or int(workflow_settings.RELAY_BATCH)
        self.concurrency = concurrency or int(workflow_settings.RELAY_CONCURRENCY)
        self.lease_margin = (
            lease_margin_seconds
            if lease_margin_seconds is not None
            else float(workflow_settings.RELAY_LEASE_MARGIN_SECONDS)
        )
        self.stats = RelayStats()
        self._wake = threading.Event()
        self._stats_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> int:
        """Claim one batch and serve it; returns how many dispatches were claimed."""
        from ..store import outbox

        claimed = outbox.claim(self.batch, uuid.uuid4(), self.node_id, self.lease_margin)
        if not claimed:
            return 0
        if len(claimed) == 1 or self.concurrency == 1:
            for one in claimed:
                self.serve(one)
        else:
            # the pool's threads keep their connections between batches: a new
            # connection per call would cost more than the call's own statements
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="relay")
            list(self._pool.map(self.serve, claimed))
        return len(claimed)

    def close(self) -> None:
        """Stop the pool and close the connections its threads opened."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        barrier = threading.Barrier(self.concurrency, timeout=5)

        def close_connections() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()  # one call per thread: each closes its own
            connections.close_all()

        for _ in range(self.concurrency):
            pool.submit(close_connections)
        pool.shutdown(wait=True)

    def serve(self, claimed: Any) -> str:
        """Call one claimed dispatch's handler and settle it; returns what happened."""
        from ..store import outbox

        attempt = call_handler(Dispatch.of(claimed))
        policy = claimed.policy or {}
        max_attempts = int(policy.get("attempts", 1))
        with self._stats_lock:
            self.stats.called += 1
        if attempt.status == "RETRY" and claimed.attempts < max_attempts:
            initial = int(policy.get("backoffMs", 1000))
            backoff = Effective(max_attempts, initial, int(policy.get("maxBackoffMs", initial)))
            delay_ms = int(backoff.delay_seconds(claimed.attempts) * 1000)
            error = failures.text(
                attempt.code or HANDLER_FAILED,
                f"attempt {claimed.attempts} of {max_attempts}: {attempt.sentence}",
            )
            outcome = "RETRIED" if outbox.retry_later(claimed, delay_ms, error) else "LOST"
        elif attempt.status == "COMPLETED":
            outcome = "DELIVERED" if deliver(claimed, "COMPLETED", attempt.result, None) else "LOST"
        else:
            code = attempt.code or HANDLER_FAILED
            if attempt.status == "RETRY":  # attempts spent
                code = ATTEMPTS_EXHAUSTED if code == HANDLER_FAILED else code
            error = failures.text(
                code, f"attempt {claimed.attempts} of {max_attempts}: {attempt.sentence}"
            )
            outcome = "FAILED" if deliver(claimed, "FAILED", None, error) else "LOST"
        with self._stats_lock:
            self.stats.count(outcome)
            if outcome == "DELIVERED":
                self.stats.delivered += 1
            elif outcome == "RETRIED":
                self.stats.retried += 1
            elif outcome == "FAILED":
                self.stats.failed += 1
            else:
                self.stats.lost += 1
        logger.info(
            "service %s for %s step %s: %s (attempt %s)",
            claimed.handler,
            claimed.workflow_id,
            claimed.step_id,
            outcome,
            claimed.attempts,
        )
        return outcome

    def run(
        self,
        stop: threading.Event,
        *,
        poll_interval: float | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """Serve until ``stop`` is set; sleeps until woken, a dispatch is due, or the poll."""
        from ..store import outbox

        interval = (
            poll_interval
            if poll_interval is not None
            else workflow_settings.POLL_INTERVAL_MS / 1000.0
        )
        from . import outbox as recorder_module

        recorder_module._wake_callbacks.append(self.wake)
        try:
            while not stop.is_set():
                try:
                    served = self.run_once()
                    if served:
                        continue
                    delay = outbox.next_delay_ms()
                except Exception:
                    logger.exception("relay %s: claim failed; retrying", self.node_id)
                    close_old_connections()
                    served, delay = 0, None
                if on_idle is not None:
                    on_idle()
                wait = interval if delay is None else min(interval, max(delay / 1000.0, 0.01))
                self._wake.wait(wait)
                self._wake.clear()
        finally:
            recorder_module._wake_callbacks.remove(self.wake)
            self.close()
            close_old_connections()
