"""Seed many workflow instances at once, shaped like the rows the engine writes.

Benchmark-only SQL (as in admin_benchmark): the app never runs it, so it
lives here and not in ``vertique_workflow/store/``. One ``INSERT ... SELECT``
per table over ``generate_series`` (a temporary table of the seeded ids and
their kind first, so every table is derived from the same rows). What a real
instance leaves behind was read off real runs (a 3-action flow, a flow
failing its first step, a timer step) and is mimicked here:

* an instance row pinned to a registered definition (``workflow_definitions``
  row and its activation, seeded too: instances have no FK to definitions,
  but the read models, the doctor and ``count_non_terminal`` join or compare
  on (scope, id, version));
* a START command (the start always carries an idempotency key, so a
  ``workflow_dedup`` START row too), settled COMPLETE, or DEAD after five
  attempts for a FAILED instance (a dead letter: what the engine leaves when
  a step exhausts its attempts);
* the queue row (``next_seq`` one past the last command);
* five history entries (started, baseline, two decisions with patches, and
  the entry that ended or parked the instance); a FAILED instance keeps the
  first three too, for a uniform size, where a real one whose START
  dead-letters has only the dead letter and FAILED (its segments rolled
  back);
* a WAITING instance has an OPEN task, or a SCHEDULED timer with its PENDING
  TIMER command (fire time in the future, so nothing becomes claimable).

The mix (by ``g % 100`` of the series number): 91 % COMPLETED, 3 % FAILED,
3 % WAITING on a task, 2 % WAITING on a timer, 1 % COMPLETED and archived
long ago. Scopes (by ``hashtext(g) % 10``, independent of the mix): 70 %
``default``, 20 % ``tenant-a``, 10 % ``tenant-b``. ``updated_at`` is spread
over the last 90 days (a permutation of seconds, so rows do not come in
time order); the archived ones are 120-210 days old.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from vertique_workflow.tables import sql_names

T = sql_names()

SCOPES = ("default",) * 7 + ("tenant-a", "tenant-a", "tenant-b")


def _plan_hash(definition_id: str, version: int) -> str:
    return hashlib.sha256(f"scale-seed:{definition_id}:{version}".encode()).hexdigest()


# (definition id, version, contract): the pins seeded instances use
DEFINITIONS = (
    ("scale-order", 1, "scale.order"),
    ("scale-order", 2, "scale.order"),
    ("scale-refund", 1, "scale.refund"),
    ("scale-approval", 1, "scale.approval"),
    ("scale-reminder", 1, "scale.reminder"),
)

# the mix, by g % 100: (kind, first residue, last residue)
MIX = (
    ("done", 0, 90),
    ("failed", 91, 93),
    ("task", 94, 96),
    ("timer", 97, 98),
    ("archived", 99, 99),
)
KIND_STATUS = {
    "done": "COMPLETED",
    "failed": "FAILED",
    "task": "WAITING",
    "timer": "WAITING",
    "archived": "COMPLETED",
}
HISTORY_PER_INSTANCE = 5
FAILURE = "ATTEMPTS_EXHAUSTED: step 'charge' failed 5 of 5 attempts; last reason STEP_FAILED"


def expected_mix(count: int) -> dict[str, int]:
    """How many instances of each kind ``seed(count)`` writes (g runs 1..count)."""
    counts = dict.fromkeys(KIND_STATUS, 0)
    full, rest = divmod(count, 100)
    for kind, first, last in MIX:
        counts[kind] = full * (last - first + 1)
        counts[kind] += sum(1 for r in range(1, rest + 1) if first <= r <= last)
    return counts


def _kind_sql() -> str:
    return (
        "CASE "
        + " ".join(f"WHEN g %% 100 BETWEEN {a} AND {b} THEN '{k}'" for k, a, b in MIX)
        + " END"
    )


DEFINITION_ROWS = f"""
INSERT INTO {T["definitions"]} (scope_key, definition_id, definition_version, kind, status,
    contract_name, state_type_name, plan_hash, name_binding, signal_names_json)
