"""The definition registry bootstrap and lifecycle.

At startup an executing node records every code-first workflow of its
catalog as a CODE row of the default scope (:func:`sync_code_definitions`,
run once per process by :func:`ensure_synced`). A record-only node
(``VERTIQUE_WORKFLOW["EXECUTOR_ENABLED"] = False``) writes no row.

The lifecycle functions (:func:`deprecate`, :func:`reinstate`,
:func:`retire`, :func:`activate`, :func:`deactivate`) are what the
``workflow_definitions`` management command and the admin call; the SQL and
the guards live in :mod:`vertique_workflow.store.definitions`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from .conf import workflow_settings
from .exceptions import WorkflowDefinitionError, WorkflowNotFound
from .store import definitions as store
from .store.definitions import DEFAULT_SCOPE, PlanLike, UpsertOutcome

__all__ = [
    "activate",
    "deactivate",
    "deprecate",
    "ensure_synced",
    "reinstate",
    "retire",
    "sync_code_definitions",
]

logger = logging.getLogger("vertique_workflow.registry")

_sync_lock = threading.Lock()
_synced = False


def sync_code_definitions(
    plans: Iterable[PlanLike] | None = None, *, activate_default: bool = True
) -> dict[tuple[str, int], UpsertOutcome]:
    """Record every code plan as a CODE row; return ``{(id, version): outcome}``.

    ``plans`` defaults to the process catalog (every installed app's
    ``workflows`` module, imported by ``AppConfig.ready()``). Each plan is its own registry
    transaction, so one refused plan (a contract or state-type rule) stops
    the sync with its :class:`WorkflowDefinitionError` after the plans before
    it were recorded. Logs one INFO line per definition.
    """
    if plans is None:
        # AppConfig.ready() already imported every app's workflows.py
        from .definitions import catalog

        plans = catalog.all()
    outcomes: dict[tuple[str, int], UpsertOutcome] = {}
    for plan in plans:
        outcome = store.upsert_code(plan, activate_default=activate_default)
        outcomes[(plan.id, plan.version)] = outcome
        logger.info(
            "workflow definition %s version %s hash %s: %s",
            plan.id,
            plan.version,
            plan.plan_hash[:12],
            outcome,
        )
    return outcomes


def ensure_synced() -> dict[tuple[str, int], UpsertOutcome] | None:
    """Run :func:`sync_code_definitions` once per process (thread-safe).

    Returns the outcomes when this call ran the sync, None when it had
    already run or when this node records only (``EXECUTOR_ENABLED`` False:
    a record-only node writes no CODE rows). A failed sync is not remembered,
    so the next call tries again.
    """
    global _synced
    if not workflow_settings.EXECUTOR_ENABLED or _synced:
        return None
    with _sync_lock:
        if _synced:
            return None
        outcomes = sync_code_definitions()
        _synced = True
        return outcomes


def _reset_sync_state() -> None:
    """Forget that the sync ran (tests)."""
    global _synced
    with _sync_lock:
        _synced = False


# --------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------


def deprecate(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> None:
    """AVAILABLE -> DEPRECATED: no new start selects or pins the version; running
    instances continue. Refused for the current default version."""
    store.transition(scope, definition_id, version, "AVAILABLE", "DEPRECATED")


def reinstate(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> None:
    """DEPRECATED or RETIRED -> AVAILABLE.

    For a CODE row this node must hold the plan of that id and version with
    the registered hash (an executable source), else
    :class:`WorkflowDefinitionError` and nothing changes.
    """
    rows = store.list_definitions(scope=scope, definition_id=definition_id)
    row = next((r for r in rows if r.version == version), None)
    if row is None:
        raise WorkflowNotFound(
            f"workflow definition {scope}/{definition_id} v{version} does not exist"
        )
    if row.kind == "CODE":
        from .definitions import autodiscover, catalog

        plan = catalog.get(definition_id, version)
        if plan is None:
            autodiscover()
            plan = catalog.get(definition_id, version)
        if plan is None or plan.plan_hash != row.plan_hash:
            raise WorkflowDefinitionError(
                f"cannot reinstate {scope}/{definition_id} v{version}: this node has no "
                "code plan of that version with the registered plan hash",
                definition_id=definition_id,
            )
    from_status = row.status if row.status in ("DEPRECATED", "RETIRED") else "DEPRECATED"
    store.transition(scope, definition_id, version, from_status, "AVAILABLE")


def retire(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> None:
    """CANDIDATE or DEPRECATED -> RETIRED; refused while unfinished instances pin it."""
    store.retire(scope, definition_id, version)


def activate(
    definition_id: str,
    version: int,
    scope: str = DEFAULT_SCOPE,
    target_scope: str | None = None,
) -> None:
    """Make a version current for new starts in ``scope``.

    ``target_scope`` (default: ``scope`` itself) is the scope the version's
    row lives in: ``scope`` or ``default`` (a scope following a default
    version).
    """
    store.put_activation(scope, definition_id, target_scope or scope, version)


def deactivate(definition_id: str, scope: str = DEFAULT_SCOPE) -> bool:
    """Remove the scope's activation record; returns whether one existed.

    Without a record a start takes the default scope's record, else the
    highest AVAILABLE version.
    """
    return store.remove_activation(scope, definition_id)
