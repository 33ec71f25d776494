"""workflow_tasks: human task rows (the reference's PgTaskStore and PgTaskReservations).

Statuses: OPEN -> COMPLETING (reserved by a COMPLETION command, named in
``reservation_command_id``) -> COMPLETED, or back to OPEN when the segment
rejects that command; OPEN/COMPLETING -> CANCELLED. Every change is a
compare-and-set on the status (and the reservation), so a change that lost a
race answers False instead of overwriting.

``candidates_json`` is ``{"users": [...], "groups": [...]}`` (Django auth user
names and group names). ``decisions_snapshot_json`` maps each declared
decision name to its declaration, ``{"approve": {"payloadSchema": {...},
"position": 0}, "reject": {"position": 1}}``: the payload schema is stored only
when the decision has one, and ``position`` (written by :func:`insert_open`)
keeps the declaration order, which jsonb does not.
Statements run in the caller's transaction; writers hold the execution lock
(lock order: timers, tasks, branch tokens, instances, queues).

A reservation is settled with its command wherever a COMPLETION settles
without running: a claim that finds the instance ended and the settlement of
an ended instance's dead letters cancel the task (``store.commands``). A dead
or FAILED completion keeps its task COMPLETING: ``retry`` offers that same
command again, and ``cancel()`` cancels COMPLETING tasks.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import db, keyset

T = db.T

OPEN_STATUSES = ("OPEN", "COMPLETING")
ENDED_STATUSES = ("COMPLETED", "CANCELLED")
QUERY_LIMIT_MAX = 500


@dataclass(frozen=True)
class TaskRow:
    """A task row, with its instance's definition id and status (joined)."""

    id: uuid.UUID
    workflow_id: uuid.UUID
    step_id: str
    name: str
    status: str
    assignee: str | None
    candidate_users: tuple[str, ...]
    candidate_groups: tuple[str, ...]
    decisions_snapshot: dict[str, Any]
    decision: str | None
    result: Any
    due_at: datetime.datetime | None
    branch_token_id: uuid.UUID | None
    fork_step_id: str | None
    branch_id: str | None
    version: int
    scope_key: str
    reservation_command_id: int | None
    require_version_stability: bool | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    completed_at: datetime.datetime | None
    definition_id: str | None = None
    instance_status: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATUSES


_COLUMNS = """t.id, t.workflow_id, t.step_id, t.name, t.status, t.assignee, t.candidates_json,
    t.decisions_snapshot_json, t.decision, t.result_json, t.due_at, t.branch_token_id,
    t.fork_step_id, t.branch_id, t.version, t.scope_key, t.reservation_command_id,
    t.require_version_stability, t.created_at, t.updated_at, t.completed_at,
    i.definition_id, i.status"""

SELECT = f"""
SELECT {_COLUMNS}
FROM {T["tasks"]} t LEFT JOIN {T["instances"]} i ON i.id = t.workflow_id
WHERE t.id = %s
"""

SELECT_FOR_UPDATE = SELECT + " FOR UPDATE OF t"

OPEN_FOR_STEP = f"""
SELECT {_COLUMNS}
FROM {T["tasks"]} t LEFT JOIN {T["instances"]} i ON i.id = t.workflow_id
WHERE t.workflow_id = %s AND t.step_id = %s AND t.status IN ('OPEN', 'COMPLETING')
ORDER BY t.created_at, t.id
"""

# scope_key comes from the owning instance row, never from the caller
# (the reference's insertOpen); due_at from the database clock for a delay.
INSERT_OPEN = f"""
INSERT INTO {T["tasks"]} (id, workflow_id, step_id, name, status, assignee, candidates_json,
    decisions_snapshot_json, due_at, branch_token_id, fork_step_id, branch_id, version,
    scope_key, require_version_stability, created_at, updated_at)
SELECT %(id)s, i.id, %(step)s, %(name)s, 'OPEN', %(assignee)s, %(candidates)s::jsonb,
       %(decisions)s::jsonb,
       CASE WHEN %(due_delay)s::double precision IS NOT NULL
            THEN clock_timestamp() + make_interval(secs => %(due_delay)s::double precision)
            ELSE %(due_at)s::timestamptz END,
       %(branch_token)s, %(fork_step)s, %(branch)s, 0, i.scope_key, %(stability)s, now(), now()
FROM {T["instances"]} i WHERE i.id = %(wf)s
"""