SELECT 'default', d.id, d.version, 'CODE', 'AVAILABLE', d.contract, 'dict', d.hash, '{{}}'::jsonb,
       '{{}}'::jsonb
FROM jsonb_to_recordset(%(defs)s::jsonb) AS d(id text, version int, contract text, hash text)
ON CONFLICT DO NOTHING
"""

ACTIVATION_ROWS = f"""
INSERT INTO {T["definition_activations"]} (scope_key, definition_id, target_scope_key,
    definition_version)
SELECT 'default', d.id, 'default', max(d.version)
FROM jsonb_to_recordset(%(defs)s::jsonb) AS d(id text, version int)
GROUP BY d.id
ON CONFLICT DO NOTHING
"""

# one row per seeded instance: its number, id, kind, scope, pin and clock
SEED_TABLE = f"""
CREATE TEMPORARY TABLE scale_seed AS
SELECT s.*, d.hash AS plan_hash,
       s.at - make_interval(secs => 2 + s.g %% 60) AS created_at,
       jsonb_build_object('orderId', s.g, 'customer', 'customer-' || (s.g %% 50000),
           'amount', (s.g %% 997) + 0.5, 'currency', 'EUR',
           'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (s.g %% 300),
               'quantity', 1 + s.g %% 3))) AS base
FROM (
    SELECT g, md5(%(tag)s || ':' || g)::uuid AS id, k.kind,
           (ARRAY{list(SCOPES)!r})[1 + abs(hashtext(g::text)) %% 10] AS scope,
           CASE WHEN k.kind = 'task' THEN 'scale-approval'
                WHEN k.kind = 'timer' THEN 'scale-reminder'
                WHEN (g / 7) %% 4 = 3 THEN 'scale-refund'
                ELSE 'scale-order' END AS definition_id,
           CASE WHEN k.kind IN ('task', 'timer') OR (g / 7) %% 4 = 3 THEN 1
                ELSE 1 + LEAST((g / 7) %% 4, 1) END AS definition_version,
           CASE WHEN k.kind = 'archived'
                THEN now() - interval '120 days' - make_interval(secs => (g * 7919) %% 7776000)
                ELSE now() - make_interval(secs => (g * 7919) %% 7776000 + (g %% 1000) / 1000.0)
                END AS at
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,
         LATERAL (SELECT {_kind_sql()} AS kind) k
) s
JOIN jsonb_to_recordset(%(defs)s::jsonb) AS d(id text, version int, hash text)
  ON d.id = s.definition_id AND d.version = s.definition_version
"""

INSTANCE_ROWS = f"""
INSERT INTO {T["instances"]} (id, definition_id, definition_version, plan_hash, status,
    current_step_id, state_json, business_key, metadata, version, error_type, error_message,
    created_at, updated_at, completed_at, archived_at, scope_key, definition_scope_key,
    baseline_logged)
SELECT s.id, s.definition_id, s.definition_version, s.plan_hash,
       CASE s.kind WHEN 'failed' THEN 'FAILED' WHEN 'task' THEN 'WAITING'
                   WHEN 'timer' THEN 'WAITING' ELSE 'COMPLETED' END,
       CASE s.kind WHEN 'failed' THEN 'charge' WHEN 'task' THEN 'approve'
                   WHEN 'timer' THEN 'remind_later' ELSE 'done' END,
       s.base || '{{"reserved": true}}'::jsonb || CASE
           WHEN s.kind IN ('done', 'archived') THEN '{{"charged": true}}'::jsonb
           WHEN s.kind IN ('task', 'timer') THEN '{{"notified": true}}'::jsonb
           ELSE '{{}}'::jsonb END,
       CASE WHEN s.g %% 2 = 0 THEN 'BK-' || s.g END,
       '{{}}'::jsonb,
       CASE WHEN s.kind = 'failed' THEN 1 ELSE 2 END,
       CASE WHEN s.kind = 'failed' THEN 'ATTEMPTS_EXHAUSTED' END,
       CASE WHEN s.kind = 'failed' THEN %(failure)s END,
       s.created_at, s.at,
       CASE WHEN s.kind IN ('done', 'failed', 'archived') THEN s.at END,
       CASE WHEN s.kind = 'archived' THEN s.at + interval '10 days' END,
       s.scope, 'default', true
