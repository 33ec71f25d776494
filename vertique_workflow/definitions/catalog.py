"""The catalog: the plans this process can run, keyed by (definition id, version).

It is the in-memory side of the registry. Startup fills it from every
installed app's ``workflows`` module; the engine resolves an instance's pin
through it. A (id, version) pair names exactly one plan structure: a second
plan with another hash under the same key is a definition error, because
instances pinned to that key would otherwise run a different graph.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TypeVar

from ..exceptions import WorkflowDefinitionError
from .dsl import Workflow
from .plan import Plan

__all__ = ["Catalog", "autodiscover", "catalog", "register"]

W = TypeVar("W", bound=type[Workflow[Any]])


def _plan_of(item: type[Workflow[Any]] | Plan) -> Plan:
    if isinstance(item, Plan):
        return item
    if isinstance(item, type) and issubclass(item, Workflow):
        return item.plan()
    raise TypeError(f"can register a Workflow subclass or a Plan, not {type(item).__name__}")


class Catalog:
    """Plans by (definition id, version); safe to share between threads."""

    def __init__(self) -> None:
        self._plans: dict[tuple[str, int], Plan] = {}
        self._lock = threading.Lock()

    def register(self, item: type[Workflow[Any]] | Plan) -> Plan:
        """Add a plan (or a workflow class's plan) and return the plan the catalog holds.

        The same structure again (equal hash) is a no-op returning the plan
        already held; another structure under the same key raises.
        """
        plan = _plan_of(item)
        key = (plan.id, plan.version)
        with self._lock:
            held = self._plans.get(key)
            if held is None:
                self._plans[key] = plan
                return plan
        if held.plan_hash != plan.plan_hash:
            raise WorkflowDefinitionError(
                f"workflow {plan.id!r} version {plan.version} is already registered with "
                f"another structure (plan hash {held.plan_hash[:12]}, not {plan.plan_hash[:12]}): "
                "give the changed definition a new version",
                definition_id=plan.id,
            )
        return held

    def get(self, definition_id: str, version: int) -> Plan | None:
        """The plan of exactly this id and version, or None."""
        return self._plans.get((definition_id, version))

    def latest(self, definition_id: str) -> Plan | None:
        """The highest registered version of ``definition_id``, or None."""
        versions = [plan for (pid, _), plan in list(self._plans.items()) if pid == definition_id]
        return max(versions, key=lambda plan: plan.version, default=None)

    def all(self) -> list[Plan]:
        """Every plan, ordered by id then version."""
        return [self._plans[key] for key in sorted(self._plans)]

    def remove(self, definition_id: str, version: int) -> Plan | None:
        """Forget one plan (a node that must not run it, e.g. during a rolling deploy test)."""
        with self._lock:
            return self._plans.pop((definition_id, version), None)

    def clear(self) -> None:
        """Forget every plan (tests; a re-run of ``autodiscover``)."""
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: object) -> bool:
        return key in self._plans


catalog = Catalog()
"""The process-wide catalog the engine and the registry bootstrap read."""

_explicit: list[type[Workflow[Any]]] = []


def register(workflow: W) -> W:
    """Class decorator: register ``workflow`` now and at every ``autodiscover``.

    For workflow classes that live outside an app's ``workflows`` module.
    """
    catalog.register(workflow)
    if workflow not in _explicit:
        _explicit.append(workflow)
    return workflow


def _declared_in(module_name: str) -> list[type[Workflow[Any]]]:
    module = sys.modules.get(module_name)
    if module is None:
        return []
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Workflow)
        and value.__module__ == module_name
        and isinstance(getattr(value, "id", None), str)
    ]


def autodiscover(target: Catalog | None = None) -> list[Plan]:
    """Import every installed app's ``workflows`` module and register its workflows.

    Registered are the ``Workflow`` subclasses defined in those modules that
    have an ``id`` (declared or inherited; a base class without one is
    abstract), plus every class decorated with ``@register``. Returns the
    plans held for them, in registration order. Definition errors propagate:
    a broken workflow must stop startup.
    """
    from django.apps import apps
    from django.utils.module_loading import autodiscover_modules

    target = catalog if target is None else target
    autodiscover_modules("workflows")
    classes = list(_explicit)
    for app_config in apps.get_app_configs():
        for cls in _declared_in(f"{app_config.name}.workflows"):
            if cls not in classes:
                classes.append(cls)
    return [target.register(cls) for cls in classes]
