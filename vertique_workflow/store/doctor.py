"""The doctor's reads: what needs a human, one bounded statement per kind of finding.

Plain reads with the database clock, on a connection of their own in
autocommit (like the probe): no transaction is left open on the caller's
connection, no lock is taken. Each statement returns at most ``limit``
examples plus the total count (``count(*) OVER ()``), so a million-row
finding costs one bounded read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from . import db
from .eligibility import ACTIVE_STATES
from .instances import ENDED_SQL

T = db.T

ACTIVE_COMMAND = f"""EXISTS (SELECT 1 FROM {T["commands"]} a
    WHERE a.workflow_id = i.id AND a.state IN {ACTIVE_STATES})"""
DEAD_COMMAND = f"""EXISTS (SELECT 1 FROM {T["commands"]} d
    WHERE d.workflow_id = i.id AND d.state = 'DEAD')"""

# RUNNING or PENDING with no active command: nothing will ever run them. An
# instance holding a dead letter is a dead letter (retry repairs it), not stranded.
STRANDED = f"""
SELECT i.id, i.definition_id, i.definition_version, i.status, i.current_step_id, i.updated_at,
       count(*) OVER ()
FROM {T["instances"]} i
WHERE i.status IN ('RUNNING', 'PENDING') AND NOT {ACTIVE_COMMAND} AND NOT {DEAD_COMMAND}
ORDER BY i.updated_at
LIMIT %(limit)s
"""

# WAITING with nothing that could ever wake it: no scheduled timer, no open task,
# no signal its pinned version declares, no live child, no active command, no
# service call in flight.
WAITING_FOREVER = f"""
SELECT i.id, i.definition_id, i.definition_version, i.status, i.current_step_id, i.updated_at,
       count(*) OVER ()
FROM {T["instances"]} i
WHERE i.status = 'WAITING' AND NOT {ACTIVE_COMMAND} AND NOT {DEAD_COMMAND}
  AND NOT EXISTS (SELECT 1 FROM {T["timers"]} t
                  WHERE t.workflow_id = i.id AND t.status = 'SCHEDULED')
  AND NOT EXISTS (SELECT 1 FROM {T["tasks"]} k
                  WHERE k.workflow_id = i.id AND k.status IN ('OPEN', 'COMPLETING'))
  AND NOT EXISTS (SELECT 1 FROM {T["service_outbox"]} o
                  WHERE o.workflow_id = i.id AND o.state IN ('PENDING', 'CLAIMED'))
  -- its pinned row is known and declares no signal (no row, or a NULL column
  -- from before the column existed: a signal could still be admitted)
  AND EXISTS (SELECT 1 FROM {T["definitions"]} d
              WHERE d.scope_key = i.definition_scope_key
                AND d.definition_id = i.definition_id
                AND d.definition_version = i.definition_version
                AND d.signal_names_json = '{{}}'::jsonb)
  AND NOT EXISTS (SELECT 1 FROM {T["history"]} h
                  JOIN {T["instances"]} ch ON ch.id = (h.payload_json ->> 'childId')::uuid
                  WHERE h.workflow_id = i.id AND h.event_type = 'CHILD_STARTED'
                    AND ch.status NOT IN {ENDED_SQL})
ORDER BY i.updated_at
LIMIT %(limit)s
"""

DEAD_LETTERS = f"""
SELECT c.workflow_id, c.id, c.kind, c.attempts, c.last_error, c.settled_at, count(*) OVER ()
FROM {T["commands"]} c
WHERE c.state = 'DEAD'
ORDER BY c.workflow_id, c.seq
LIMIT %(limit)s
"""

PARKED_OLD = f"""
SELECT c.workflow_id, c.id, c.target_json ->> 'name', c.recorded_at, count(*) OVER ()
FROM {T["commands"]} c
WHERE c.state = 'PARKED' AND c.recorded_at < now() - make_interval(secs => %(age)s)
ORDER BY c.recorded_at
LIMIT %(limit)s
"""

# Deferred again and again: no node that saw it has the instance's plan.
DEFERRED_FOREVER = f"""
SELECT c.workflow_id, c.id, i.definition_scope_key, i.definition_id, i.definition_version,
       i.plan_hash, c.deferral_count, c.claimed_by, c.last_error, count(*) OVER ()
FROM {T["commands"]} c JOIN {T["instances"]} i ON i.id = c.workflow_id
WHERE c.state = 'DEFERRED' AND c.deferral_count >= %(deferrals)s
ORDER BY c.recorded_at
LIMIT %(limit)s
"""

# Attempts spent with no error recorded: leases that expired (the process died,
# or the segment outlived LEASE_SECONDS) and were claimed again.
LEASE_EXPIRING = f"""
SELECT c.workflow_id, c.id, c.kind, c.state, c.attempts, c.claimed_by, c.lease_until,
       count(*) OVER ()
FROM {T["commands"]} c
WHERE c.state IN {ACTIVE_STATES} AND c.attempts >= %(attempts)s AND c.last_error IS NULL
ORDER BY c.attempts DESC, c.id
LIMIT %(limit)s
"""

# Service calls a relay holds past its lease, or waiting far longer than any backoff.
STUCK_SERVICE_CALLS = f"""
SELECT o.workflow_id, o.id, o.handler, o.state, o.attempts, o.claimed_by, o.lease_until,
       o.available_at, o.last_error, count(*) OVER ()
FROM {T["service_outbox"]} o
WHERE (o.state = 'CLAIMED' AND o.lease_until < now() - make_interval(secs => %(age)s))
   OR (o.state = 'PENDING' AND o.available_at < now() - make_interval(secs => %(age)s))
ORDER BY o.available_at
LIMIT %(limit)s
"""

NOTIFY_QUEUE = "SELECT pg_notification_queue_usage()"

# Statistics of the workflow tables: the claim's plans degrade on stale ones.
TABLE_STATS = """
SELECT s.relname, s.n_live_tup, s.n_mod_since_analyze,
       GREATEST(s.last_analyze, s.last_autoanalyze),
       extract(epoch FROM now() - GREATEST(s.last_analyze, s.last_autoanalyze))
FROM pg_stat_all_tables s
WHERE s.schemaname = COALESCE(%(schema)s, current_schema()) AND s.relname = ANY(%(tables)s)
ORDER BY s.relname
"""


_session: ContextVar[Any] = ContextVar("vertique_workflow_doctor_session", default=None)


@contextmanager
def session() -> Iterator[None]:
    """One autocommit connection for every :func:`read` inside the block.

    A diagnosis is about ten statements; a connection each cost more than the
    statements themselves on a small database (measured: 53 ms against 17 ms
    per diagnosis, local trust authentication). Each statement is still its
    own transaction (autocommit), so nothing is held between them.
    """
    with db.separate_cursor() as cursor:
        token = _session.set(cursor)
        try:
            yield
        finally:
            _session.reset(token)


def read(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    cursor = _session.get()
    if cursor is not None:
        cursor.execute(sql, params)
        return cursor.fetchall()
    with db.separate_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
