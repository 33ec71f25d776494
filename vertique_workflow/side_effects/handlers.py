"""Service handlers: the Python callables ``service`` steps name, registered by name.

A handler is called by the relay, outside any workflow transaction, as
``handler(request, call)``: ``request`` is the JSON object the step built,
``call`` a ``ServiceCall`` carrying the dispatch key to send as the
idempotency key of the outside API (a call may be made more than once: a
relay that dies between the call and the recording of its result leaves the
call to be made again). It returns the result (a JSON object, or None) or
raises: an exception its step's ``retry_on`` names is retried with the
step's backoff, ``NonRetryable("CODE")`` fails the call at once with that
code. Register with the decorator ``@service_handler("payments.charge")``
in a module Django imports (``models.py``, ``AppConfig.ready``), or list
dotted paths in ``VERTIQUE_WORKFLOW["SERVICE_HANDLERS"]``; the system check
``vertique_workflow.E020`` refuses a plan naming an unregistered handler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.utils.module_loading import import_string

from ..conf import workflow_settings
from ..exceptions import WorkflowDefinitionError

__all__ = [
    "ServiceCall",
    "get_handler",
    "handler_names",
    "register_service_handler",
    "service_handler",
    "unregister_service_handler",
]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.Lock()
_handlers: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class ServiceCall:
    """What a handler knows about the call it serves.

    ``dispatch_key`` is stable across every attempt of this call: pass it as
    the idempotency key of the API you call. ``attempt`` counts from 1;
    ``timeout_seconds`` is the step's bound of one call (the relay stops
    waiting then).
    """

    dispatch_key: str
    workflow_id: Any
    step_id: str
    attempt: int
    max_attempts: int
    timeout_seconds: float
    fork_step_id: str | None = None
    branch_id: str | None = None


def register_service_handler(name: str, func: Callable[..., Any], *, replace: bool = False) -> None:
    """Register ``func`` as the handler ``name``; a second registration needs ``replace``."""
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise WorkflowDefinitionError("a service handler needs a name of 1 to 255 characters")
    if not callable(func):
        raise WorkflowDefinitionError(f"service handler {name!r} is not callable")
    with _lock:
        existing = _handlers.get(name)
        if existing is not None and existing is not func and not replace:
            raise WorkflowDefinitionError(
                f"service handler {name!r} is registered already (pass replace=True)"
            )
        _handlers[name] = func


def unregister_service_handler(name: str) -> None:
    """Forget the handler ``name`` (tests)."""
    with _lock:
        _handlers.pop(name, None)


def service_handler(name: str) -> Callable[[F], F]:
    """Decorator: register the function as the service handler ``name``."""

    def register(func: F) -> F:
        register_service_handler(name, func)
        return func

    return register


def _from_settings() -> dict[str, str]:
    value = workflow_settings.SERVICE_HANDLERS
    return dict(value) if isinstance(value, dict) else {}


def get_handler(name: str) -> Callable[..., Any] | None:
    """The handler registered as ``name`` (or listed in ``SERVICE_HANDLERS``), or None."""
    with _lock:
        found = _handlers.get(name)
    if found is not None:
        return found
    path = _from_settings().get(name)
    if path is None:
        return None
    func = import_string(path)
    register_service_handler(name, func, replace=True)
    return func


def handler_names() -> set[str]:
    """Every handler name this process can call (registered or listed in the settings)."""
    with _lock:
        names = set(_handlers)
    return names | set(_from_settings())
