"""The definition registry: every statement on ``workflow_definitions`` and
``workflow_definition_activations``.

Two kinds of access live here:

* **Mutations** (:func:`upsert_code`, :func:`transition`, :func:`retire`,
  :func:`put_activation`, :func:`remove_activation`) each run in
  ``transaction.atomic`` on the workflow database alias, at READ COMMITTED,
  with a transaction-local ``lock_timeout``, under the exclusive
  id-derived advisory lock, after locking every row of the definition id in
  key order (``FOR UPDATE``). Two mutations of one id therefore serialize;
  mutations of different ids never wait for each other. A lock wait that
  exceeds ``DEFINITION_LOCK_TIMEOUT_MS`` (SQLSTATE 55P03) rolls the mutation
  back and raises a retryable :class:`WorkflowPersistenceError` whose
  ``definition_id`` is the id (the database error as its cause).
* **Reads in the caller's transaction** (:func:`selection_read`,
  :func:`admit_pin`, :func:`declared_signal_names`) run on the caller's
  connection and transaction, so a start sees the registry exactly as its own
  transaction does.

The advisory key is the single-bigint form
``hashtextextended('vertique_workflow.definition:' || id, 0)``; the
per-instance execution lock uses the two-integer form, so the two key spaces
never collide.

Refusals are :class:`DefinitionUnavailable` / :class:`DefinitionNotFound`
(``RegistryRefusal``): their messages may name other scopes and plan hashes,
so they are meant for operators and logs; end users get
``exceptions.user_message`` (a fixed sentence).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from django.db import DatabaseError, connections, transaction
from django.db.backends.utils import CursorWrapper

from .. import tables
from ..conf import workflow_settings
from ..exceptions import (
    ContractMismatch,
    DefinitionNotFound,
    DefinitionUnavailable,
    WorkflowDefinitionError,
    WorkflowPersistenceError,
    WorkflowValidationError,
)
from . import db, dedup
from .instances import ENDED as ENDED_INSTANCE_STATUSES

__all__ = [
    "Activation",
    "BoundNames",
    "DefinitionFailure",
    "DefinitionRecord",
    "DefinitionRow",
    "PlanLike",
    "RuleRow",
    "SelectionResult",
    "UpsertOutcome",
    "admission_error",
    "admission_lock_timeout",
    "admit_pin",
    "bound_names",
    "check_admission",
    "declared_signal_names",
    "fill_signal_schemas",
    "find_definition",
    "instance_counts",
    "is_lock_timeout",
    "list_activations",
    "list_definitions",
    "lock_timeout_error",
    "put_activation",
    "remove_activation",
    "retire",
    "scope_rule_rows",
    "select_version",
    "selection_read",
    "signal_declaration",
    "start_read",
    "stranded_instances",
    "transition",
    "upsert_code",
]

T = tables.sql_names()

DEFAULT_SCOPE = "default"
INVALID_TRANSITION = "INVALID_TRANSITION"

UpsertOutcome = Literal["INSERTED", "UNCHANGED", "REHASHED"]

STATUSES = ("CANDIDATE", "PUBLISHING", "AVAILABLE", "DEPRECATED", "RETIRED")
# statuses whose versions take part in the contract / state-type rules
RULED_STATUSES = frozenset({"CANDIDATE", "PUBLISHING", "AVAILABLE", "DEPRECATED"})
# instance statuses that pin a version against retirement
PINNING_INSTANCE_STATUSES = ("PENDING", "RUNNING", "WAITING", "COMPENSATING")
# the only status changes transition() accepts
TRANSITIONS = frozenset(
    {("AVAILABLE", "DEPRECATED"), ("DEPRECATED", "AVAILABLE"), ("RETIRED", "AVAILABLE")}
)
# failure_reason values this release knows; any other reads as no failure
KNOWN_FAILURES = frozenset({"STATE_TYPE_NOT_EXTENDED", "NAME_BINDING_UNRESOLVED"})

CONTRACT_RULE = "every version of a definition in a scope must name the same contract"
STATE_TYPE_RULE = "every version of a definition in a scope must have the same state type"

# --------------------------------------------------------------------------
# Statements (rendered once, with the placement)
# --------------------------------------------------------------------------

SET_ISOLATION = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

# SET LOCAL lock_timeout = '<ms>ms', parameterized (set_config(..., true) is SET LOCAL),
# plus the transaction's isolation level so no extra round trip asks for it.
SET_LOCK_TIMEOUT = (
    "SELECT set_config('lock_timeout', %s, true), current_setting('transaction_isolation')"
)

logger = logging.getLogger("vertique_workflow.registry")

LOCK_ID = "SELECT pg_advisory_xact_lock(hashtextextended('vertique_workflow.definition:' || %s, 0))"

# A pin's admission: lock_timeout, then the shared id lock, in one statement (the
# select list is evaluated in order, so the timeout bounds the lock's wait).
ADMIT_LOCK_SHARED = (
    "SELECT set_config('lock_timeout', %s, true), current_setting('transaction_isolation'), "
    "pg_advisory_xact_lock_shared(hashtextextended('vertique_workflow.definition:' || %s, 0))"
)

LOCK_ROWS = f"""
SELECT scope_key, definition_version, kind, status, contract_name, state_type_name, plan_hash,
       (signal_names_json IS NULL AND start_schema_json IS NULL) AS schemas_missing,
       document_digest
FROM {T["definitions"]}
WHERE definition_id = %s
ORDER BY scope_key, definition_version
FOR UPDATE
"""

READ_ACTIVATIONS = f"""
SELECT scope_key, definition_id, target_scope_key, definition_version, activated_at
FROM {T["definition_activations"]}
WHERE definition_id = %s
ORDER BY scope_key
"""

INSERT_CODE = f"""
INSERT INTO {T["definitions"]}
    (scope_key, definition_id, definition_version, kind, status, contract_name,
     state_type_name, plan_hash, name_binding, signal_names_json, start_schema_json,
     created_at, updated_at)
VALUES ('default', %s, %s, 'CODE', 'AVAILABLE', %s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb,
        now(), now())
"""

REHASH_CODE = f"""
UPDATE {T["definitions"]}
SET plan_hash = %s, contract_name = %s, state_type_name = %s, name_binding = %s::jsonb,
    signal_names_json = %s::jsonb, start_schema_json = %s::jsonb, updated_at = now()
WHERE scope_key = 'default' AND definition_id = %s AND definition_version = %s AND kind = 'CODE'
"""

FILL_SIGNAL_SCHEMAS = f"""
UPDATE {T["definitions"]}
SET signal_names_json = %s::jsonb, start_schema_json = %s::jsonb
WHERE scope_key = 'default' AND definition_id = %s AND definition_version = %s
  AND plan_hash = %s AND signal_names_json IS NULL AND start_schema_json IS NULL
"""

ACTIVATE_DEFAULT_IF_HIGHER = f"""
INSERT INTO {T["definition_activations"]} AS current
    (scope_key, definition_id, target_scope_key, definition_version, activated_at)
