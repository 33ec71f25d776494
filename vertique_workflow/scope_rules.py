"""Which DOCUMENT rows of scopes other than default this node refuses to start.

A scope's document can be loaded at runtime by anyone with registry access,
on any node, so the code it needs may be missing here, or it may not fit the
definition the rest of the deployment runs. Two rules (the reference's
``failure_reason``) are evaluated for every non-retired DOCUMENT row of a
scope other than default:

* ``NAME_BINDING_UNRESOLVED``: a class the row's ``name_binding`` names (by
  its binary, dotted name) does not import on this node;
* ``STATE_TYPE_NOT_EXTENDED``: the default scope holds the same id with a
  state class, and the row's state type is not that class or a subclass of
  it (both resolved on this node; a dict state extends no class).

:func:`evaluate_scope_rows` runs at startup (``registry.ensure_synced``) and
writes each verdict with ``record_failure`` (a mark, or clearing it when no
rule is broken), so operators see it in listings. The refusal of starts,
though, comes from this node's *own* verdicts, kept per process
(:func:`refusal`): during a rolling deploy nodes that ship different code
may rewrite the column, and each refuses only what it cannot run. A row this
process has not evaluated yet (loaded after its startup, or a process that
never runs the startup sync, such as a web server) is evaluated the first
time a start selects it, with one read and no write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from .definitions.plan import resolve_class_name
from .store import definitions as store
from .store import documents as document_store
from .store.definitions import DEFAULT_SCOPE, FAILURE_DESCRIPTIONS, RuleRow

__all__ = [
    "NAME_BINDING_UNRESOLVED",
    "STATE_TYPE_NOT_EXTENDED",
    "broken_rule",
    "evaluate_scope_rows",
    "refusal",
]

NAME_BINDING_UNRESOLVED = "NAME_BINDING_UNRESOLVED"
STATE_TYPE_NOT_EXTENDED = "STATE_TYPE_NOT_EXTENDED"

logger = logging.getLogger("vertique_workflow.registry")

Pin = tuple[str, str, int]
_VerdictKey = tuple[str, str, int, str]  # (scope, id, version, plan hash)

_lock = threading.Lock()
_verdicts: dict[_VerdictKey, str | None] = {}


def _state_class(row: RuleRow) -> type | None:
    """The row's state class on this node: the binding entry its hash used, resolved."""
    for binary, hashed in sorted(row.name_binding.items()):
        if hashed == row.state_type_name:
            return resolve_class_name(binary)
    return None


def broken_rule(row: RuleRow, default_rows: Sequence[RuleRow]) -> str | None:
    """The rule ``row`` breaks on this node, or None (pure: imports, no SQL).

    ``default_rows`` are the non-retired default-scope rows of the same id.
    An unresolved binding comes first: the state-type rule needs both classes.
    A default row whose class is not bound or does not resolve here is
    skipped (that is the default row's own concern, checked at startup).
    """
    for binary in sorted(row.name_binding):
        if resolve_class_name(binary) is None:
            return NAME_BINDING_UNRESOLVED
    own = _state_class(row)
    if own is None and row.state_type_name != "dict":
        return None  # a class that cannot be looked up by name: nothing to compare
    for default in default_rows:
        base = _state_class(default)
        if base is None:
            continue
        if own is None or not issubclass(own, base):
            return STATE_TYPE_NOT_EXTENDED
    return None


def _remember(row: RuleRow, reason: str | None) -> None:
    with _lock:
        _verdicts[(row.scope_key, row.definition_id, row.version, row.plan_hash)] = reason


def evaluate_scope_rows() -> dict[Pin, str | None]:
    """Evaluate every non-retired DOCUMENT row of the other scopes; record and remember.

    One read of the rows (and of the default rows of their ids), then, for
    each row whose stored ``failure_reason`` differs from this node's
    verdict, one ``record_failure`` (marking or clearing; it leaves a row
    that was retired meanwhile untouched). A failing row is logged once
    (WARNING). Returns ``{(scope, id, version): reason or None}``.
    """
    rows = store.scope_rule_rows()
    defaults: dict[str, list[RuleRow]] = {}
    for row in rows:
        if row.scope_key == DEFAULT_SCOPE:
            defaults.setdefault(row.definition_id, []).append(row)
    verdicts: dict[Pin, str | None] = {}
    for row in rows:
        if row.scope_key == DEFAULT_SCOPE or row.kind != "DOCUMENT":
            continue
        reason = broken_rule(row, defaults.get(row.definition_id, ()))
        _remember(row, reason)
        verdicts[(row.scope_key, row.definition_id, row.version)] = reason
        if row.failure_reason != reason:
            document_store.record_failure(row.scope_key, row.definition_id, row.version, reason)
        if reason is not None:
            logger.warning(
                "workflow definition %s/%s v%s: %s (%s); this node refuses its starts",
                row.scope_key,
                row.definition_id,
                row.version,
                reason,
                FAILURE_DESCRIPTIONS[reason],
            )
    return verdicts


def refusal(scope_key: str, definition_id: str, version: int, plan_hash: str) -> str | None:
    """The rule this node holds against starting ``(scope_key, definition_id, version)``.

    None for the default scope. The verdict of the startup evaluation, else
    an evaluation of that row now (one read on the caller's connection, no
    write), remembered for the process by pin and plan hash.
    """
    if scope_key == DEFAULT_SCOPE:
        return None
    key = (scope_key, definition_id, int(version), plan_hash)
    with _lock:
        if key in _verdicts:
            return _verdicts[key]
    rows = store.scope_rule_rows(definition_id)
    row = next(
        (
            r
            for r in rows
            if (r.scope_key, r.version, r.plan_hash) == (scope_key, int(version), plan_hash)
        ),
        None,
    )
    if row is None or row.kind != "DOCUMENT":
        return None
    reason = broken_rule(row, [r for r in rows if r.scope_key == DEFAULT_SCOPE])
    _remember(row, reason)
    return reason


def _reset() -> None:
    """Forget every verdict (tests)."""
    with _lock:
        _verdicts.clear()