FROM scale_seed s
"""

DEDUP_ROWS = f"""
INSERT INTO {T["dedup"]} (kind, dedup_namespace, key, workflow_id, fingerprint, result_json,
    created_at, scope_key)
SELECT 'START', s.definition_id, 'seed-' || s.g, s.id, md5(s.g::text) || md5(s.id::text),
       jsonb_build_object('instanceId', s.id::text), s.created_at, s.scope
FROM scale_seed s
"""

START_COMMANDS = f"""
INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, payload_json, dedup_key, claimed_by,
    actor_kind, attribution_status, attempts, transient_count, deferral_count, recorded_at,
    available_at, settled_at, last_error)
SELECT s.id, 1, 'START', CASE WHEN s.kind = 'failed' THEN 'DEAD' ELSE 'COMPLETE' END,
       s.base, 'seed-' || s.g, 'scale-seed:node-' || (s.g %% 4), 'NONE', 'ABSENT',
       CASE WHEN s.kind = 'failed' THEN 5 ELSE 1 END, 0, 0, s.created_at, s.created_at,
       CASE WHEN s.kind = 'failed' THEN NULL ELSE s.created_at + interval '40 ms' END,
       CASE WHEN s.kind = 'failed' THEN %(failure)s END
FROM scale_seed s
"""

TIMER_COMMANDS = f"""
INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, timer_kind, timer_id, actor_kind,
    actor_reason, attribution_status, attempts, transient_count, deferral_count, recorded_at,
    fire_at, available_at)
SELECT s.id, 2, 'TIMER', 'PENDING', 'FIRE', md5('timer:' || s.id::text)::uuid, 'SYSTEM', 'timer',
       'VERIFIED', 0, 0, 0, s.at, now() + interval '30 days' + make_interval(secs => s.g %% 86400),
       now() + interval '30 days' + make_interval(secs => s.g %% 86400)
FROM scale_seed s WHERE s.kind = 'timer'
"""

TIMER_ROWS = f"""
INSERT INTO {T["timers"]} (id, workflow_id, step_id, purpose, fire_at, status, metadata,
    created_at, updated_at, command_id)
SELECT c.timer_id, c.workflow_id, 'remind_later', 'STEP', c.fire_at, 'SCHEDULED', '{{}}'::jsonb,
       c.recorded_at, c.recorded_at, c.id
FROM scale_seed s JOIN {T["commands"]} c ON c.workflow_id = s.id AND c.seq = 2
WHERE s.kind = 'timer'
"""

TASK_ROWS = f"""
INSERT INTO {T["tasks"]} (id, workflow_id, step_id, name, status, assignee, candidates_json,
    decisions_snapshot_json, version, created_at, updated_at, scope_key)
SELECT md5('task:' || s.id::text)::uuid, s.id, 'approve', 'Approve the order', 'OPEN',
       'manager-' || (s.g %% 20), '["approvers"]'::jsonb,
       '{{"approve": "approved", "reject": "rejected"}}'::jsonb, 0, s.at, s.at, s.scope