VALUES ('default', %s, 'default', %s, now())
ON CONFLICT (scope_key, definition_id) DO UPDATE
SET target_scope_key = EXCLUDED.target_scope_key,
    definition_version = EXCLUDED.definition_version,
    activated_at = EXCLUDED.activated_at
WHERE current.definition_version < EXCLUDED.definition_version
"""

PUT_ACTIVATION = f"""
INSERT INTO {T["definition_activations"]}
    (scope_key, definition_id, target_scope_key, definition_version, activated_at)
VALUES (%s, %s, %s, %s, now())
ON CONFLICT (scope_key, definition_id) DO UPDATE
SET target_scope_key = EXCLUDED.target_scope_key,
    definition_version = EXCLUDED.definition_version,
    activated_at = EXCLUDED.activated_at
"""

DELETE_ACTIVATION = f"""
DELETE FROM {T["definition_activations"]}
WHERE scope_key = %s AND definition_id = %s
"""

SET_STATUS = f"""
UPDATE {T["definitions"]}
SET status = %s, updated_at = now()
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s AND status = %s
"""

_PINNING_SQL = ", ".join(f"'{status}'" for status in PINNING_INSTANCE_STATUSES)

COUNT_PINNED_INSTANCES = f"""
SELECT count(*)
FROM {T["instances"]}
WHERE definition_scope_key = %s AND definition_id = %s AND definition_version = %s
  AND status IN ({_PINNING_SQL})
"""


def _selection_where(definition: str, scope: str) -> str:
    """The selection read's rows of both tables: the id's, in the start scope and default."""
    return f"definition_id = {definition} AND scope_key IN ({scope}, 'default')"


def _selection_read(definition: str, scope: str) -> str:
    """The selection read, its id and start scope spelled by the caller's placeholders."""
    where = _selection_where(definition, scope)
    return f"""
SELECT 'DEFINITION' AS source, scope_key, definition_version, status, kind, contract_name,
       state_type_name, failure_reason, plan_hash,
       CASE WHEN status = 'AVAILABLE' THEN signal_names_json::text END,
       CASE WHEN status = 'AVAILABLE' THEN start_schema_json::text END,
       NULL::varchar AS target_scope_key
FROM {T["definitions"]}
WHERE {where}
UNION ALL
SELECT 'ACTIVATION', scope_key, definition_version, NULL, NULL, NULL,
       NULL, NULL, NULL,
       NULL::text,
       NULL::text,
       target_scope_key
FROM {T["definition_activations"]}
WHERE {where}
"""


SELECTION_READ = _selection_read("%s", "%s")

SELECTION_COLUMNS = (
    "source, scope_key, definition_version, status, kind, contract_name, state_type_name, "
    "failure_reason, plan_hash, signal_names_json, start_schema_json, target_scope_key"
)

# A start's first read: its idempotency key's row (findStart) and the selection
# read in one statement, so a first start waits on the server once for both.
# One row at least (the VALUES row): the key's columns are NULL when the key is
# new, the selection's columns NULL when the id has no row and no activation.
START_READ = f"""
SELECT earlier.workflow_id, earlier.fingerprint, earlier.result_json, {SELECTION_COLUMNS}
FROM (VALUES (1)) AS one (x)
LEFT JOIN ({dedup.FIND}) AS earlier ON true
LEFT JOIN ({SELECTION_READ}) AS selection ({SELECTION_COLUMNS}) ON true
"""


def selection_digest(definition: str, scope: str) -> str:
    """SQL: the row versions the selection read returns, as one text (a scalar ``SELECT``).

    Each row the selection reads, of either table, by its version: its
    ``ctid`` (where this version lies) and ``xmin`` (the transaction that
    wrote it). Any change of a row, whatever the column, writes a new
    version with another ``ctid`` (and another ``xmin`` unless the same
    transaction wrote it again); an insert or a delete changes the list. So
    equal texts mean the same visible rows, and the remembered judgement is
    the one a fresh read would give (a rewrite of the table, ``VACUUM FULL``,
    only makes the next start read afresh). The same expression is computed
    when a start reads its selection (``START_READ_WITH_DIGEST``) and in the
    guard of a start that judged on a remembered selection
    (:mod:`.pipelined_start`); the versions are ordered by their own text,
    so the digest does not depend on a plan's row order. Cheaper than a
    digest of the rows' text: the schemas' JSON is not rendered.
    """
    where = _selection_where(definition, scope)
    return f"""
SELECT coalesce(string_agg(v, ',' ORDER BY v), '')
FROM (SELECT 'd' || ctid::text || xmin::text AS v FROM {T["definitions"]} WHERE {where}
      UNION ALL
      SELECT 'a' || ctid::text || xmin::text FROM {T["definition_activations"]} WHERE {where}
     ) AS versions"""


# START_READ and the digest of its selection rows (a start outside a
# transaction remembers both, store.pipelined_start)
START_READ_WITH_DIGEST = (
    START_READ.replace("\nFROM (VALUES (1))", ", digest.value\nFROM (VALUES (1))", 1)
    + f"CROSS JOIN ({selection_digest('%s', '%s')}) AS digest (value)\n"
)
assert START_READ_WITH_DIGEST.count("digest.value") == 1

PIN_ROWS = f"""
SELECT scope_key, definition_version, status, plan_hash
FROM {T["definitions"]}
WHERE definition_id = %s
"""

PIN_ROWS_FOR_SHARE = PIN_ROWS + "ORDER BY scope_key, definition_version\nFOR SHARE\n"

# check_admission's rule at READ COMMITTED as a condition, for a statement that
# runs under the shared id lock after PIN_ROWS: the pipelined start's record is
# guarded by it (store.pipelined_start), so the commit at the pipeline's Sync
# commits nothing for a pin the rule refuses. The same rule as the Python one
# (tests/test_pipelined_start.py holds the two to the same verdicts): an id with
# no row is admitted; otherwise the pin's exact row must exist with the plan
# hash and be AVAILABLE; any other isolation level admits nothing here. The
# named parameters are the record's (instances.record_start_params).
ADMITTED_AT_READ_COMMITTED = f"""(current_setting('transaction_isolation') = 'read committed'
    AND (NOT EXISTS (SELECT FROM {T["definitions"]} WHERE definition_id = %(definition)s)
         OR EXISTS (SELECT FROM {T["definitions"]}
                    WHERE scope_key = %(definition_scope)s AND definition_id = %(definition)s
                      AND definition_version = %(version)s AND plan_hash = %(plan_hash)s
                      AND status = 'AVAILABLE')))"""

SET_SESSION_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, false)"

# the on-demand schema fill waits this long at most for the row (fill_signal_schemas)
FILL_LOCK_TIMEOUT_MS = 100

SIGNAL_NAMES = f"""
SELECT signal_names_json::text
FROM {T["definitions"]}
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s
"""

