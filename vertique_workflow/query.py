"""Read models: instance lists, history pages and the non-terminal count.

Management screens and operational tools page through instances and
histories here; nothing in this module writes or locks. Lists are keyset
pages: a page is as fast at the millionth row as at the first, and a page
boundary never skips or repeats a row because of rows inserted meanwhile
(they sort before the cursor). ``wf.get(id)`` reads one instance in full
(state included); the list rows are summaries without state.

Scope filters are an exact match (None: every scope). They are information
and a filter, not an isolation or authorization boundary (the reference).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from .exceptions import WorkflowNotFound, WorkflowValidationError
from .models import InstanceStatus
from .operations import DEFAULT_SCOPE, _uuid
from .store import db, read_models
from .store import instances as instances_store

STATUSES = frozenset(InstanceStatus.values)


@dataclass(frozen=True)
class InstanceSummary:
    """One row of an instance list: the snapshot row without its state.

    Fields in the order of ``store.read_models.INSTANCE_COLUMNS`` (the row is
    built from it positionally).

    ``archived_at`` is set on rows retention archived (listed only with
    ``include_archived=True``).
    """

    id: uuid.UUID
    definition_id: str
    definition_version: int
    status: str
    current_step: str | None
    business_key: str | None
    scope: str
    error_type: str | None
    error_message: str | None
    version: int
    created_at: datetime.datetime
    updated_at: datetime.datetime
    completed_at: datetime.datetime | None
    archived_at: datetime.datetime | None


@dataclass(frozen=True)
class InstancePage:
    """A page of :func:`instances`; ``next_cursor`` is None on the last page."""

    items: list[InstanceSummary]
    next_cursor: str | None

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class HistoryEntryView:
    """One history entry with its attribution, decision and versions.

    ``patch`` is the JSON patch of a DECISION entry (``STATE_BASELINE``
    entries carry the whole state in ``payload``); ``state_version_before``
    / ``_after`` are the instance versions around it; ``definition_*`` and
    ``plan_hash`` name the plan that made the decision. The actor fields
    say who caused it (``actor_kind`` USER, SYSTEM, ... or NONE).
    """

    sequence: int
    event_type: str
    step_id: str | None
    outcome: str | None
    payload: Any
    patch: Any
    entry_version: int
    state_version_before: int | None
    state_version_after: int | None
    command_id: int | None
    executor_id: str | None
    definition_scope: str | None
    definition_id: str | None
    definition_version: int | None
    plan_hash: str | None
    actor_kind: str | None
    actor_id: str | None
    actor_reason: str | None
    on_behalf_of: str | None
    attribution_status: str | None
    created_at: datetime.datetime


@dataclass(frozen=True)
class OpenCommandView:
    """A command of the instance that is not settled (active, PARKED or DEAD)."""

    id: int
    seq: int
    kind: str
    state: str
    timer_kind: str | None
    task_id: uuid.UUID | None
    signal_name: str | None
    dedup_key: str | None
    attempts: int
    recorded_at: datetime.datetime
    available_at: datetime.datetime | None
    fire_at: datetime.datetime | None
    claimed_by: str | None
    lease_until: datetime.datetime | None
    last_error: str | None
    actor_kind: str | None
    actor_id: str | None


@dataclass(frozen=True)
class HistoryPage:
    """A page of :func:`history` and the instance's open commands (read alongside)."""

    instance_id: uuid.UUID
    entries: list[HistoryEntryView]
    open_commands: list[OpenCommandView]
    next_cursor: str | None

    def state_at(self, sequence: int) -> Any:
        """The state right after entry ``sequence`` (``wf.state_at``), from the decision log."""
        from .operations import state_at

        return state_at(self.instance_id, sequence)


def _statuses(status: str | Iterable[str] | None) -> list[str] | None:
    if status is None:
        return None
    wanted = [status] if isinstance(status, str) else list(status)
    unknown = sorted(str(s) for s in wanted if s not in STATUSES)
    if unknown or not wanted:
        raise WorkflowValidationError(
            f"status must be one or more of {', '.join(sorted(STATUSES))}"
            + (f"; not {', '.join(unknown)}" if unknown else "")
        )
    return wanted


def _instant(value: Any, name: str) -> datetime.datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime.datetime):
        raise WorkflowValidationError(f"{name} must be a datetime")
    if settings.USE_TZ and value.tzinfo is None:
        raise WorkflowValidationError(f"{name} must be an aware datetime (USE_TZ is on)")
    return value


