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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .conf import workflow_settings
from .exceptions import WorkflowDefinitionError, WorkflowNotFound
from .store import definitions as store
from .store.definitions import DEFAULT_SCOPE, PlanLike, UpsertOutcome

if TYPE_CHECKING:
    from collections.abc import Mapping

    class PlanLikeWithSteps(PlanLike, Protocol):
        """A plan and its step ids (``vertique_workflow.definitions.Plan`` fits)."""

        @property
        def steps(self) -> Mapping[str, object]: ...


__all__ = [
    "Stranded",
    "activate",
    "check_name_bindings",
    "deactivate",
    "deprecate",
    "ensure_synced",
    "reinstate",
    "retire",
    "stranded_instances",
    "stranded_summary",
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

    First, before any write, :func:`check_name_bindings`: a class that a
    non-retired version binds by name and that moved fails the sync (and so
    the executor's startup) with :class:`WorkflowDefinitionError`.
    """
    if plans is None:
        # AppConfig.ready() already imported every app's workflows.py
        from .definitions import catalog

        plans = catalog.all()
    check_name_bindings()
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


def check_name_bindings() -> None:
    """Refuse to start when a class that a non-retired version binds by name has moved.

    Every non-retired registry row records in ``name_binding`` the binary
    name (dotted ``module.qualname``) of each class its plan names, mapped to
    the name its hash used. An entry whose hash used the binary name itself
    binds the class *by name*: that class may not move (be renamed, moved to
    another module or deleted) while such a version is not retired. Moved
    means the dotted name no longer imports as a class (see
    :func:`vertique_workflow.definitions.plan.resolve_class_name`). Raises
    :class:`WorkflowDefinitionError` naming the version and the recorded name.
    An entry bound to another (logical) name is not checked: its hash does
    not depend on where the class lives.
    """
    from .definitions.plan import resolve_class_name

    for row in store.bound_names():
        for binary, hashed in sorted(row.name_binding.items()):
            if binary != hashed or resolve_class_name(binary) is not None:
                continue
            raise WorkflowDefinitionError(
                f"workflow definition {row.scope_key}/{row.definition_id} v{row.version} "
                f"({row.status}) is bound by name to the class {binary!r}, which no longer "
                "imports under that name: keep the class there until every version bound to "
                "it is retired",
                definition_id=row.definition_id,
            )


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


# --------------------------------------------------------------------------
# Stranded instances (a code change removed the step they stand at)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stranded:
    """Unfinished instances of one version standing at steps its code no longer has."""

    definition_id: str
    version: int
    steps: tuple[tuple[str, int], ...]  # (missing step id, instance count), by step id

    @property
    def count(self) -> int:
        return sum(count for _, count in self.steps)

    def describe(self) -> str:
        """What is wrong: the count, the version and the missing steps."""
        steps = ", ".join(f"{step!r} ({count})" for step, count in self.steps)
        return (
            f"{self.count} unfinished instance(s) of workflow {self.definition_id!r} "
            f"version {self.version} stand at step(s) the code of version {self.version} "
            f"no longer has: {steps}"
        )

    def fix(self) -> str:
        """What to do about it."""
        version = self.version
        return (
            f"keep the old class as version {version} (with those steps) and add version "
            f"{version + 1} with the new steps; until then their commands fail with "
            f"STEP_NOT_IN_PLAN; once the code of version {version} has the steps again, "
            "retry the failed instances (see docs/changing-workflows.md)"
        )


def stranded_instances(plans: Iterable[PlanLikeWithSteps] | None = None) -> list[Stranded]:
    """Unfinished instances (FAILED included) whose step the resident code plan of their
    version lacks, grouped by version; one statement.

    ``plans`` defaults to the process catalog. Only versions this node holds
    code for are read: instances of a version without code are deferred, not
    stranded.
    """
    if plans is None:
        from .definitions import catalog

        plans = catalog.all()
    resident = {(plan.id, int(plan.version)): tuple(plan.steps) for plan in plans}
    groups: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for definition_id, version, step, count in store.stranded_instances(resident):
        groups.setdefault((definition_id, version), []).append((step, count))
    return [
        Stranded(definition_id, version, tuple(steps))
        for (definition_id, version), steps in sorted(groups.items())
    ]


def stranded_summary(groups: Iterable[Stranded]) -> str | None:
    """One line for every stranded group (the executor's startup ERROR line), or None."""
    found = list(groups)
    if not found:
        return None
    return "; ".join(f"{group.describe()}: {group.fix()}" for group in found)
