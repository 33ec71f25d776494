"""The Django Tasks recorder: service dispatches enqueued through Django's Tasks framework.

An alternative to the service outbox (install one or the other as the
``service`` recorder in ``VERTIQUE_WORKFLOW["RECORDERS"]``): the recorder
asks ``transaction.on_commit`` (on the workflow database alias) to enqueue
``deliver_service_call`` with plain JSON arguments, so a rolled-back segment
enqueues nothing. The task calls the handler with the relay's
classification (``relay.call_handler``) and records the outcome with
``operations.record_service_result`` in a transaction, its dedup key the
dispatch key: a task delivered twice advances the workflow once.

The trade-off against the outbox: ``on_commit`` is not transactional. A
process that dies between the commit and the enqueue loses the call; the
instance then waits at its service step until an operator acts. The outbox
has no such window (its row commits with the transition).

Retries follow the step's policy: the task enqueues itself again with
``run_after`` = the backoff when the backend supports deferring
(``supports_defer``); otherwise it waits the backoff inline, in the worker,
and calls again.

Django 6.0+ ships ``django.tasks``; on Django 5.2 install the backport
(``pip install vertique-workflow[tasks]``, module ``django_tasks``).
"""

from __future__ import annotations

import datetime
import importlib
import json
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .. import failures
from ..conf import workflow_settings
from .recorders import RecordBatch
from .relay import ATTEMPTS_EXHAUSTED, HANDLER_FAILED, Dispatch, call_handler

__all__ = ["DjangoTasksRecorder", "deliver_service_call", "framework"]

logger = logging.getLogger("vertique_workflow.relay")

MISSING_FRAMEWORK = (
    "the Django Tasks recorder needs Django's Tasks framework: Django 6.0+ ships "
    "django.tasks; on Django 5.2 install the backport (pip install 'vertique-workflow[tasks]', "
    "module django_tasks)"
)

# the inline backoff of a backend that cannot defer (tests replace it to observe the delays)
sleep: Callable[[float], None] = time.sleep


def framework() -> ModuleType | None:
    """``django.tasks`` (Django 6.0+) or the backport ``django_tasks``, or None."""
    for name in ("django.tasks", "django_tasks"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def deliver_service_call(
    workflow_id: str,
    step_id: str,
    dispatch_key: str,
    handler: str,
    request: Any,
    policy: dict[str, Any],
    attempt: int = 1,
    branch_token_id: str | None = None,
    fork_step_id: str | None = None,
    branch_id: str | None = None,
    context: dict[str, Any] | None = None,
) -> str:
    """The task: call the handler (retrying by the step's policy), then record the outcome.

    Returns what happened (``DELIVERED``, ``FAILED``, ``DUPLICATE`` when the
    instance already had this result or has ended, ``DEFERRED`` when a retry
    was enqueued).
    """
    from ..executor.backoff import Effective

    args = {
        "workflow_id": workflow_id,
        "step_id": step_id,
        "dispatch_key": dispatch_key,
        "handler": handler,
        "request": request,
        "policy": policy,
        "branch_token_id": branch_token_id,
        "fork_step_id": fork_step_id,
        "branch_id": branch_id,
        "context": context,
    }
    max_attempts = int(policy.get("attempts", 1))
    initial = int(policy.get("backoffMs", 1000))
    backoff = Effective(max_attempts, initial, int(policy.get("maxBackoffMs", initial)))
    while True:
        dispatch = Dispatch(
            workflow_id,
            step_id,
            dispatch_key,
            handler,
            request,
            policy,
            attempt,
            fork_step_id,
            branch_id,
        )
        outcome = call_handler(dispatch)
        if outcome.status != "RETRY" or attempt >= max_attempts:
            break
        delay = backoff.delay_seconds(attempt)
        attempt += 1
        task = _task_using(delay)
        if task is not None:
            task.enqueue(**args, attempt=attempt)
            return "DEFERRED"
        sleep(delay)  # the backend cannot defer: wait in the worker
    if outcome.status == "COMPLETED":
        status, result, error = "COMPLETED", outcome.result, None
    else:
        code = outcome.code or HANDLER_FAILED
        if outcome.status == "RETRY":  # attempts spent
            code = ATTEMPTS_EXHAUSTED if code == HANDLER_FAILED else code
        status, result = "FAILED", None
        error = failures.text(code, f"attempt {attempt} of {max_attempts}: {outcome.sentence}")
    recorded = _record(args, status, result, error, attempt)
    logger.info(
        "service %s for %s step %s (task): %s (attempt %s)",
        handler,
        workflow_id,
        step_id,
        status if recorded else "DUPLICATE",
        attempt,
    )
    if not recorded:
        return "DUPLICATE"
    return "DELIVERED" if status == "COMPLETED" else "FAILED"


class _Call:
    """What ``operations.record_service_result`` reads of a call, from the task's arguments."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.workflow_id = args["workflow_id"]
        self.step_id = args["step_id"]
        self.dispatch_key = args["dispatch_key"]
        self.handler = args["handler"]
        self.branch_token_id = args["branch_token_id"]
        self.fork_step_id = args["fork_step_id"]
        self.branch_id = args["branch_id"]
        self.context = args["context"]


def _record(args: dict[str, Any], status: str, result: Any, error: str | None, n: int) -> bool:
    from django.db import transaction

    from ..operations import record_service_result
    from ..store import db

    with transaction.atomic(using=db.alias()):
        return record_service_result(_Call(args), status, result, error, n)


# the module attribute is the Task itself (workers import it by its function's path)
_framework = framework()
deliver_service_call = (  # type: ignore[assignment]
    None if _framework is None else _framework.task(deliver_service_call)
)


def _task_using(delay_seconds: float) -> Any:
    """The task deferred by ``delay_seconds``, or None when its backend cannot defer."""
    task = _configured_task()
    if not task.get_backend().supports_defer:
        return None
    from django.utils import timezone

    return task.using(run_after=timezone.now() + datetime.timedelta(seconds=delay_seconds))


def _configured_task() -> Any:
    if deliver_service_call is None:
        raise ImproperlyConfigured(MISSING_FRAMEWORK)
    return deliver_service_call.using(
        backend=workflow_settings.SERVICE_TASK_BACKEND,
        queue_name=workflow_settings.SERVICE_TASK_QUEUE,
    )


class DjangoTasksRecorder:
    """Records ``service`` dispatches as Django tasks enqueued when the segment commits."""

    kind = "service"

    def __init__(self) -> None:
        if deliver_service_call is None:
            raise ImproperlyConfigured(f"VERTIQUE_WORKFLOW['RECORDERS']: {MISSING_FRAMEWORK}")

    def record(self, batch: RecordBatch) -> None:
        from django.db import transaction

        from ..store import db

        calls = [json.loads(json.dumps(row, default=str)) for row in batch.dispatches()]

        def enqueue() -> None:
            task = _configured_task()
            for kwargs in calls:
                task.enqueue(**kwargs)

        transaction.on_commit(enqueue, using=db.alias())