def _limit(value: Any, name: str = "limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkflowValidationError(f"{name} must be a positive integer")
    return value


def instances(
    *,
    scope: str | None = None,
    status: str | Iterable[str] | None = None,
    definition_id: str | None = None,
    definition_version: int | None = None,
    business_key: str | None = None,
    updated_after: datetime.datetime | None = None,
    updated_before: datetime.datetime | None = None,
    include_archived: bool = False,
    limit: int = 50,
    cursor: str | None = None,
) -> InstancePage:
    """Instances, most recently changed first, one keyset page at a time.

    Every filter given must hold: ``scope`` exactly (None: every scope),
    ``status`` one status or several, ``definition_id`` (and
    ``definition_version``), ``business_key`` exactly, ``updated_after``
    (inclusive) and ``updated_before`` (exclusive) as aware datetimes.
    Archived instances are hidden unless ``include_archived``. ``limit`` is
    capped at 500. Pass the page's ``next_cursor`` as ``cursor`` for the next
    page, with the same filters; a cursor this function did not write raises
    ``WorkflowValidationError``. The order is ``(updated_at DESC, id)``: an
    instance that changes while you page moves to the front and may be seen
    again or not at all, but rows inserted meanwhile never shift a page.
    """
    if definition_version is not None and (
        isinstance(definition_version, bool) or not isinstance(definition_version, int)
    ):
        raise WorkflowValidationError("definition_version must be an integer")
    filters = {
        "scope": scope,
        "statuses": _statuses(status),
        "definition_id": definition_id,
        "definition_version": definition_version,
        "business_key": business_key,
        "updated_after": _instant(updated_after, "updated_after"),
        "updated_before": _instant(updated_before, "updated_before"),
        "include_archived": bool(include_archived),
        "limit": min(_limit(limit), read_models.QUERY_LIMIT_MAX),
        "cursor": cursor,
    }
    try:
        page = read_models.instance_page(**filters)
    except ValueError:
        raise WorkflowValidationError("the cursor is not an instance-list cursor") from None
    except DatabaseError as exc:
        raise db.translate(exc, "list instances") from None
    items = [InstanceSummary(*row) for row in page.rows]
    return InstancePage(items, page.next_cursor)


def history(
    instance_id: Any,
    *,
    limit: int = 100,
    cursor: str | None = None,
    newest_first: bool = False,
) -> HistoryPage:
    """A page of an instance's history (oldest first unless ``newest_first``).

    Each entry carries its attribution, decision outcome and patch, and the
    versions around it; the page also lists the instance's open commands
    (what it is waiting on or what failed). ``limit`` is capped at 1000;
    ``next_cursor`` continues in the same direction. The history of an
    archived instance is still readable; a purged one raises
    ``WorkflowNotFound``. ``page.state_at(sequence)`` rebuilds the state
    after any entry.
    """
    workflow_id = _uuid(instance_id)
    limit = min(_limit(limit), read_models.HISTORY_LIMIT_MAX)
    try:
        if instances_store.get(workflow_id) is None:
            raise WorkflowNotFound("no workflow instance with that id")
        rows, next_cursor = read_models.history_page(
            workflow_id, limit=limit, newest_first=bool(newest_first), cursor=cursor
        )
        commands = read_models.open_commands(workflow_id)
    except ValueError:
        raise WorkflowValidationError("the cursor is not a history cursor") from None
    except DatabaseError as exc:
        raise db.translate(exc, "read history") from None
    entries = [
        HistoryEntryView(
            sequence=r["sequence"],
            event_type=r["event_type"],
            step_id=r["step_id"],
            outcome=r["outcome"],
            payload=r["payload_json"],
            patch=r["patch_json"],
            entry_version=r["entry_version"],
            state_version_before=r["state_version_before"],
            state_version_after=r["state_version_after"],
            command_id=r["command_id"],
            executor_id=r["executor_id"],
            definition_scope=r["definition_scope_key"],
            definition_id=r["definition_id"],
            definition_version=r["definition_version"],
            plan_hash=r["plan_hash"],
            actor_kind=r["actor_kind"],
            actor_id=r["actor_id"],
            actor_reason=r["actor_reason"],
            on_behalf_of=r["on_behalf_of"],
            attribution_status=r["attribution_status"],
            created_at=r["created_at"],
        )
        for r in rows
    ]
    return HistoryPage(workflow_id, entries, [OpenCommandView(**c) for c in commands], next_cursor)


def count_non_terminal(definition_id: str, version: int, *, scope: str = DEFAULT_SCOPE) -> int:
    """PENDING, RUNNING, WAITING and COMPENSATING instances pinned to that exact version.

    As the reference's ``countNonTerminal``: scope-aware (the default scope
    unless given; only instances pinned to the definition's own scope),
    archived rows included. Informational: retirement takes its own count
    under the definition's lock.
    """
    if isinstance(version, bool) or not isinstance(version, int):
        raise WorkflowValidationError("version must be an integer")
    if not isinstance(definition_id, str) or not definition_id:
        raise WorkflowValidationError("definition_id must be a non-empty string")
    try:
        return read_models.count_non_terminal(scope, definition_id, version)
    except DatabaseError as exc:
        raise db.translate(exc, "count instances") from None