FROM scale_seed s WHERE s.kind = 'task'
"""

QUEUE_ROWS = f"""
INSERT INTO {T["command_queues"]} (workflow_id, next_seq, open_signals)
SELECT s.id, CASE WHEN s.kind = 'timer' THEN 3 ELSE 2 END, 0 FROM scale_seed s
"""

# the five entries of each kind: (kind, sequence, event type, step, outcome, payload,
# patch, state version before, after, entry version); entries 1-4 share the
# start segment's clock, the fifth is at updated_at
_ENTRIES = [
    (k, 1, "WORKFLOW_STARTED", None, None, {"version": 1}, None, None, None, 1) for k in KIND_STATUS
]
_ENTRIES += [
    (k, 2, "STATE_BASELINE", "reserve", "BASELINE", {"state": {}}, None, 0, 0, 2)
    for k in KIND_STATUS
]
_ENTRIES += [
    (
        k,
        3,
        "DECISION",
        "reserve",
        "ACTION_COMPLETED",
        {"outcome": "ACTION_COMPLETED"},
        [{"op": "add", "path": "/reserved", "value": True}],
        0,
        1,
        2,
    )
    for k in KIND_STATUS
]
_FOURTH = {
    "done": (
        "DECISION",
        "charge",
        "ACTION_COMPLETED",
        {"outcome": "ACTION_COMPLETED"},
        [{"op": "add", "path": "/charged", "value": True}],
        1,
        2,
        2,
    ),
    "failed": (
        "COMMAND_DEAD_LETTERED",
        None,
        None,
        {"seq": 1, "kind": "START", "reason": FAILURE},
        None,
        None,
        None,
        1,
    ),
    "task": (
        "DECISION",
        "notify",
        "ACTION_COMPLETED",
        {"outcome": "ACTION_COMPLETED"},
        [{"op": "add", "path": "/notified", "value": True}],
        1,
        2,
        2,
    ),
    "timer": (
        "DECISION",
        "notify",
        "ACTION_COMPLETED",
        {"outcome": "ACTION_COMPLETED"},
        [{"op": "add", "path": "/notified", "value": True}],
        1,
        2,
        2,
    ),
}
_FOURTH["archived"] = _FOURTH["done"]
_FIFTH = {
    "done": ("WORKFLOW_COMPLETED", None, "COMPLETED", {"step": "done"}, None, None, None, 1),
    "failed": (
        "FAILED",
        None,
        "FAILED",
        {"step": "charge", "reason": FAILURE, "resumeStep": None, "resumeStatus": "PENDING"},
        None,
        None,
        None,
        1,
    ),
    "task": (
        "DECISION",
        "approve",
        "TASK_OPENED",
        {"outcome": "TASK_OPENED", "decisions": ["approve", "reject"]},
        [],
        2,
        2,
        2,
    ),
    "timer": (
        "DECISION",
        "remind_later",
        "TIMER_SCHEDULED",
        {"outcome": "TIMER_SCHEDULED", "delaySeconds": 2592000},
        [],
        2,
        2,
        2,
    ),
}
_FIFTH["archived"] = _FIFTH["done"]
_ENTRIES += [(k, 4, *v) for k, v in _FOURTH.items()]
_ENTRIES += [(k, 5, *v) for k, v in _FIFTH.items()]

HISTORY_ROWS = f"""
INSERT INTO {T["history"]} (workflow_id, sequence, event_type, payload_json, created_at,
    actor_kind, attribution_status, executor_id, command_id, step_id, outcome,
    definition_scope_key, definition_id, definition_version, plan_hash, state_version_before,
    state_version_after, patch_json, entry_version)
SELECT s.id, e.seq, e.event_type,
       CASE WHEN e.seq = 1 THEN e.payload || jsonb_build_object('definitionId', s.definition_id)
            WHEN e.seq = 2 THEN jsonb_build_object('state', s.base)
            WHEN e.event_type IN ('COMMAND_DEAD_LETTERED', 'FAILED')
            THEN e.payload || jsonb_build_object('commandId', c.id)
            ELSE e.payload END,
       CASE WHEN e.seq = 5 THEN s.at ELSE s.created_at + interval '30 ms' END,
       'NONE', 'ABSENT', c.claimed_by, c.id, e.step_id, e.outcome,
       CASE WHEN e.event_type NOT IN ('COMMAND_DEAD_LETTERED', 'FAILED') THEN 'default' END,
       CASE WHEN e.event_type NOT IN ('COMMAND_DEAD_LETTERED', 'FAILED') THEN s.definition_id END,
       CASE WHEN e.event_type NOT IN ('COMMAND_DEAD_LETTERED', 'FAILED')
            THEN s.definition_version END,
       CASE WHEN e.event_type NOT IN ('COMMAND_DEAD_LETTERED', 'FAILED') THEN s.plan_hash END,
       e.before, e.after, e.patch, e.entry_version
