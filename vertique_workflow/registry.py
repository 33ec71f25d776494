"""The definition registry bootstrap and lifecycle.

At startup an executing node records every code-first workflow of its
catalog as a CODE row of the default scope (:func:`sync_code_definitions`)
and every packaged document of ``DOCUMENT_DIRS`` as an AVAILABLE DOCUMENT
row of the default scope (:func:`sync_document_definitions`), then compiles
the stored documents of every scope it may have to run
(:func:`restore_documents`) and evaluates the document rows of the other
scopes (:mod:`vertique_workflow.scope_rules`); :func:`ensure_synced` runs
them once per process. A record-only node (``VERTIQUE_WORKFLOW["EXECUTOR_ENABLED"] =
False``) writes no row.

At runtime :func:`load_document` writes a document as a CANDIDATE and
:func:`publish` makes it AVAILABLE through the fenced publication claim.
The lifecycle functions (:func:`deprecate`, :func:`reinstate`,
:func:`retire`, :func:`activate`, :func:`deactivate`) are what the
``workflow_definitions`` management command and the admin call, for CODE
and DOCUMENT rows alike; the SQL and the guards live in
:mod:`vertique_workflow.store.definitions` and
:mod:`vertique_workflow.store.documents`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import document_plans
from .conf import workflow_settings
from .exceptions import (
    DocumentTooLarge,
    WorkflowDefinitionError,
    WorkflowError,
    WorkflowNotFound,
)
from .store import definitions as store
from .store import documents as document_store
from .store.definitions import DEFAULT_SCOPE, DefinitionRecord, PlanLike, UpsertOutcome
from .store.documents import DocumentOutcome

if TYPE_CHECKING:
    from collections.abc import Mapping

    class PlanLikeWithSteps(PlanLike, Protocol):
        """A plan and its step ids (``vertique_workflow.definitions.Plan`` fits)."""

        @property
        def steps(self) -> Mapping[str, object]: ...


__all__ = [
    "DOCUMENT_SUFFIXES",
    "Stranded",
    "activate",
    "check_name_bindings",
    "deactivate",
    "deprecate",
    "ensure_synced",
    "load_document",
    "load_document_outcome",
    "packaged_documents",
    "publish",
    "reinstate",
    "restore_documents",
    "retire",
    "stranded_instances",
    "stranded_summary",
    "sync_code_definitions",
    "sync_document_definitions",
]

# packaged document files by suffix, and the format each is compiled as
DOCUMENT_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}

logger = logging.getLogger("vertique_workflow.registry")

_sync_lock = threading.Lock()
_synced = False


def sync_code_definitions(
    plans: Iterable[PlanLike] | None = None, *, activate_default: bool | None = None
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

    ``activate_default`` (default: the ``ACTIVATE_ON_DEPLOY`` setting) makes
    an INSERTED version the default scope's current one when it is the
    highest; set it False for a rolling deploy and activate later.
    """
    if activate_default is None:
        activate_default = bool(workflow_settings.ACTIVATE_ON_DEPLOY)
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

    Only default-scope rows (CODE rows and packaged documents: what this
    deployment ships) stop the startup. A DOCUMENT row of another scope,
    loaded at runtime, is evaluated instead (``NAME_BINDING_UNRESOLVED``, see
    :mod:`vertique_workflow.scope_rules`): marked, and refused for new
    starts by the nodes that cannot resolve it.
    """
    from .definitions.plan import resolve_class_name

    for row in store.bound_names():
        if row.scope_key != DEFAULT_SCOPE:
            continue
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


def ensure_synced() -> dict[tuple[str, int], str] | None:
    """Run the startup sync once per process (thread-safe).

    :func:`sync_code_definitions`, then :func:`sync_document_definitions`
    (the packaged documents of ``DOCUMENT_DIRS``), then
    :func:`restore_documents`, then the evaluation of the other scopes'
    document rows (:func:`vertique_workflow.scope_rules.evaluate_scope_rows`:
    failure marks written or cleared, and the starts this node refuses).
    Returns the outcomes of both syncs when this
    call ran them, None when they had already run or when this node records
    only (``EXECUTOR_ENABLED`` False: a record-only node writes no rows). A
    failed sync is not remembered, so the next call tries again.
    """
    global _synced
    if not workflow_settings.EXECUTOR_ENABLED or _synced:
        return None
    with _sync_lock:
        if _synced:
            return None
        outcomes: dict[tuple[str, int], str] = dict(sync_code_definitions())
        outcomes.update(sync_document_definitions())
        restore_documents()
        from .scope_rules import evaluate_scope_rows

        evaluate_scope_rows()
        _synced = True
        return outcomes


def _reset_sync_state() -> None:
    """Forget that the sync ran (tests)."""
    global _synced
    with _sync_lock:
        _synced = False


# --------------------------------------------------------------------------
# Documents: packaged (startup), loaded and published (runtime), restored
# --------------------------------------------------------------------------


def packaged_documents(dirs: Iterable[str | Path] | None = None) -> list[Path]:
    """The document files of ``dirs`` (default ``DOCUMENT_DIRS``), by folder then name.

    Only the top level of each folder is read; files whose suffix is not
    ``.yaml``, ``.yml`` or ``.json`` are ignored. A configured folder that
    does not exist is a :class:`WorkflowDefinitionError` (a typo would
    otherwise silently ship no definitions).
    """
    folders = list(workflow_settings.DOCUMENT_DIRS if dirs is None else dirs)
    found: list[Path] = []
    for folder in folders:
        path = Path(folder)
        if not path.is_dir():
            raise WorkflowDefinitionError(f"DOCUMENT_DIRS names {str(path)!r}, not a folder")
        found.extend(
            sorted(
                entry
                for entry in path.iterdir()
                if entry.is_file() and entry.suffix.lower() in DOCUMENT_SUFFIXES
            )
        )
    return found


def _read_document(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkflowDefinitionError(
            f"definition document {str(path)!r} is not UTF-8 (byte {exc.start})"
        ) from None


def sync_document_definitions(
    dirs: Iterable[str | Path] | None = None, *, activate_default: bool | None = None
) -> dict[tuple[str, int], str]:
    """Record every packaged document as an AVAILABLE DOCUMENT row of the default scope.

    Each file of :func:`packaged_documents` is compiled first (a bad file
    raises the compiler's error naming its path and line, and writes
    nothing), then recorded by
    :func:`vertique_workflow.store.documents.upsert_document` in its own
    transaction: ``INSERTED`` (and, with ``activate_default``, default:
    ``ACTIVATE_ON_DEPLOY``, the default activation when it is the highest
    version), ``UNCHANGED``, or a refusal (drift: the same plan hash with
    another text; another plan hash under the version; a CODE row) that
    stops the sync. The compiled plan is registered on this node. Logs one
    INFO line per document; returns ``{(id, version): outcome}``.
    """
    if activate_default is None:
        activate_default = bool(workflow_settings.ACTIVATE_ON_DEPLOY)
    outcomes: dict[tuple[str, int], str] = {}
    for path in packaged_documents(dirs):
        document_format = DOCUMENT_SUFFIXES[path.suffix.lower()]
        text = _read_document(path)
        plan = document_plans.compile_text(text, document_format=document_format, source=str(path))
        outcome = document_store.upsert_document(
            DEFAULT_SCOPE,
            plan,
            text,
            document_format,
            str(path),
            activate_default=activate_default,
        )
        document_plans.register(DEFAULT_SCOPE, plan)
        outcomes[(plan.id, int(plan.version))] = outcome
        logger.info(
            "workflow document %s version %s hash %s (%s): %s",
            plan.id,
            plan.version,
            plan.plan_hash[:12],
            path.name,
            outcome,
        )
    return outcomes


def restore_documents() -> list[tuple[str, str, int]]:
    """Compile the AVAILABLE and DEPRECATED documents of every scope on this node.

    What the executor may have to run is ready before its first claim, and
    a stored document that cannot be rebuilt shows at startup. A row outside
    the size envelope fails the startup (:class:`DocumentTooLarge`: the
    configured ``DOCUMENT_INPUT_LIMIT`` is below a stored source); any other
    failure (drift, a compile error, another plan hash here) is logged once
    and leaves the pin without a plan here, so its commands are deferred.
    Returns the pins restored.
    """
    restored: list[tuple[str, str, int]] = []
    for record in store.list_definitions(statuses=("AVAILABLE", "DEPRECATED")):
        if record.kind != "DOCUMENT":
            continue
        pin = (record.scope_key, record.definition_id, record.version)
        try:
            plan = document_plans.build(*pin)
        except DocumentTooLarge:
            raise
        except WorkflowError as exc:
            document_plans.log_failure(pin, exc)
            continue
        if plan is not None:
            restored.append(pin)
    return restored


def load_document(
    text: str,
    *,
    format: str,
    scope: str = DEFAULT_SCOPE,
    source: str | None = None,
) -> DefinitionRecord:
    """Compile a document and write it as a CANDIDATE of ``scope``; returns its record.

    The compile comes first: a malformed or hostile document raises the
    compiler's ``DocumentError`` (naming the path and line) and writes
    nothing. The candidate is not startable until :func:`publish`; the
    registry's refusals (the same key with another text, the contract and
    state-type rules, the default-scope contract rule) also write nothing.
    Loading the very same text again is a no-op that returns the stored
    record (whatever its status; :func:`load_document_outcome` tells the
    two apart). ``source`` is attribution only (a file name, a URL it came
    from), never fetched.
    """
    return load_document_outcome(text, format=format, scope=scope, source=source)[0]


def load_document_outcome(
    text: str,
    *,
    format: str,
    scope: str = DEFAULT_SCOPE,
    source: str | None = None,
) -> tuple[DefinitionRecord, DocumentOutcome]:
    """:func:`load_document`, with what happened: ``"INSERTED"`` or ``"UNCHANGED"``.

    ``"UNCHANGED"``: the key already holds a DOCUMENT row with this text
    (same digest) and plan hash; nothing was written, the stored record is
    returned. Re-running a deploy step is therefore safe, while another text
    under an existing key stays refused (:class:`DefinitionUnavailable`).
    """
    from .definitions.documents import DOCUMENT_FORMATS

    plan = document_plans.compile_text(text, document_format=format, source=source)
    canonical = DOCUMENT_FORMATS[str(format).lower()]  # the compiler accepted it
    return document_store.load_candidate(scope, plan, text, canonical, source)


def publish(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> DefinitionRecord:
    """CANDIDATE -> AVAILABLE: claim, compile and register here, complete.

    The claim (a fresh ``publish_token``, status PUBLISHING) fences
    concurrent publishers; this node then reads the stored text through the
    guarded read (envelope, digest), compiles it with its own catalogs,
    checks the plan hash against the row and registers the plan locally,
    and completes the claim. Any failure releases the claim (the row is a
    CANDIDATE again) and is raised; a claim that went stale and was taken by
    another publisher meanwhile makes the completion fail
    (``INVALID_TRANSITION``: obsolete claim) and its release a no-op.
    """
    token = document_store.claim_publication(scope, definition_id, version)
    try:
        plan = document_plans.build(scope, definition_id, version)
        if plan is None:  # the claim saw the row; it cannot vanish under the id lock
            raise WorkflowNotFound(
                f"workflow definition {scope}/{definition_id} v{version} does not exist"
            )
        return document_store.complete_publication(scope, definition_id, version, token)
    except BaseException:
        try:
            document_store.release_publication(scope, definition_id, version, token)
        except WorkflowError as released:  # keep the publication's own error
            logger.warning(
                "workflow definition %s/%s v%s: releasing the publication claim failed (%s); "
                "the claim goes stale after PUBLICATION_CLAIM_TIMEOUT_SECONDS",
                scope,
                definition_id,
                version,
                released,
            )
        raise


# --------------------------------------------------------------------------
# Lifecycle
# --------------------------------------------------------------------------


def deprecate(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> None:
    """AVAILABLE -> DEPRECATED: no new start selects or pins the version; running
    instances continue. Refused for the current default version."""
    store.transition(scope, definition_id, version, "AVAILABLE", "DEPRECATED")


def reinstate(definition_id: str, version: int, scope: str = DEFAULT_SCOPE) -> None:
    """DEPRECATED or RETIRED -> AVAILABLE.

    The row must have an executable source on this node with the registered
    hash, else :class:`WorkflowDefinitionError` and nothing changes: for a
    CODE row the code plan of that id and version, for a DOCUMENT row its
    stored text, read through the guarded read and compiled here.
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
    elif row.kind == "DOCUMENT":
        document_plans.build(scope, definition_id, version)
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