RESERVE = f"""
UPDATE {T["tasks"]}
SET status = 'COMPLETING', reservation_command_id = %s, version = version + 1,
    updated_at = now()
WHERE id = %s AND status = 'OPEN'
"""

REOPEN = f"""
UPDATE {T["tasks"]}
SET status = 'OPEN', reservation_command_id = NULL, version = version + 1, updated_at = now()
WHERE id = %s AND status = 'COMPLETING' AND reservation_command_id = %s
"""

MARK_COMPLETED = f"""
UPDATE {T["tasks"]}
SET status = 'COMPLETED', decision = %s, result_json = %s::jsonb, completed_at = now(),
    version = version + 1, updated_at = now()
WHERE id = %s AND status = 'COMPLETING' AND reservation_command_id = %s
"""

# OPEN and COMPLETING tasks, ascending id (one lock order between cancellers).
CANCEL_OPEN = f"""
WITH doomed AS (
    SELECT id FROM {T["tasks"]}
    WHERE workflow_id = %(wf)s AND status IN ('OPEN', 'COMPLETING')
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
      AND (%(branches)s::uuid[] IS NULL OR branch_token_id = ANY(%(branches)s::uuid[]))
    ORDER BY id FOR UPDATE
)
UPDATE {T["tasks"]} t
SET status = 'CANCELLED', version = t.version + 1, updated_at = now()
FROM doomed WHERE t.id = doomed.id
"""

# The task a settled COMPLETION command still reserves (an ended instance, a
# dead letter settled with it): cancelled with it, so no reservation is lost.
CANCEL_RESERVED = f"""
UPDATE {T["tasks"]}
SET status = 'CANCELLED', version = version + 1, updated_at = now()
WHERE id = %s AND status = 'COMPLETING' AND reservation_command_id = %s
"""

REASSIGN = f"""
UPDATE {T["tasks"]} SET assignee = %s, version = version + 1, updated_at = now()
WHERE id = %s AND status = 'OPEN'
"""


def _row(values: Sequence[Any]) -> TaskRow:
    v = list(values)
    candidates = db.load_json(v[6]) or {}
    if not isinstance(candidates, dict):  # rows written before the shape was fixed
        candidates = {"users": list(candidates), "groups": []}
    return TaskRow(
        id=v[0],
        workflow_id=v[1],
        step_id=v[2],
        name=v[3],
        status=v[4],
        assignee=v[5],
        candidate_users=tuple(candidates.get("users") or ()),
        candidate_groups=tuple(candidates.get("groups") or ()),
        decisions_snapshot=db.load_json(v[7]) or {},
        decision=v[8],
        result=db.load_json(v[9]),
        due_at=v[10],
        branch_token_id=v[11],
        fork_step_id=v[12],
        branch_id=v[13],
        version=v[14],
        scope_key=v[15],
        reservation_command_id=v[16],
        require_version_stability=v[17],
        created_at=v[18],
        updated_at=v[19],
        completed_at=v[20],
        definition_id=v[21],
        instance_status=v[22],
    )


def _positioned(decisions: dict[str, Any]) -> dict[str, Any]:
    """Each decision with its declared ``position`` (jsonb does not keep key order)."""
    return {
        name: {**(declaration or {}), "position": index}
        for index, (name, declaration) in enumerate(decisions.items())
    }


def decision_names(snapshot: dict[str, Any]) -> tuple[str, ...]:
    """The declared decision names in declaration order."""
    return tuple(
        sorted(snapshot, key=lambda name: ((snapshot[name] or {}).get("position", 0), name))
    )