LIST_DEFINITIONS = f"""
SELECT scope_key, definition_id, definition_version, kind, status, contract_name,
       state_type_name, plan_hash, document_digest, document_format, source_location,
       failure_reason, created_at, updated_at
FROM {T["definitions"]}
WHERE (%s::varchar IS NULL OR scope_key = %s)
  AND (%s::varchar IS NULL OR definition_id = %s)
  AND (%s::varchar[] IS NULL OR status = ANY(%s::varchar[]))
ORDER BY definition_id, scope_key, definition_version
"""

# Non-retired versions that bind a class by name (the startup check).
BOUND_NAMES = f"""
SELECT scope_key, definition_id, definition_version, status, name_binding::text
FROM {T["definitions"]}
WHERE status <> 'RETIRED' AND name_binding <> '{{}}'::jsonb
ORDER BY definition_id, scope_key, definition_version
"""

# The rows the scope-row evaluation reads: every non-retired DOCUMENT row of a
# scope other than default, and the non-retired default rows of the same ids
# (optionally of one id), with what the rules need and nothing else.
SCOPE_RULE_ROWS = f"""
SELECT d.scope_key, d.definition_id, d.definition_version, d.kind, d.status,
       d.state_type_name, d.plan_hash, d.name_binding::text, d.failure_reason
FROM {T["definitions"]} d
WHERE d.status <> 'RETIRED'
  AND (%s::varchar IS NULL OR d.definition_id = %s)
  AND (d.scope_key = 'default' OR d.kind = 'DOCUMENT')
  AND EXISTS (
      SELECT 1 FROM {T["definitions"]} s
      WHERE s.definition_id = d.definition_id AND s.scope_key <> 'default'
        AND s.kind = 'DOCUMENT' AND s.status <> 'RETIRED')
ORDER BY d.definition_id, d.scope_key, d.definition_version
"""

_ENDED_SQL = ", ".join(f"'{status}'" for status in ENDED_INSTANCE_STATUSES)

# Unfinished instances (FAILED included: a retry can repair them; archived rows
# left out) of the given default-scope versions whose step is not among the
# given steps of that version, grouped by version and step.
STRANDED_INSTANCES = f"""
SELECT i.definition_id, i.definition_version, i.current_step_id, count(*)
FROM {T["instances"]} i
WHERE i.definition_scope_key = 'default'
  AND i.status NOT IN ({_ENDED_SQL}) AND i.archived_at IS NULL
  AND i.current_step_id IS NOT NULL
  AND (i.definition_id, i.definition_version) IN (
      SELECT * FROM unnest(%(ids)s::text[], %(versions)s::int[]))
  AND NOT EXISTS (
      SELECT 1 FROM unnest(%(step_ids)s::text[], %(step_versions)s::int[], %(steps)s::text[])
          AS s(definition_id, definition_version, step_id)
      WHERE s.definition_id = i.definition_id
        AND s.definition_version = i.definition_version
        AND s.step_id = i.current_step_id)
GROUP BY i.definition_id, i.definition_version, i.current_step_id
ORDER BY i.definition_id, i.definition_version, i.current_step_id
"""

# Instances per pinned version: live (the statuses the retirement guard
# counts, archived rows included, as there) and FAILED (not archived).
INSTANCE_COUNTS = f"""
SELECT definition_scope_key, definition_id, definition_version,
       count(*) FILTER (WHERE status IN ({_PINNING_SQL})),
       count(*) FILTER (WHERE status = 'FAILED' AND archived_at IS NULL)
FROM {T["instances"]}
WHERE (%s::varchar IS NULL OR definition_scope_key = %s)
  AND (%s::varchar IS NULL OR definition_id = %s)
  AND (status IN ({_PINNING_SQL}) OR (status = 'FAILED' AND archived_at IS NULL))
GROUP BY definition_scope_key, definition_id, definition_version
"""

LIST_ACTIVATIONS = f"""
SELECT scope_key, definition_id, target_scope_key, definition_version, activated_at
FROM {T["definition_activations"]}
WHERE (%s::varchar IS NULL OR scope_key = %s)
  AND (%s::varchar IS NULL OR definition_id = %s)
ORDER BY definition_id, scope_key
"""

# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


