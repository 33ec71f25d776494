"""Durable context and actors.

Durable context: ``contextvars`` registered here are captured when a command
is recorded (into the command's ``context_json`` as ``{"context": {...}}``)
and bound again around workflow code when the executor runs that command, so
a tenant id or a correlation id set in a view is visible in the action that
runs later on another machine. The identity namespace is never carried to the
executor: a variable registered under that name is refused.

Actors say who asked for a command; they are stored on the command and copied
to the history entries it causes.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from . import payloads
from .exceptions import WorkflowValidationError
from .store.commands import Actor as _StoredActor

IDENTITY_NAMESPACE = "identity"

_registry: dict[str, contextvars.ContextVar[Any]] = {}
_lock = threading.Lock()
_settings_loaded = False


def register_durable(var: contextvars.ContextVar[Any], name: str | None = None) -> None:
    """Carry ``var`` from the recording caller to the workflow code that runs the command.

    Values must be JSON-serialisable. ``name`` defaults to the variable's name.
    """
    key = name or var.name
    if key == IDENTITY_NAMESPACE:
        raise WorkflowValidationError(
            f"{IDENTITY_NAMESPACE!r} is reserved: identities are never carried to executors"
        )
    with _lock:
        existing = _registry.get(key)
        if existing is not None and existing is not var:
            raise WorkflowValidationError(f"durable context name {key!r} is already registered")
        _registry[key] = var


def unregister_durable(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def _load_settings() -> None:
    global _settings_loaded
    if _settings_loaded:
        return
    from .conf import workflow_settings

    for path in workflow_settings.DURABLE_CONTEXT:
        register_durable(import_string(path))
    _settings_loaded = True


def capture() -> dict[str, Any] | None:
    """``{"context": {name: value}}`` of the bound durable variables, or None when empty."""
    _load_settings()
    captured = {}
    for name, var in list(_registry.items()):
        value = var.get(_MISSING)
        if value is not _MISSING:
            captured[name] = value
    captured.pop(IDENTITY_NAMESPACE, None)
    return {"context": captured} if captured else None


def explicit_carrier(
    carrier: Mapping[str, Any] | None, *, max_bytes: int | None
) -> dict[str, Any] | None:
    """The stored form ``{"context": {...}}`` of an explicit carrier, or None when absent.

    ``carrier`` has the shape the capture produces inside its wrapper: a
    mapping of registered durable-context names to JSON values. It is
    checked before anything is read or written: a name that is not
    registered, and the identity namespace (identities are never carried
    to executors), raise ``WorkflowValidationError`` rather than being
    dropped, so a caller's typo cannot silently bind nothing; values follow
    the payload JSON rules. An empty mapping is no carrier.
    """
    if carrier is None:
        return None
    if not isinstance(carrier, Mapping):
        raise WorkflowValidationError("the carrier must be a mapping of durable-context names")
    _load_settings()
    values: dict[str, Any] = {}
    for name, value in carrier.items():
        if name == IDENTITY_NAMESPACE:
            raise WorkflowValidationError(
                f"the carrier names {IDENTITY_NAMESPACE!r}: identities are never carried "
                "to executors"
            )
        if not isinstance(name, str) or name not in _registry:
            shown = str(name)[:64]
            raise WorkflowValidationError(
                f"the carrier names {shown!r}, which is not a registered durable-context name"
            )
        values[name] = value
    if not values:
        return None
    document = {"context": values}
    payloads.check(document, "the carrier", max_bytes=max_bytes)
    return document


@contextmanager
def bound(context_json: dict[str, Any] | None) -> Iterator[None]:
    """Bind a captured context around workflow code; registered names absent from it are unset.

    Unsetting matters on executor threads: a value left by the previous
    command must not leak into the next one.
    """
    _load_settings()
    values = dict((context_json or {}).get("context") or {})
    values.pop(IDENTITY_NAMESPACE, None)
    tokens = []
    for name, var in list(_registry.items()):
        tokens.append((var, var.set(values.get(name))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class _Missing:
    pass


_MISSING = _Missing()


@dataclass(frozen=True)
class Actor:
    """Who asked for a command: ``Actor.user("ann")``, ``Actor.system("nightly")``..."""

    kind: str
    id: str | None = None
    reason: str | None = None
    on_behalf_of: str | None = None

    @classmethod
    def user(
        cls, user_id: str, *, reason: str | None = None, on_behalf_of: str | None = None
    ) -> Actor:
        return cls("USER", str(user_id), reason, on_behalf_of)

    @classmethod
    def system(cls, name: str, *, reason: str | None = None) -> Actor:
        return cls("SYSTEM", name, reason)

    @classmethod
    def service(
        cls, name: str, *, reason: str | None = None, on_behalf_of: str | None = None
    ) -> Actor:
        return cls("SERVICE", name, reason, on_behalf_of)

    def stored(self) -> _StoredActor:
        """The attribution columns: an actor named by the caller is ASSERTED, not verified."""
        return _StoredActor(self.kind, self.id, self.reason, self.on_behalf_of, "ASSERTED")


def stored_actor(actor: Actor | None) -> _StoredActor:
    return _StoredActor() if actor is None else actor.stored()