def insert_open(
    task_id: Any,
    workflow_id: Any,
    *,
    step_id: str,
    name: str,
    assignee: str | None = None,
    candidate_users: Sequence[str] = (),
    candidate_groups: Sequence[str] = (),
    decisions_snapshot: dict[str, Any],
    due_at_delay_seconds: float | None = None,
    due_at: datetime.datetime | None = None,
    require_version_stability: bool | None = None,
    branch_token_id: Any = None,
    fork_step_id: str | None = None,
    branch_id: str | None = None,
) -> None:
    """Insert an OPEN task of an instance (scope from the instance row).

    At most one of ``due_at_delay_seconds`` (from the database clock) and
    ``due_at``; the DUE timer is recorded separately (``timers.record``), with
    the same instant when the caller wants them equal (pass the timer's
    ``fire_at`` as ``due_at``).
    """
    if due_at_delay_seconds is not None and due_at is not None:
        raise ValueError("give due_at_delay_seconds or due_at, not both")
    inserted = db.execute(
        INSERT_OPEN,
        {
            "id": task_id,
            "wf": workflow_id,
            "step": step_id,
            "name": name,
            "assignee": assignee,
            "candidates": json.dumps(
                {"users": list(candidate_users), "groups": list(candidate_groups)}
            ),
            "decisions": json.dumps(_positioned(decisions_snapshot)),
            "due_delay": due_at_delay_seconds,
            "due_at": due_at,
            "branch_token": branch_token_id,
            "fork_step": fork_step_id,
            "branch": branch_id,
            "stability": require_version_stability,
        },
    )
    if inserted != 1:
        raise LookupError("no workflow instance with that id")


def get(task_id: Any, *, lock: bool = False) -> TaskRow | None:
    """The task (with its instance's definition id and status); ``lock``: FOR UPDATE of the task."""
    row = db.fetchone(SELECT_FOR_UPDATE if lock else SELECT, (task_id,))
    return None if row is None else _row(row)


def open_for_step(workflow_id: Any, step_id: str) -> list[TaskRow]:
    """The OPEN and COMPLETING tasks of a step of an instance, oldest first."""
    return [_row(r) for r in db.fetchall(OPEN_FOR_STEP, (workflow_id, step_id))]


def reserve(task_id: Any, command_id: int) -> bool:
    """OPEN -> COMPLETING, reserved by ``command_id``; False when the task was not OPEN."""
    return db.execute(RESERVE, (command_id, task_id)) == 1


def reopen(task_id: Any, command_id: int) -> bool:
    """COMPLETING -> OPEN when ``command_id`` holds the reservation (a rejected completion)."""
    return db.execute(REOPEN, (task_id, command_id)) == 1


def mark_completed(task_id: Any, command_id: int, decision: str, result: Any) -> bool:
    """COMPLETING (reserved by ``command_id``) -> COMPLETED with the decision and result."""
    return (
        db.execute(
            MARK_COMPLETED,
            (decision, None if result is None else json.dumps(result), task_id, command_id),
        )
        == 1
    )


def cancel_open(
    workflow_id: Any,
    *,
    task_ids: Sequence[Any] | None = None,
    branch_token_ids: Sequence[Any] | None = None,
) -> int:
    """OPEN and COMPLETING tasks of the instance (those of ``task_ids``) -> CANCELLED.

    ``branch_token_ids`` keeps only the tasks of those branches (a superseded
    branch's tasks; an empty list matches none).
    """
    ids = None if task_ids is None else [str(t) for t in task_ids]
    branches = None if branch_token_ids is None else [str(b) for b in branch_token_ids]
    return db.execute(CANCEL_OPEN, {"wf": workflow_id, "ids": ids, "branches": branches})


def cancel_reserved(task_id: Any, command_id: int) -> bool:
    """Cancel the task ``command_id`` still reserves (its COMPLETION settled without running)."""
    return db.execute(CANCEL_RESERVED, (task_id, command_id)) == 1