FROM scale_seed s
JOIN {T["commands"]} c ON c.workflow_id = s.id AND c.seq = 1
JOIN jsonb_to_recordset(%(entries)s::jsonb) AS e(kind text, seq int, event_type text,
    step_id text, outcome text, payload jsonb, patch jsonb, before bigint, after bigint,
    entry_version smallint) ON e.kind = s.kind
"""


@dataclass
class SeedReport:
    count: int
    seconds: float
    steps: list[tuple[str, int, float]] = field(default_factory=list)  # (table, rows, seconds)


def _defs_json() -> str:
    import json

    return json.dumps(
        [
            {"id": i, "version": v, "contract": c, "hash": _plan_hash(i, v)}
            for i, v, c in DEFINITIONS
        ]
    )


def _entries_json() -> str:
    import json

    names = (
        "kind",
        "seq",
        "event_type",
        "step_id",
        "outcome",
        "payload",
        "patch",
        "before",
        "after",
        "entry_version",
    )
    return json.dumps([dict(zip(names, row, strict=True)) for row in _ENTRIES])


def seed(
    count: int,
    *,
    first: int = 1,
    tag: str = "scale",
    progress: Callable[[str], None] | None = None,
) -> SeedReport:
    """Seed ``count`` instances (series numbers ``first`` .. ``first + count - 1``) with their rows.

    Runs in the caller's transaction when there is one (the tests), else in
    one transaction of its own; ``tag`` makes the ids (``md5(tag:g)``)
    distinct between two seedings of one database. Statistics are left to
    the caller (VACUUM ANALYZE cannot run in a transaction).
    """
    from django.db import transaction

    params = {
        "first": first,
        "last": first + count - 1,
        "tag": tag,
        "defs": _defs_json(),
        "failure": FAILURE,
        "entries": _entries_json(),
    }
    report = SeedReport(count, 0.0)
    began = time.perf_counter()
    steps = [
        ("workflow_definitions", DEFINITION_ROWS),
        ("workflow_definition_activations", ACTIVATION_ROWS),
        ("(seed list)", SEED_TABLE),
        # statistics for the joins below (the planner would guess a nested loop)
        ("(analyze seed list)", "ANALYZE scale_seed"),
        ("workflow_instances", INSTANCE_ROWS),
        ("workflow_dedup", DEDUP_ROWS),
        ("workflow_commands (START)", START_COMMANDS),
        ("workflow_commands (TIMER)", TIMER_COMMANDS),
        ("(analyze commands)", f"ANALYZE {T['commands']}"),
        ("workflow_timers", TIMER_ROWS),
        ("workflow_tasks", TASK_ROWS),
        ("workflow_command_queues", QUEUE_ROWS),
        ("workflow_history", HISTORY_ROWS),
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        for name, sql in steps:
            t0 = time.perf_counter()
            cursor.execute(sql, params)
            rows = max(cursor.rowcount, 0)
            seconds = time.perf_counter() - t0
            report.steps.append((name, rows, seconds))
            if progress is not None:
                progress(f"  {name:34s} {rows:>10,d} rows  {seconds:7.1f} s")
        cursor.execute("DROP TABLE scale_seed")
    report.seconds = time.perf_counter() - began
    return report


TABLE_SIZES = """
SELECT c.relname, c.reltuples::bigint, pg_table_size(c.oid), pg_indexes_size(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relname LIKE 'workflow%%' AND n.nspname = current_schema()
ORDER BY pg_total_relation_size(c.oid) DESC
"""


def table_sizes() -> list[tuple[str, int, int, int]]:
    """(table, estimated rows, heap bytes, index bytes) of the workflow tables, biggest first."""
    with connection.cursor() as cursor:
        cursor.execute(TABLE_SIZES)
        return [tuple(r) for r in cursor.fetchall()]
