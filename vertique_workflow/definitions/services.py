"""The definition side of a ``service`` step: what it calls, how, and where the outcome leads.

A ``ServiceSpec`` is plain, frozen data compiled by the DSL (``service(...)``)
and the document loader alike. The step records a dispatch in the service
outbox (in the segment's transaction) and waits; a relay calls the handler
*outside* any workflow transaction, at least once, with the dispatch key as
idempotency key, retrying by ``attempts`` / ``backoff`` / ``retry_on``;
the outcome comes back as a deduplicated signal. Use an ``action`` for work
that belongs to the transition (ORM writes that must commit with it) and a
``service`` for a call to the outside world (an HTTP API, a payment
provider): an action runs again on every retry of its segment, a service
call is recorded once and delivered once.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import WorkflowDefinitionError
from ..payloads import json_copy
from .durations import parse_duration
from .names import callable_name
from .tasks import call_with_state

__all__ = [
    "DEFAULT_SERVICE_ATTEMPTS",
    "DEFAULT_SERVICE_BACKOFF",
    "DEFAULT_SERVICE_MAX_BACKOFF",
    "DEFAULT_SERVICE_TIMEOUT",
    "ServiceOutcome",
    "ServiceSpec",
    "service_request",
]

DEFAULT_SERVICE_TIMEOUT = datetime.timedelta(seconds=30)
DEFAULT_SERVICE_ATTEMPTS = 5
DEFAULT_SERVICE_BACKOFF = datetime.timedelta(seconds=1)
DEFAULT_SERVICE_MAX_BACKOFF = datetime.timedelta(minutes=5)
MAX_SERVICE_ATTEMPTS = 1000


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class ServiceSpec:
    """What a ``service`` step calls and where its outcome leads.

    - ``handler``: the name a handler was registered under
      (``vertique_workflow.service_handler``); checked at startup.
    - ``request``: a callable ``(state)`` / ``(state, ctx)`` returning the
      handler's request (a JSON object); without it the request is the state's JSON.
    - ``result``: a callable ``(state, outcome, ctx) -> state`` folding the
      ``ServiceOutcome`` into the state (on success and on failure); without
      it the state is unchanged.
    - ``on_failed``: where the workflow goes when the call failed for good
      (attempts spent, an error ``retry_on`` does not name, a result failing
      ``result_schema``); without it the instance fails ``SERVICE_FAILED``
      (in a branch: the branch fails and its join decides).
    - ``timeout``: bound of one handler call; ``attempts``: calls at most;
      ``backoff`` / ``max_backoff``: the wait after the n-th failed call is
      ``min(max_backoff, backoff * 2**(n-1))``; ``retry_on``: exception
      classes that are retried (default: every ``Exception``; a handler's
      ``NonRetryable`` never is).
    - ``result_schema``: a JSON Schema the handler's result must satisfy.
    """

    handler: str
    request: Callable[..., Any] | None = None
    result: Callable[..., Any] | None = None
    on_failed: str | None = None
    timeout: datetime.timedelta | str = DEFAULT_SERVICE_TIMEOUT
    attempts: int = DEFAULT_SERVICE_ATTEMPTS
    backoff: datetime.timedelta | str = DEFAULT_SERVICE_BACKOFF
    max_backoff: datetime.timedelta | str = DEFAULT_SERVICE_MAX_BACKOFF
    retry_on: tuple[type[BaseException], ...] = field(default=(Exception,))
    result_schema: Mapping[str, Any] | None = None
    request_name: str | None = None
    result_name: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in ("timeout", "backoff", "max_backoff"):
            try:
                put(self, name, parse_duration(getattr(self, name)))
            except WorkflowDefinitionError as exc:
                raise WorkflowDefinitionError(f"service {name}: {exc}") from None
        if self.request is not None and self.request_name is None:
            put(self, "request_name", callable_name(self.request))
        if self.result is not None and self.result_name is None:
            put(self, "result_name", callable_name(self.result))
        retry_on = self.retry_on
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
        put(self, "retry_on", tuple(retry_on))

    @property
    def timeout_ms(self) -> int:
        return int(self.timeout.total_seconds() * 1000)  # type: ignore[union-attr]

    def policy(self) -> dict[str, Any]:
        """The relay's policy for this step, stored with each dispatch (the relay needs no plan)."""
        return {
            "attempts": self.attempts,
            "timeoutMs": self.timeout_ms,
            "backoffMs": int(self.backoff.total_seconds() * 1000),  # type: ignore[union-attr]
            "maxBackoffMs": int(self.max_backoff.total_seconds() * 1000),  # type: ignore[union-attr]
            "retryOn": sorted(_class_name(cls) for cls in self.retry_on),
        }

    def canonical(self) -> dict[str, Any]:
        """The hashed structure: handler, transitions and policy, callables by name."""
        data: dict[str, Any] = {"handler": self.handler, **self.policy()}
        if self.on_failed is not None:
            data["on_failed"] = self.on_failed
        if self.request is not None:
            data["request_name"] = self.request_name
        if self.result is not None:
            data["result_name"] = self.result_name
        if self.result_schema is not None:
            data["result_schema"] = dict(self.result_schema)
        return data


@dataclass(frozen=True)
class ServiceOutcome:
    """How a service call ended, as a step's ``result`` callable sees it.

    ``status`` is ``"COMPLETED"`` or ``"FAILED"``; ``result`` the handler's
    JSON result (None on failure); ``error`` the failure as stored text,
    ``CODE: sentence``, the code one of ``HANDLER_FAILED``, ``HANDLER_TIMEOUT``,
    ``ATTEMPTS_EXHAUSTED``, ``HANDLER_NOT_REGISTERED``, ``SERVICE_RESULT_NOT_JSON``,
    a handler's own ``NonRetryable`` code, or just ``SERVICE_RESULT_INVALID``
    (a result failing ``result_schema``); never the exception's message;
    ``attempts`` how many calls were made; ``dispatch_key`` the idempotency
    key the handler was given.
    """

    status: str
    result: Any
    error: str | None
    attempts: int
    dispatch_key: str

    @property
    def ok(self) -> bool:
        return self.status == "COMPLETED"


def service_request(spec: ServiceSpec, step_id: str, state_json: Any, state: Any, ctx: Any) -> Any:
    """The request a service step records now: a private JSON object.

    The state's JSON without a ``request`` callable. A callable returning
    anything but a dict, or a dict JSON cannot store, raises ``TypeError``
    naming the step, never the value.
    """
    if spec.request is None:
        return json_copy(state_json, "request", error=TypeError)
    value = call_with_state(spec.request, state, ctx)
    if not isinstance(value, dict):
        raise TypeError(
            f"request of service step {step_id!r} must return a dict, not {type(value).__name__}"
        )
    try:
        return json_copy(value, "request", error=TypeError)
    except TypeError as exc:
        raise TypeError(f"service step {step_id!r}: {exc}") from None