def reassign(task_id: Any, assignee: str | None) -> str:
    """Set the assignee of an OPEN task: ``"REASSIGNED"``, or the status that refused it.

    Answers ``"MISSING"`` for no task, and ``"COMPLETING"``, ``"COMPLETED"`` or
    ``"CANCELLED"`` (nothing written) for a task that is not OPEN: a COMPLETING
    task is refused as if it were already completed (the reference). The
    caller holds the execution lock and has read the task FOR UPDATE.
    """
    if db.execute(REASSIGN, (assignee, task_id)) == 1:
        return "REASSIGNED"
    row = db.fetchone(f"SELECT status FROM {T['tasks']} WHERE id = %s", (task_id,))
    return "MISSING" if row is None else str(row[0])


# -- queries (wf.tasks) ------------------------------------------------------


@dataclass(frozen=True)
class TaskQueryPage:
    rows: list[TaskRow]
    next_cursor: str | None


def encode_cursor(updated_at: datetime.datetime, task_id: Any) -> str:
    """An opaque keyset cursor: the last row's (updated_at, id)."""
    return keyset.encode("task", [updated_at.isoformat(), str(task_id)])


def decode_cursor(cursor: str) -> tuple[datetime.datetime, uuid.UUID]:
    """Raises ValueError for a cursor this module did not write."""
    return keyset.decode("task", cursor, (datetime.datetime.fromisoformat, uuid.UUID))


def query(**filters: Any) -> TaskQueryPage:
    """One keyset page of tasks, newest ``updated_at`` first (ties by id).

    Filters combine with AND; ``candidate_groups`` matches a task naming any of
    them. ``scope`` is an exact match (None: every scope), an information
    filter and not an authorization boundary. Tasks of archived instances are
    hidden unless ``include_archived``. See :func:`query_sql` for the filters.
    """
    sql, params, limit = query_sql(**filters)
    rows = [_row(r) for r in db.fetchall(sql, params)]
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1].updated_at, rows[-1].id)
    return TaskQueryPage(rows, next_cursor)


def query_sql(
    *,
    assignee: str | None = None,
    candidate_user: str | None = None,
    candidate_groups: Sequence[str] | None = None,
    statuses: Sequence[str] | None = None,
    definition_id: str | None = None,
    scope: str | None = None,
    due_before: datetime.datetime | None = None,
    include_archived: bool = False,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[str, dict[str, Any], int]:
    """The page statement, its parameters and the bounded limit (it fetches one more row).

    Conditions are only added when given, so the scope filter can use
    ``idx_workflow_tasks_scope_updated_at`` (scope_key, updated_at DESC, id).
    """
    limit = max(1, min(int(limit), QUERY_LIMIT_MAX))
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if scope is not None:
        where.append("t.scope_key = %(scope)s")
        params["scope"] = scope
    if assignee is not None:
        where.append("t.assignee = %(assignee)s")
        params["assignee"] = assignee
    if candidate_user is not None:
        where.append("t.candidates_json -> 'users' ? %(cuser)s")
        params["cuser"] = candidate_user
    if candidate_groups is not None:
        where.append("t.candidates_json -> 'groups' ?| %(cgroups)s::text[]")
        params["cgroups"] = list(candidate_groups)
    if statuses is not None:
        where.append("t.status = ANY(%(statuses)s::text[])")
        params["statuses"] = list(statuses)
    if definition_id is not None:
        where.append("i.definition_id = %(definition)s")
        params["definition"] = definition_id
    if due_before is not None:
        where.append("t.due_at < %(due_before)s")
        params["due_before"] = due_before
    if not include_archived:
        where.append("i.archived_at IS NULL")
    if cursor is not None:
        after_at, after_id = decode_cursor(cursor)
        where.append(
            "(t.updated_at < %(after_at)s OR (t.updated_at = %(after_at)s AND t.id > %(after_id)s))"
        )
        params.update(after_at=after_at, after_id=after_id)
    sql = f"""
SELECT {_COLUMNS}
FROM {T["tasks"]} t JOIN {T["instances"]} i ON i.id = t.workflow_id
{"WHERE " + " AND ".join(where) if where else ""}
ORDER BY t.updated_at DESC, t.id
LIMIT %(limit)s
"""
    return sql, params, limit