class PlanLike(Protocol):
    """What the registry reads of a plan (``vertique_workflow.definitions.Plan`` fits)."""

    @property
    def id(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def contract(self) -> str: ...

    @property
    def state_type_name(self) -> str: ...

    @property
    def plan_hash(self) -> str: ...

    @property
    def signals(self) -> Mapping[str, dict[str, Any] | None]: ...

    @property
    def start_schema(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class DefinitionRow:
    """One row of a selection read: what a start needs to choose and pin a version.

    ``signal_names`` and ``start_schema`` are read for AVAILABLE rows only
    (None otherwise). ``signal_names`` maps each declared signal name to its
    payload JSON schema (or None); ``None`` as a whole means "not recorded".
    """

    scope_key: str
    definition_id: str
    version: int
    status: str
    kind: str
    contract_name: str
    state_type_name: str
    plan_hash: str
    failure_reason: str | None = None
    signal_names: dict[str, Any] | None = None
    start_schema: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        """``(scope_key, definition_id, version)``: the pin of an instance started on it."""
        return (self.scope_key, self.definition_id, self.version)


@dataclass(frozen=True)
class Activation:
    """The current version of a definition id in a scope (``target_scope_key`` is the
    scope itself or ``default``)."""

    scope_key: str
    definition_id: str
    target_scope_key: str
    version: int
    activated_at: datetime | None = None


@dataclass(frozen=True)
class SelectionResult:
    """The rows and activation records of one id in a start scope and the default scope."""

    definition_id: str
    start_scope: str
    rows: tuple[DefinitionRow, ...]
    activations: tuple[Activation, ...]

    def row(self, scope_key: str, version: int) -> DefinitionRow | None:
        """The row of exactly this scope and version, or None."""
        for row in self.rows:
            if row.scope_key == scope_key and row.version == version:
                return row
        return None

    def activation(self, scope_key: str) -> Activation | None:
        """The activation record of ``scope_key``, or None."""
        for record in self.activations:
            if record.scope_key == scope_key:
                return record
        return None


# The fixed description of each rule a failing scope row breaks (the detail
# of DefinitionRecord.failure).
FAILURE_DESCRIPTIONS = {
    "STATE_TYPE_NOT_EXTENDED": (
        "the state type of this scope's version does not extend the state type of the "
        "default scope's version of the definition"
    ),
    "NAME_BINDING_UNRESOLVED": (
        "a class this version binds by name does not resolve on the node that evaluated it"
    ),
}


@dataclass(frozen=True)
class DefinitionFailure:
    """The rule a failing scope row breaks: its name and its fixed description."""

    reason: str
    detail: str


@dataclass(frozen=True)
class DefinitionRecord:
    """A registry row as listed or found (metadata only: never the document text).

    ``failure_reason`` is a reason this release knows, else None; ``failure``
    pairs it with the rule's fixed description.
    """

    scope_key: str
    definition_id: str
    version: int
    kind: str
    status: str
    contract_name: str
    state_type_name: str
    plan_hash: str
    document_digest: str | None
    document_format: str | None
    source_location: str | None
    failure_reason: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def failure(self) -> DefinitionFailure | None:
        """The failure mark with its fixed description; None for no (or an unknown) reason."""
        detail = FAILURE_DESCRIPTIONS.get(self.failure_reason or "")
        return None if detail is None else DefinitionFailure(str(self.failure_reason), detail)


@dataclass(frozen=True)
class _LockedRow:
    scope_key: str
    version: int
    kind: str
    status: str
    contract_name: str
    state_type_name: str
    plan_hash: str
    schemas_missing: bool
    document_digest: str | None = None


def _key(scope_key: str, definition_id: str, version: int) -> str:
    return f"{scope_key}/{definition_id} v{version}"


def _invalid_transition(definition_id: str, message: str) -> DefinitionUnavailable:
    return DefinitionUnavailable(f"{INVALID_TRANSITION}: {message}", definition_id=definition_id)


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _load(value: Any) -> Any:
    if value is None or not isinstance(value, str | bytes):
        return value
    return json.loads(value)


def _known_failure(value: str | None) -> str | None:
    return value if value in KNOWN_FAILURES else None


# --------------------------------------------------------------------------
# Transactions and errors
# --------------------------------------------------------------------------


def _translated(exc: DatabaseError, definition_id: str) -> Exception | None:
    """The package error for a database error, or None to let it propagate as is."""
    state = db.sqlstate(exc)
    if state == "55P03":
        return WorkflowPersistenceError(
            f"definition {definition_id!r}: a registry lock was not granted within the "
            "lock_timeout; the transaction was rolled back, run it again",
            retryable=True,
            definition_id=definition_id,
        )
    if db.is_retryable(exc):
        return WorkflowPersistenceError(
            f"definition {definition_id!r}: the database aborted the registry transaction "
            f"(SQLSTATE {state or 'unknown'}); run it again",
            retryable=True,
            definition_id=definition_id,
        )
    if state == "23505":
        return DefinitionUnavailable(
            f"definition {definition_id!r}: a concurrent writer created the same registry key",
            definition_id=definition_id,
        )
    return None


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait over ``lock_timeout`` (SQLSTATE 55P03)."""
    return isinstance(exc, DatabaseError) and db.sqlstate(exc) == "55P03"


def lock_timeout_error(exc: DatabaseError, definition_id: str) -> WorkflowPersistenceError:
    """The retryable error naming the id, for a runner that owns the transaction."""
    mapped = _translated(exc, definition_id)
    assert isinstance(mapped, WorkflowPersistenceError)
    mapped.__cause__ = exc
    return mapped


def _lock_timeout() -> str:
    return f"{int(workflow_settings.DEFINITION_LOCK_TIMEOUT_MS)}ms"


@contextmanager
def _mutation(definition_id: str) -> Iterator[tuple[CursorWrapper, list[_LockedRow]]]:
    """A registry mutation of one id: READ COMMITTED, lock_timeout, id lock, row locks.

    Yields the cursor and the id's rows (every scope), locked in key order.
    """
    alias = db.alias()
    connection = connections[alias]
    outermost = not connection.in_atomic_block
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            if outermost:
                cursor.execute(SET_ISOLATION)
            cursor.execute(SET_LOCK_TIMEOUT, [_lock_timeout()])
            _, isolation = cursor.fetchone()
            if isolation != "read committed":
                raise WorkflowPersistenceError(
                    f"definition {definition_id!r}: registry mutations run at READ COMMITTED, "
                    f"but the enclosing transaction is {isolation.upper()}; call it outside "
                    "that transaction",
                    retryable=False,
                    definition_id=definition_id,
                )
            cursor.execute(LOCK_ID, [definition_id])
            cursor.execute(LOCK_ROWS, [definition_id])
            rows = [_LockedRow(*row) for row in cursor.fetchall()]
            yield cursor, rows
    except DatabaseError as exc:
        mapped = _translated(exc, definition_id)
        if mapped is None:
            raise
        raise mapped from exc


def _find(rows: Sequence[_LockedRow], scope_key: str, version: int) -> _LockedRow | None:
    for row in rows:
        if row.scope_key == scope_key and row.version == version:
            return row
    return None


def _check_version_rules(
    rows: Sequence[_LockedRow],
    scope_key: str,
    definition_id: str,
    version: int,
    contract_name: str,
    state_type_name: str,
) -> None:
    """Refuse a version whose contract or state type differs from another live version
    of the same scope and id (RETIRED versions and other scopes take no part)."""
    for other in rows:
        if other.scope_key != scope_key or other.version == version:
            continue
        if other.status not in RULED_STATUSES:
            continue
        if other.contract_name != contract_name:
            raise WorkflowDefinitionError(
                f"definition {_key(scope_key, definition_id, version)} names contract "
                f"{contract_name!r}, but version {other.version} ({other.status}) names "
                f"{other.contract_name!r}: {CONTRACT_RULE}",
                definition_id=definition_id,
            )
        if other.state_type_name != state_type_name:
            raise WorkflowDefinitionError(
                f"definition {_key(scope_key, definition_id, version)} has state type "
                f"{state_type_name!r}, but version {other.version} ({other.status}) has "
                f"{other.state_type_name!r}: {STATE_TYPE_RULE}",
                definition_id=definition_id,
            )


def _check_default_contract(
    rows: Sequence[_LockedRow],
    scope_key: str,
    definition_id: str,
    version: int,
    contract_name: str,
    *,
    counted: Collection[str] = RULED_STATUSES,
) -> None:
    """A non-default scope with no other version of the id (in a ``counted`` status) must
    not name another contract than the default scope's rows of the id (any status).

    A reinstatement counts the live versions (``RULED_STATUSES``); a candidate
    insert counts every row of the scope (the reference: "the scope holds no
    row of the id").
    """
    if scope_key == DEFAULT_SCOPE:
        return
    if any(
        row.scope_key == scope_key and row.version != version and row.status in counted
        for row in rows
    ):
        return
    for row in rows:
        if row.scope_key == DEFAULT_SCOPE and row.contract_name != contract_name:
            raise ContractMismatch(
                f"definition {_key(scope_key, definition_id, version)} names contract "
                f"{contract_name!r}, but the default scope holds {definition_id!r} "
                f"version {row.version} under contract {row.contract_name!r}",
                definition_id=definition_id,
            )


def _guard_default_current(
    cursor: CursorWrapper, scope_key: str, definition_id: str, version: int
) -> None:
    """Refuse to move a default-scope row the default activation names."""
    if scope_key != DEFAULT_SCOPE:
        return
    cursor.execute(READ_ACTIVATIONS, [definition_id])
    for record_scope, _, target_scope, target_version, _ in cursor.fetchall():
        if (
            record_scope == DEFAULT_SCOPE
            and target_scope == DEFAULT_SCOPE
            and target_version == version
        ):
            raise _invalid_transition(
                definition_id,
                f"definition {_key(scope_key, definition_id, version)} is the current "
                "default version; activate another version or remove the default "
                "activation first",
            )


# --------------------------------------------------------------------------
# CODE rows
# --------------------------------------------------------------------------


def upsert_code(plan: PlanLike, *, activate_default: bool = True) -> UpsertOutcome:
    """Record a code-first plan as the CODE row ``(default, plan.id, plan.version)``.

    * No row: insert it AVAILABLE with its hash, contract, state type, name
      binding (``plan.name_binding`` when the plan has one, else empty), its
      declared signals and start-payload schema, and return
      ``"INSERTED"``. Only then, when ``activate_default``, write the default
      activation ``(default, id) -> (default, version)`` in the same
      transaction, replacing a stored record only when it names a lower
      version (so concurrent boots of several versions end on the highest).
    * Same hash: return ``"UNCHANGED"`` and write nothing, except that a row
      whose signal and start schemas are both unrecorded gets them (guarded by
      the hash). The name binding is never written alone: a row recorded
      before bindings were kept stays ``{}`` until its hash changes.
    * Another hash: replace hash, contract, state type, name binding and
      schemas (the status stays) and return ``"REHASHED"``.

    Before an insert or a rehash, the version must name the same contract and
    state type as every other CANDIDATE/PUBLISHING/AVAILABLE/DEPRECATED
    version of the default scope, else :class:`WorkflowDefinitionError` and
    nothing is written. A DOCUMENT row under the same key is also refused.
    """
    definition_id, version = plan.id, int(plan.version)
    signals_json = _dump(dict(plan.signals))
    start_json = _dump(plan.start_schema)
    # a plan without the attribute (a hand-built PlanLike) names no class
    binding_json = _dump(dict(getattr(plan, "name_binding", None) or {}))
    with _mutation(definition_id) as (cursor, rows):
        own = _find(rows, DEFAULT_SCOPE, version)
        if own is not None and own.kind != "CODE":
            raise WorkflowDefinitionError(
                f"definition {_key(DEFAULT_SCOPE, definition_id, version)} is recorded as a "
                f"{own.kind} row; a code-first workflow cannot use the same id and version",
                definition_id=definition_id,
            )
        if own is not None and own.plan_hash == plan.plan_hash:
            if own.schemas_missing:
                cursor.execute(
                    FILL_SIGNAL_SCHEMAS,
                    [signals_json, start_json, definition_id, version, plan.plan_hash],
                )
            return "UNCHANGED"
        _check_version_rules(
            rows, DEFAULT_SCOPE, definition_id, version, plan.contract, plan.state_type_name
        )
        if own is None:
            cursor.execute(
                INSERT_CODE,
                [
                    definition_id,
                    version,
                    plan.contract,
                    plan.state_type_name,
                    plan.plan_hash,
                    binding_json,
                    signals_json,
                    start_json,
                ],
            )
            if activate_default:
                cursor.execute(ACTIVATE_DEFAULT_IF_HIGHER, [definition_id, version])
            return "INSERTED"
        cursor.execute(
            REHASH_CODE,
            [
                plan.plan_hash,
                plan.contract,
                plan.state_type_name,
                binding_json,
                signals_json,
                start_json,
                definition_id,
                version,
            ],
        )
        return "REHASHED"


# --------------------------------------------------------------------------
# Selection (first start)
# --------------------------------------------------------------------------


def selection_read(start_scope: str, definition_id: str) -> SelectionResult:
    """The id's rows in ``start_scope`` and ``default`` plus both scopes' activations.

    One statement on the caller's connection and transaction: no lock, no
    lock_timeout, no writes. What it sees follows the caller's isolation level
    (at READ COMMITTED every activation committed before the read).
    """
    # prepared: every start runs it (its plan would otherwise be made each time)
    fetched = db.fetchall_prepared(
        SELECTION_READ, [definition_id, start_scope, definition_id, start_scope]
    )
    return _selection(start_scope, definition_id, fetched)


def start_read(
    start_scope: str, definition_id: str, idempotency_key: str
) -> tuple[tuple[Any, str, Any] | None, SelectionResult]:
    """A start's key row (as :func:`dedup.find` of ``START``) and its selection read, at once.

    One prepared statement on the caller's connection and transaction, one
    snapshot for both: the key's ``(workflow_id, fingerprint, result)`` or
    None, and what :func:`selection_read` returns. A replay ignores the
    selection; a first start selects its version from it.
    """
    fetched = db.fetchall_prepared(
        START_READ, _start_read_params(start_scope, definition_id, idempotency_key)
    )
    return _start_read_rows(start_scope, definition_id, fetched)


def start_read_with_digest(
    start_scope: str, definition_id: str, idempotency_key: str
) -> tuple[tuple[Any, str, Any] | None, SelectionResult, str]:
    """:func:`start_read` and the digest of its selection rows (:func:`selection_digest`).

    One statement, one snapshot: the digest is of the rows returned.
    """
    params = _start_read_params(start_scope, definition_id, idempotency_key)
    fetched = db.fetchall_prepared(
        START_READ_WITH_DIGEST, [*params, definition_id, start_scope, definition_id, start_scope]
    )
    earlier, selection = _start_read_rows(start_scope, definition_id, [r[:-1] for r in fetched])
    return earlier, selection, fetched[0][-1]


def _start_read_params(start_scope: str, definition_id: str, idempotency_key: str) -> list[str]:
    """``START_READ``'s parameters: the key's (``dedup.FIND``), then the selection's."""
    return [
        "START",
        start_scope,
        definition_id,
        idempotency_key,
        definition_id,
        start_scope,
        definition_id,
        start_scope,
    ]


def _start_read_rows(
    start_scope: str, definition_id: str, fetched: Sequence[Sequence[Any]]
) -> tuple[tuple[Any, str, Any] | None, SelectionResult]:
    """``START_READ``'s rows as (the key's columns or None, the selection)."""
    workflow_id, fingerprint, result = fetched[0][:3]
    earlier = None if workflow_id is None else (workflow_id, fingerprint, result)
    selection = [row[3:] for row in fetched if row[3] is not None]
    return earlier, _selection(start_scope, definition_id, selection)


def _selection(
    start_scope: str, definition_id: str, fetched: Sequence[Sequence[Any]]
) -> SelectionResult:
    """The selection read's rows, parsed and in key order."""
    rows: list[DefinitionRow] = []
    activations: list[Activation] = []
    for (
        source,
        scope_key,
        version,
        status,
        kind,
        contract,
        state_type,
        failure,
        plan_hash,
        signals,
        start_schema,
        target_scope,
    ) in fetched:
        if source == "ACTIVATION":
            activations.append(Activation(scope_key, definition_id, target_scope, version))
            continue
        rows.append(
            DefinitionRow(
                scope_key=scope_key,
                definition_id=definition_id,
                version=version,
                status=status,
                kind=kind,
                contract_name=contract,
                state_type_name=state_type,
                plan_hash=plan_hash,
                failure_reason=_known_failure(failure),
                signal_names=_load(signals),
                start_schema=_load(start_schema),
            )
        )
    rows.sort(key=lambda row: (row.scope_key, row.version))
    activations.sort(key=lambda record: record.scope_key)
    return SelectionResult(definition_id, start_scope, tuple(rows), tuple(activations))


def _available(row: DefinitionRow | None, definition_id: str, what: str) -> DefinitionRow:
    if row is None:
        raise DefinitionNotFound(f"{what} does not exist", definition_id=definition_id)
    if row.status != "AVAILABLE":
        raise DefinitionUnavailable(
            f"definition {_key(*row.key)} is {row.status}: version not available",
            definition_id=definition_id,
        )
    return row


def select_version(
    result: SelectionResult, start_scope: str, requested_version: int | None = None
) -> DefinitionRow:
    """Choose the version a first start in ``start_scope`` runs (pure; no SQL).

    * ``requested_version``: the start scope's row of that version, else the
      default scope's; it must be AVAILABLE (:class:`WorkflowConflict`
      "version not available"); absent in both, :class:`WorkflowNotFound`.
    * Otherwise the start scope's activation record, else the default
      scope's; the row it names must be AVAILABLE.
    * Without a record: the highest AVAILABLE version of the start scope, else
      of the default scope.

    No row of the id at all raises :class:`WorkflowNotFound` naming the id;
    rows none of which is AVAILABLE raise :class:`WorkflowConflict`.
    """
    definition_id = result.definition_id
    if requested_version is not None:
        row = result.row(start_scope, requested_version) or result.row(
            DEFAULT_SCOPE, requested_version
        )
        if row is None and not result.rows:
            raise DefinitionNotFound(
                f"workflow definition {definition_id!r} does not exist",
                definition_id=definition_id,
            )
        return _available(
            row, definition_id, f"workflow definition {definition_id!r} version {requested_version}"
        )
    record = result.activation(start_scope) or result.activation(DEFAULT_SCOPE)
    if record is not None:
        target = result.row(record.target_scope_key, record.version)
        return _available(
            target,
            definition_id,
            f"workflow definition {_key(record.target_scope_key, definition_id, record.version)} "
            f"(activated in scope {record.scope_key!r})",
        )
    if not result.rows:
        raise DefinitionNotFound(
            f"workflow definition {definition_id!r} does not exist", definition_id=definition_id
        )
    for scope_key in (start_scope, DEFAULT_SCOPE):
        candidates = [
            row for row in result.rows if row.scope_key == scope_key and row.status == "AVAILABLE"
        ]
        if candidates:
            return max(candidates, key=lambda row: row.version)
    raise DefinitionUnavailable(
        f"workflow definition {definition_id!r} has no AVAILABLE version in scope "
        f"{start_scope!r} or the default scope",
        definition_id=definition_id,
    )


# --------------------------------------------------------------------------
# Pin admission and declared signals (caller's transaction)
# --------------------------------------------------------------------------


def admit_pin(
    scope_key: str,
    definition_id: str,
    version: int,
    plan_hash: str,
    *,
    resurrection: bool = False,
) -> None:
    """Admit an instance pin ``(scope_key, definition_id, version)`` with ``plan_hash``.

    Runs in the caller's transaction (which it requires), before the pin is
    written: ``lock_timeout`` and the shared id lock in one statement (starts
    share it; a lifecycle mutation of the id waits for them), then the id's
    rows in a second statement, whose snapshot follows the lock.

    * No row of the id: admitted at READ COMMITTED; refused under REPEATABLE
      READ / SERIALIZABLE, whose snapshot cannot tell absence from a newly
      managed id (there the rows are read ``FOR SHARE``).
    * Otherwise the exact row must exist with ``plan_hash`` and be AVAILABLE
      (or DEPRECATED when ``resurrection``); rows of other scopes and versions
      play no part.

    A refusal is :class:`DefinitionUnavailable` (a ``WorkflowConflict``,
    ``INVALID_TRANSITION: ...``). A lock wait over the timeout is, as in the
    reference, the data-access error of the caller's transaction: Django's
    ``OperationalError`` with SQLSTATE 55P03 (:func:`lock_timeout_error`
    makes the retryable :class:`WorkflowPersistenceError` naming the id for a
    runner that owns the transaction). Called directly in the caller's
    ``atomic`` block, that block is then marked for rollback (unusable): run
    it again as a whole. The lock_timeout stays set for the rest of the
    caller's transaction.
    """
    alias = db.alias()
    connection = connections[alias]
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "admit_pin runs in the caller's transaction: call it inside "
            f"transaction.atomic(using={alias!r})"
        )
    try:
        # prepared, as every start runs them
        with transaction.atomic(using=alias, savepoint=False), db.prepared_cursor() as cursor:
            cursor.execute(ADMIT_LOCK_SHARED, [_lock_timeout(), definition_id])
            _, isolation, _ = cursor.fetchone()
            read_committed = isolation == "read committed"
            cursor.execute(PIN_ROWS if read_committed else PIN_ROWS_FOR_SHARE, [definition_id])
            rows = cursor.fetchall()
    except DatabaseError as exc:
        error = admission_error(exc, definition_id)
        if error is exc:
            raise
        raise error from exc
    check_admission(
        rows, isolation, scope_key, definition_id, version, plan_hash, resurrection=resurrection
    )


def admission_error(exc: DatabaseError, definition_id: str) -> Exception:
    """What a failed admission statement raises: ``exc`` itself or the package error.

    A lock wait over the timeout (55P03) stays the data-access error of the
    caller's transaction; other errors are mapped as :func:`_translated` says.
    """
    if db.sqlstate(exc) == "55P03":
        return exc
    return _translated(exc, definition_id) or exc


def admission_lock_timeout() -> str:
    """The ``lock_timeout`` every admission sets for its transaction (``'30000ms'``)."""
    return _lock_timeout()


def check_admission(
    rows: Sequence[Sequence[Any]],
    isolation: str,
    scope_key: str,
    definition_id: str,
    version: int,
    plan_hash: str,
    *,
    resurrection: bool = False,
) -> None:
    """The admission rule over the id's rows read under the shared lock (``PIN_ROWS``).

    The rule of :func:`admit_pin` and of a start's pipelined admission
    (:mod:`.pipelined_start`, whose record is also guarded by the same rule
    in SQL, ``ADMITTED_AT_READ_COMMITTED``): returns when the pin is
    admitted, raises :class:`DefinitionUnavailable` otherwise.
    """
    key = _key(scope_key, definition_id, version)
    if not rows:
        if isolation == "read committed":
            return
        raise _invalid_transition(
            definition_id,
            f"pin {key} refused: no registry row of {definition_id!r} is visible to this "
            f"{isolation.upper()} transaction",
        )
    for row_scope, row_version, status, row_hash in rows:
        if row_scope != scope_key or row_version != version:
            continue
        if row_hash != plan_hash:
            raise _invalid_transition(
                definition_id,
                f"pin {key} refused: the plan hash differs from the registered one (drift)",
            )
        allowed = ("AVAILABLE", "DEPRECATED") if resurrection else ("AVAILABLE",)
        if status not in allowed:
            raise _invalid_transition(definition_id, f"pin {key} refused: the version is {status}")
        return
    raise _invalid_transition(definition_id, f"pin {key} refused: the registry has no such version")


def declared_signal_names(
    scope_key: str, definition_id: str, version: int
) -> dict[str, Any] | None:
    """The pinned row's declared signals (name -> payload schema or None).

    None (no row, or signals not recorded) means every signal name is admitted.
    Runs on the caller's connection and transaction.
    """
    return signal_declaration(scope_key, definition_id, version)[1]


def signal_declaration(
    scope_key: str, definition_id: str, version: int
) -> tuple[bool, dict[str, Any] | None]:
    """``(row found, declared signals)`` of the pinned row, in the caller's transaction.

    Tells a missing row (an instance pinned from a node's catalog before any
    executor recorded the definition) from a row whose ``signal_names_json``
    is NULL (written before the column existed: every name is admitted).
    """
    # prepared: every signal() reads it
    row = db.fetchone_prepared(SIGNAL_NAMES, [scope_key, definition_id, version])
    if row is None:
        return False, None
    value = _load(row[0])
    return True, value if isinstance(value, dict) else None


def fill_signal_schemas(plan: PlanLike) -> int | None:
    """The guarded fill of a CODE row's NULL schema columns, on a connection of its own.

    For a node that resolved ``plan`` outside the executor's sync (a
    record-only node, or a row recorded before the columns existed): the same
    ``FILL_SIGNAL_SCHEMAS`` statement as :func:`upsert_code`'s unchanged-hash
    path, guarded by both columns being NULL and the row holding
    ``plan.plan_hash``. It runs as one autocommit statement on a new
    connection, never in the caller's transaction: a caller that rolls back
    does not undo it, and it takes no lock the caller could later wait on.
    Its lock wait is short (``FILL_LOCK_TIMEOUT_MS``): the caller's own open
    transaction may hold the row (a registry change earlier in it), and the
    caller would then wait on itself; a fill that cannot get the row at once
    is simply tried again later, and an executing node's sync fills the row
    too. Returns the rows filled (0 or 1), or None when the statement failed
    (logged with its SQLSTATE; the next resolution tries again).
    """
    params = [
        _dump(dict(plan.signals)),
        _dump(plan.start_schema),
        plan.id,
        int(plan.version),
        plan.plan_hash,
    ]
    connection = connections.create_connection(db.alias())
    try:
        with connection.cursor() as cursor:
            cursor.execute(SET_SESSION_LOCK_TIMEOUT, [f"{FILL_LOCK_TIMEOUT_MS}ms"])
            cursor.execute(FILL_SIGNAL_SCHEMAS, params)
            return int(cursor.rowcount)
    except DatabaseError as exc:
        logger.warning(
            "workflow definition %s version %s: the signal schema fill failed (SQLSTATE %s); "
            "it is tried again at the next plan resolution",
            plan.id,
            plan.version,
            db.sqlstate(exc),
        )
        return None
    finally:
        connection.close()


# --------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------


def transition(
    scope_key: str, definition_id: str, version: int, from_status: str, to_status: str
) -> None:
    """Change a row's status from ``from_status`` to ``to_status`` under the id lock.

    Accepted pairs: AVAILABLE -> DEPRECATED, DEPRECATED -> AVAILABLE and
    RETIRED -> AVAILABLE; any other pair is refused before any statement. A
    missing row or a row no longer in ``from_status`` is refused, and so is
    moving a default-scope row the default activation names off AVAILABLE.
    Reinstating a RETIRED row re-applies the contract and state-type rules
    (a version of another contract may have been loaded since). The store
    does not check that an executable source exists: the lifecycle does.

    Refusals are :class:`WorkflowConflict` (``INVALID_TRANSITION: ...``) or,
    for the rules, :class:`WorkflowDefinitionError`.
    """
    if (from_status, to_status) not in TRANSITIONS:
        allowed = ", ".join(f"{a} -> {b}" for a, b in sorted(TRANSITIONS))
        raise _invalid_transition(
            definition_id,
            f"definition {_key(scope_key, definition_id, version)}: {from_status} -> "
            f"{to_status} is not a registry transition (allowed: {allowed})",
        )
    key = _key(scope_key, definition_id, version)
    with _mutation(definition_id) as (cursor, rows):
        row = _find(rows, scope_key, version)
        if row is None:
            raise _invalid_transition(definition_id, f"definition {key} does not exist")
        if row.status != from_status:
            raise _invalid_transition(
                definition_id, f"definition {key} is {row.status}, not {from_status}"
            )
        if from_status == "AVAILABLE":
            _guard_default_current(cursor, scope_key, definition_id, version)
        if from_status == "RETIRED":
            _check_version_rules(
                rows, scope_key, definition_id, version, row.contract_name, row.state_type_name
            )
            _check_default_contract(rows, scope_key, definition_id, version, row.contract_name)
        cursor.execute(SET_STATUS, [to_status, scope_key, definition_id, version, from_status])
        if cursor.rowcount != 1:
            raise _invalid_transition(definition_id, f"definition {key} changed concurrently")


def retire(scope_key: str, definition_id: str, version: int) -> None:
    """Move a CANDIDATE or DEPRECATED row to RETIRED under the id lock.

    Checks, in order: the row exists, its status, that the default activation
    does not name it, and for a DEPRECATED row that no PENDING, RUNNING,
    WAITING or COMPENSATING instance (archived ones included) is pinned to
    exactly this definition scope, id and version. AVAILABLE rows cannot
    retire: deprecate them first. Refusals are :class:`WorkflowConflict`.
    """
    key = _key(scope_key, definition_id, version)
    with _mutation(definition_id) as (cursor, rows):
        row = _find(rows, scope_key, version)
        if row is None:
            raise _invalid_transition(definition_id, f"definition {key} does not exist")
        if row.status not in ("CANDIDATE", "DEPRECATED"):
            raise _invalid_transition(
                definition_id,
                f"definition {key} is {row.status}; only CANDIDATE or DEPRECATED versions "
                "retire (deprecate it first)",
            )
        _guard_default_current(cursor, scope_key, definition_id, version)
        if row.status == "DEPRECATED":
            cursor.execute(COUNT_PINNED_INSTANCES, [scope_key, definition_id, version])
            (pinned,) = cursor.fetchone()
            if pinned:
                raise _invalid_transition(
                    definition_id,
                    f"definition {key} still pins {pinned} unfinished instance(s) "
                    "(PENDING, RUNNING, WAITING or COMPENSATING); let them end or migrate them",
                )
        cursor.execute(SET_STATUS, ["RETIRED", scope_key, definition_id, version, row.status])
        if cursor.rowcount != 1:
            raise _invalid_transition(definition_id, f"definition {key} changed concurrently")


# --------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------


def put_activation(scope_key: str, definition_id: str, target_scope_key: str, version: int) -> None:
    """Make ``(target_scope_key, definition_id, version)`` the current version of the id
    in ``scope_key`` (insert or replace the scope's record), under the id lock.

    The target scope is the scope itself or ``default`` (the default scope
    names only itself); the target row must exist and be AVAILABLE
    (:class:`WorkflowConflict` ``INVALID_TRANSITION`` naming it). A scope
    following a default-scope version of another contract than the scope's
    own live rows of the id is refused with :class:`ContractMismatch`.
    """
    if target_scope_key not in (scope_key, DEFAULT_SCOPE):
        raise WorkflowValidationError(
            f"an activation in scope {scope_key!r} names a version of that scope or of the "
            f"default scope, not of {target_scope_key!r}"
        )
    target_key = _key(target_scope_key, definition_id, version)
    with _mutation(definition_id) as (cursor, rows):
        target = _find(rows, target_scope_key, version)
        if target is None:
            raise _invalid_transition(
                definition_id, f"activation target {target_key} does not exist"
            )
        if target.status != "AVAILABLE":
            raise _invalid_transition(
                definition_id, f"activation target {target_key} is {target.status}, not AVAILABLE"
            )
        if scope_key != target_scope_key:
            for own in rows:
                if (
                    own.scope_key == scope_key
                    and own.status in RULED_STATUSES
                    and own.contract_name != target.contract_name
                ):
                    raise ContractMismatch(
                        f"scope {scope_key!r} cannot follow {target_key} (contract "
                        f"{target.contract_name!r}): its own version {own.version} of "
                        f"{definition_id!r} names contract {own.contract_name!r}",
                        definition_id=definition_id,
                    )
        cursor.execute(PUT_ACTIVATION, [scope_key, definition_id, target_scope_key, version])


def remove_activation(scope_key: str, definition_id: str) -> bool:
    """Delete the scope's activation record of the id (under the id lock).

    An absent record is accepted; returns whether a record was deleted.
    """
    with _mutation(definition_id) as (cursor, _rows):
        cursor.execute(DELETE_ACTIVATION, [scope_key, definition_id])
        return cursor.rowcount > 0


# --------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------


def list_definitions(
    scope: str | None = None,
    definition_id: str | None = None,
    statuses: Collection[str] | None = None,
) -> list[DefinitionRecord]:
    """Registry rows by optional scope, id and status set, ordered by id, scope,
    version. Never reads document text."""
    status_list = None if statuses is None else sorted(statuses)
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(
            LIST_DEFINITIONS,
            [scope, scope, definition_id, definition_id, status_list, status_list],
        )
        fetched = cursor.fetchall()
    records = []
    for row in fetched:
        values = list(row)
        values[11] = _known_failure(values[11])
        records.append(DefinitionRecord(*values))
    return records


def find_definition(scope_key: str, definition_id: str, version: int) -> DefinitionRecord | None:
    """The registry row ``(scope_key, definition_id, version)`` (metadata only), or None."""
    for record in list_definitions(scope=scope_key, definition_id=definition_id):
        if record.version == version:
            return record
    return None


def list_activations(
    scope: str | None = None, definition_id: str | None = None
) -> list[Activation]:
    """Activation records by optional scope and id, ordered by id then scope."""
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(LIST_ACTIVATIONS, [scope, scope, definition_id, definition_id])
        return [Activation(*row) for row in cursor.fetchall()]


# --------------------------------------------------------------------------
# Code changes: name bindings, stranded instances, instance counts
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class BoundNames:
    """A non-retired version and the classes it binds (binary name -> hashed name)."""

    scope_key: str
    definition_id: str
    version: int
    status: str
    name_binding: dict[str, str]


def bound_names() -> list[BoundNames]:
    """Every non-retired row whose ``name_binding`` is not empty (any scope and kind)."""
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(BOUND_NAMES)
        fetched = cursor.fetchall()
    found = []
    for scope_key, definition_id, version, status, binding in fetched:
        value = _load(binding)
        if isinstance(value, dict) and value:
            found.append(
                BoundNames(
                    scope_key,
                    definition_id,
                    version,
                    status,
                    {str(k): str(v) for k, v in value.items()},
                )
            )
    return found


@dataclass(frozen=True)
class RuleRow:
    """What the scope-row rules read of a non-retired row (no text).

    ``failure_reason`` is the stored value as is (an unknown reason too), so
    an evaluation can tell whether the column needs rewriting.
    """

    scope_key: str
    definition_id: str
    version: int
    kind: str
    status: str
    state_type_name: str
    plan_hash: str
    name_binding: dict[str, str]
    failure_reason: str | None


def scope_rule_rows(definition_id: str | None = None) -> list[RuleRow]:
    """Every non-retired DOCUMENT row of a scope other than default, with the non-retired
    default-scope rows of the same ids (of ``definition_id`` only, when given).

    One plain statement on the caller's connection and transaction: no lock,
    no write, no document text (a start may call it).
    """
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(SCOPE_RULE_ROWS, [definition_id, definition_id])
        fetched = cursor.fetchall()
    found = []
    for (
        scope_key,
        row_id,
        version,
        kind,
        status,
        state_type,
        plan_hash,
        binding,
        failure,
    ) in fetched:
        value = _load(binding)
        found.append(
            RuleRow(
                scope_key,
                row_id,
                version,
                kind,
                status,
                state_type,
                plan_hash,
                {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {},
                failure,
            )
        )
    return found


def stranded_instances(
    resident_steps: Mapping[tuple[str, int], Collection[str]],
) -> list[tuple[str, int, str, int]]:
    """(definition id, version, step, count) of unfinished instances standing at a step the
    given code plan of their version lacks.

    ``resident_steps`` maps each default-scope (id, version) this node holds
    code for to its step ids; versions not in it are not read (a node without
    the code of a version defers its commands instead). Unfinished means not
    ended, FAILED included (a retry can repair those once the step is back);
    archived rows are left out. One statement; it scans the instances of the
    given versions (no index covers the step), so it runs at startup and in
    checks only.
    """
    if not resident_steps:
        return []
    keys = sorted(resident_steps)
    step_rows = [(key[0], key[1], step) for key in keys for step in sorted(resident_steps[key])]
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(
            STRANDED_INSTANCES,
            {
                "ids": [key[0] for key in keys],
                "versions": [key[1] for key in keys],
                "step_ids": [row[0] for row in step_rows],
                "step_versions": [row[1] for row in step_rows],
                "steps": [row[2] for row in step_rows],
            },
        )
        return [(r[0], int(r[1]), r[2], int(r[3])) for r in cursor.fetchall()]


def instance_counts(
    scope: str | None = None, definition_id: str | None = None
) -> dict[tuple[str, str, int], tuple[int, int]]:
    """``{(scope, id, version): (live, failed)}`` in one grouped read.

    ``live`` counts PENDING, RUNNING, WAITING and COMPENSATING instances (what
    blocks retirement, archived rows included, as there); ``failed`` counts
    FAILED instances that are not archived. Versions with neither are absent.
    """
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(INSTANCE_COUNTS, [scope, scope, definition_id, definition_id])
        return {(r[0], r[1], int(r[2])): (int(r[3]), int(r[4])) for r in cursor.fetchall()}
