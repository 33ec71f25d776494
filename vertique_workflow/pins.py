"""Which definition version a start pins, and which signals an instance accepts.

The registry rows (selection read, pin admission, declared signal names) are
the source of truth across nodes; the node's own catalog supplies the plan
when the registry holds no row yet (a code definition not synced by this
deploy's first executor start) and validates payloads against the plan's
compiled schemas when it is resident.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from . import document_plans, scope_rules
from .definitions import Plan, catalog
from .exceptions import DefinitionUnavailable, WorkflowNotFound, WorkflowValidationError
from .payloads import check_schema
from .store import definitions as registry
from .store.instances import InstanceRow

DEFAULT_SCOPE = "default"


def resident_plan(definition_id: str, version: int, *, scope: str = DEFAULT_SCOPE) -> Plan | None:
    """The plan this node runs an instance pinned to ``(scope, definition_id, version)``.

    Resolution is by the pin's scope, id and version, as in the reference.
    In the default scope the code plan of that id and version comes first,
    whatever its hash: a plan rehashed in place (``REHASHED``: callback
    names, schemas, added steps) therefore still runs the instances started
    before the change; an instance whose step the plan lost fails with
    ``STEP_NOT_IN_PLAN`` when the engine reaches it (see
    docs/changing-workflows.md) instead of being deferred forever.

    Otherwise -- any other scope, or a default-scope version no code plan
    has -- the pin's DOCUMENT row is compiled on first use and cached
    (:mod:`vertique_workflow.document_plans`). None when the node has no
    plan: no row, a CODE row without code here, or a document that cannot
    be rebuilt here (drift, oversize, a compile error; logged once). The
    executor defers such commands.
    """
    if scope == DEFAULT_SCOPE:
        plan = catalog.get(definition_id, version)
        if plan is not None:
            fill_schemas_once(plan)
            return plan
    return document_plans.resident(scope, definition_id, version)


def exact_plan(
    definition_id: str, version: int, plan_hash: str, *, scope: str = DEFAULT_SCOPE
) -> Plan | None:
    """The node's plan of ``(scope, definition_id, version)`` only when its hash is ``plan_hash``.

    For record-side validation: a node whose code differs from the registry
    row validates with the row's recorded schemas instead of its own. A
    document pin's plan is compiled from its row on first use, like
    :func:`resident_plan`.
    """
    if scope == DEFAULT_SCOPE:
        plan = catalog.get(definition_id, version)
        if plan is not None:
            if plan.plan_hash != plan_hash:
                return None
            fill_schemas_once(plan)
            return plan
    return document_plans.resident(scope, definition_id, version, plan_hash)


_filled: set[tuple[str, str, int, str]] = set()
_filled_lock = threading.Lock()


def fill_schemas_once(plan: Plan) -> None:
    """After this node first resolves ``plan`` for a pin: fill its row's NULL schema columns.

    The reference's plan cache runs the guarded fill after the first
    on-demand build of a plan on any node; here a node's first resolution of
    a pin to its code plan (record side or executor claim) plays that part,
    so a row recorded before the schema columns existed gets them even on a
    node that never runs the executor's sync, and its undeclared signals are
    refused at record time from then on. The fill is its own statement on its
    own connection (:func:`registry.fill_signal_schemas`), guarded by the
    plan hash, and runs once per (scope, id, version, hash) per process; a
    failed fill is tried again at the next resolution.
    """
    key = (DEFAULT_SCOPE, plan.id, plan.version, plan.plan_hash)
    with _filled_lock:
        if key in _filled:
            return
    if registry.fill_signal_schemas(plan) is None:
        return
    with _filled_lock:
        _filled.add(key)


def _reset_filled() -> None:
    """Forget which plans were filled (tests)."""
    with _filled_lock:
        _filled.clear()


@dataclass(frozen=True)
class Pin:
    """The (scope, id, version, hash) a new instance will be pinned to."""

    scope: str
    definition_id: str
    version: int
    plan_hash: str
    plan: Plan | None
    start_schema: dict[str, Any] | None

    def check_start_payload(self, payload: Any) -> None:
        if self.plan is not None:
            self.plan.check_start_payload(payload)
        elif self.start_schema is not None:
            check_schema(self.start_schema, payload, f"start payload of {self.definition_id!r}")

    def admit(self) -> None:
        registry.admit_pin(self.scope, self.definition_id, self.version, self.plan_hash)


def resolve_start_pin(
    definition_id: str,
    scope: str,
    version: int | None,
    selection: registry.SelectionResult | None = None,
) -> Pin:
    """Select the version to start and the plan to validate with.

    From ``selection`` when the caller read it already (``start`` reads it
    with its key, :func:`registry.start_read`), else from a selection read.
    """
    result = registry.selection_read(scope, definition_id) if selection is None else selection
    if not result.rows:
        plan = catalog.get(definition_id, version) if version else catalog.latest(definition_id)
        if plan is None:
            raise WorkflowNotFound(f"workflow definition {definition_id!r} does not exist")
        return Pin(
            DEFAULT_SCOPE, definition_id, plan.version, plan.plan_hash, plan, plan.start_schema
        )
    row = registry.select_version(result, scope, version)
    if row.scope_key != DEFAULT_SCOPE and row.kind == "DOCUMENT":
        _refuse_failing_row(row)
    return Pin(
        row.scope_key,
        definition_id,
        row.version,
        row.plan_hash,
        exact_plan(definition_id, row.version, row.plan_hash, scope=row.scope_key),
        row.start_schema,
    )


def _refuse_failing_row(row: registry.DefinitionRow) -> None:
    """Refuse a start of a scope's document row that this node's evaluation fails.

    The verdict is this node's own (:func:`scope_rules.refusal`), never the
    stored ``failure_reason``: a node whose code resolves the row starts it.
    """
    reason = scope_rules.refusal(row.scope_key, row.definition_id, row.version, row.plan_hash)
    if reason is None:
        return
    raise DefinitionUnavailable(
        f"workflow definition {row.scope_key}/{row.definition_id} v{row.version} cannot be "
        f"started on this node: {reason} ({registry.FAILURE_DESCRIPTIONS[reason]})",
        definition_id=row.definition_id,
    )


@dataclass(frozen=True)
class SignalSchemas:
    """The declared signals of an instance's pin (None: every name is admitted).

    ``declared`` decides which names are admitted, on every node alike;
    ``plan`` (resident with the pin's hash) only adds its record-time payload
    checks (schema, state merge) for the names it declares.
    """

    definition_id: str
    plan: Plan | None
    declared: dict[str, Any] | None

    def check_signal(self, name: str, payload: Any) -> None:
        if self.declared is not None and name not in self.declared:
            raise WorkflowValidationError(
                f"workflow {self.definition_id!r} declares no signal {name[:64]!r}"
            )
        if self.plan is not None and name in self.plan.signals:
            self.plan.check_signal_payload(name, payload)
            return
        schema = None if self.declared is None else self.declared[name]
        if schema is not None:
            check_schema(schema, payload, f"payload of signal {name!r}")


def signal_schema_source(
    row: InstanceRow, declaration: tuple[bool, Any] | None = None
) -> SignalSchemas:
    """Which signals the instance's pin admits: its registry row's ``signal_names_json``.

    Read in the caller's transaction, after the plan resolution (whose first
    run may fill a NULL column, see :func:`fill_schemas_once`). A NULL column
    admits every name. Without any row (an instance started from this node's
    catalog before an executor recorded the definition) the resident plan's
    declaration stands in, as it did for the start itself.

    ``declaration`` is ``(row found, signal_names_json)`` when the caller read
    it with the instance (``store.signal_record``), before the plan
    resolution: a NULL column read then is read again after it, in case that
    resolution just filled it.
    """
    plan = exact_plan(
        row.definition_id,
        row.definition_version,
        row.plan_hash,
        scope=row.definition_scope_key,
    )
    if declaration is not None and not (declaration[0] and declaration[1] is None):
        found, value = declaration
        declared = value if isinstance(value, dict) else None
    else:
        found, declared = registry.signal_declaration(
            row.definition_scope_key, row.definition_id, row.definition_version
        )
    if not found and plan is not None:
        declared = dict(plan.signals)
    return SignalSchemas(row.definition_id, plan, declared)
