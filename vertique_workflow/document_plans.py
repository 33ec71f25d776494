"""Document plans on every node: a per-process cache of compiled DOCUMENT rows.

A code plan is resident because the node imported its class; a document
plan is resident once the node has compiled the row's stored text. Any node
sharing the database can therefore run an instance pinned to a document of
any scope: the first time it needs the plan of ``(scope, id, version)`` it
reads the row through the guarded read
(:func:`vertique_workflow.store.documents.find_document`: size envelope,
then digest), compiles the verified text with this node's callback and type
catalogs, checks that the result has the row's plan hash, and keeps it keyed
by ``(scope, id, version, plan_hash)``. Publication and the startup restore
fill the cache the same way, ahead of the first command.

A document that cannot be rebuilt here -- drift, oversize, a compile error,
another plan hash (a node whose catalog differs) -- is logged once per key
and reads as "no plan on this node": the executor defers the command, as for
a pin whose code this node lacks, and the next node (or this one, after a
fix) can run it. Failures are not cached, so a repaired row is picked up.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .exceptions import DocumentDrift, WorkflowError
from .store import documents as store

if TYPE_CHECKING:
    from .definitions import Plan

__all__ = [
    "build",
    "cached",
    "compile_text",
    "log_failure",
    "register",
    "resident",
    "resident_pins",
]

logger = logging.getLogger("vertique_workflow.registry")

PlanKey = tuple[str, str, int, str]  # (scope, id, version, plan hash)
Pin = tuple[str, str, int]  # (scope, id, version)

_lock = threading.Lock()
_plans: dict[PlanKey, Plan] = {}
_hash_of_pin: dict[Pin, str] = {}
_logged: set[tuple[Pin, str]] = set()


def compile_text(text: str, *, document_format: str, source: str | None = None) -> Plan:
    """Compile a document with this node's catalogs (the document compiler)."""
    from .definitions.documents import compile_document

    plan: Plan = compile_document(text, format=document_format, source=source)
    return plan


def register(scope_key: str, plan: Plan) -> Plan:
    """Make ``plan`` the resident plan of ``(scope_key, plan.id, plan.version)``.

    Returns the plan held (an earlier one with the same hash stays).
    """
    pin = (scope_key, plan.id, int(plan.version))
    key = (*pin, plan.plan_hash)
    with _lock:
        held = _plans.get(key)
        if held is not None:
            return held
        _plans[key] = plan
        _hash_of_pin[pin] = plan.plan_hash
        return plan


def cached(scope_key: str, definition_id: str, version: int) -> Plan | None:
    """The compiled plan of the pin, if this process holds one."""
    pin = (scope_key, definition_id, int(version))
    with _lock:
        plan_hash = _hash_of_pin.get(pin)
        return None if plan_hash is None else _plans.get((*pin, plan_hash))


def build(scope_key: str, definition_id: str, version: int) -> Plan | None:
    """The cached plan, else read, verify and compile the row and cache the result.

    None when the key has no DOCUMENT row. Raises what the read or the
    compile raised (:class:`DocumentDrift`, ``DocumentTooLarge``, the
    compiler's ``DocumentError``), and :class:`DocumentDrift` when the text
    compiles on this node to another id, version or plan hash than the row
    records.
    """
    plan = cached(scope_key, definition_id, version)
    if plan is not None:
        return plan
    stored = store.find_document(scope_key, definition_id, version)
    if stored is None:
        return None
    record = stored.record
    plan = compile_text(stored.text, document_format=stored.format, source=record.source_location)
    if (plan.id, int(plan.version), plan.plan_hash) != (
        definition_id,
        int(version),
        record.plan_hash,
    ):
        raise DocumentDrift(
            f"definition {scope_key}/{definition_id} v{version}: the stored document compiles "
            f"on this node to {plan.id} v{plan.version} with plan hash {plan.plan_hash[:12]}, "
            f"but the row records {record.plan_hash[:12]} (this node's callback or type "
            "catalog differs from the node that wrote it)",
            definition_id=definition_id,
        )
    return register(scope_key, plan)


def resident(
    scope_key: str, definition_id: str, version: int, plan_hash: str | None = None
) -> Plan | None:
    """The plan this node runs the document pin with, or None (absent or not buildable).

    With ``plan_hash`` only a plan of that hash is returned. A failure to
    build is logged once per pin and reason (WARNING) and returns None.
    """
    pin = (scope_key, definition_id, int(version))
    try:
        plan = build(*pin)
    except WorkflowError as exc:
        log_failure(pin, exc)
        return None
    if plan is None or (plan_hash is not None and plan.plan_hash != plan_hash):
        return None
    return plan


def log_failure(pin: Pin, exc: BaseException) -> None:
    """Log, once per pin and error class, that a document cannot be used here (WARNING)."""
    reason = type(exc).__name__
    with _lock:
        first = (pin, reason) not in _logged
        _logged.add((pin, reason))
    if first:
        logger.warning(
            "workflow definition %s/%s v%s: the stored document cannot be used on this node "
            "(%s: %s); its commands are deferred",
            *pin,
            reason,
            exc,
        )


def resident_pins() -> list[Pin]:
    """Every (scope, id, version) whose document plan this process holds."""
    with _lock:
        return sorted(_hash_of_pin)


def _reset() -> None:
    """Forget every compiled document plan and logged failure (tests)."""
    with _lock:
        _plans.clear()
        _hash_of_pin.clear()
        _logged.clear()
