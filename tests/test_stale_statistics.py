"""The claim and the fence read a few rows, however stale the planner's statistics are.

Statistics of ``workflow_commands`` taken while its queue was idle say that no
command is active; a burst of starts recorded after them used to turn the
executor's generic plans quadratic: the claim scanned the whole backlog for
every candidate and the fence found its command by scanning an active partial
index whole (docs/performance.md, "Statistics of the active commands"). Here
the statistics are taken on a settled command log, a backlog is recorded
without another ANALYZE, and the executor's own statements run with generic
plans, as the executor runs them; the rows they read are counted by
PostgreSQL's statistics of this transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

import vertique_workflow as wf
from vertique_workflow.models import WorkflowInstance
from vertique_workflow.store import commands, direct_statements, segment
from vertique_workflow.tables import sql_names

# committed rows, as in production: a command recorded by the claim's own
# transaction would also make PostgreSQL check its foreign key at the claim
pytestmark = pytest.mark.django_db(transaction=True)

T = sql_names()
SETTLED = 2000
BACKLOG = 300
READ_BOUND = BACKLOG // 10

# Rows read in this transaction from the two tables (sequential scans) and
# their indexes (entries returned), as the cumulative statistics count them.
ROWS_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(r.oid)), 0)::bigint
FROM pg_class r
WHERE r.oid IN (%(commands)s::regclass, %(instances)s::regclass)
   OR r.oid IN (SELECT indexrelid FROM pg_index
                WHERE indrelid IN (%(commands)s::regclass, %(instances)s::regclass))
"""


def rows_read() -> int:
    with connection.cursor() as cursor:
        cursor.execute(ROWS_READ, {"commands": T["commands"], "instances": T["instances"]})
        return cursor.fetchone()[0]


def state_statistics() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT most_common_vals::text FROM pg_stats WHERE attname = 'state' "
            "AND format('%%I.%%I', schemaname, tablename)::regclass = %s::regclass",
            [T["commands"]],
        )
        return cursor.fetchall()


def claim() -> commands.ClaimedCommand:
    claimed = commands.claim_next(
        node_id="n1",
        lease_seconds=30,
        max_attempts=5,
        resident=[("default", "order", 1)],
        kinds=("START",),
    )
    assert claimed is not None
    return claimed


def claim_and_fence() -> None:
    claimed = claim()
    assert segment.fence_and_load(claimed.id, claimed.token) is not None


@pytest.fixture
def statistics_as_taken():
    """No autovacuum on the two tables while the test runs: the statistics stay as it took them."""
    tables = (T["commands"], T["instances"])
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


@pytest.mark.usefixtures("statistics_as_taken")
def test_claim_and_fence_read_a_few_rows_after_statistics_of_an_idle_queue():
    # an idle installation: ended instances, each with its settled START
    WorkflowInstance.objects.bulk_create(
        WorkflowInstance(
            id=uuid.uuid4(),
            definition_id="order",
            definition_version=1,
            plan_hash="h",
            status="COMPLETED",
        )
        for _ in range(SETTLED)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {T['commands']} (workflow_id, seq, kind, state, settled_at) "
            f"SELECT id, 1, 'START', 'COMPLETE', now() FROM {T['instances']}"
        )
        cursor.execute(f"ANALYZE {T['commands']}, {T['instances']}")
    assert state_statistics() == []  # 0008: ANALYZE collects none for the command's state
    for n in range(BACKLOG):
        wf.start("order", {"amount": n}, idempotency_key=f"b{n}")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")  # as the executor
        claim_and_fence()  # plans both statements (planning reads index bounds of its own)
        before = rows_read()
        claimed = claim()
        after_claim = rows_read()
        loaded = segment.fence_and_load(claimed.id, claimed.token)
        after_fence = rows_read()

    assert loaded is not None and loaded.command.id == claimed.id
    # A few rows each: the claim reads the first heads in availability order, their
    # instances, their earlier active commands (none) and its own update; the fence its
    # command by key, its instance, earlier active commands and dead letters. A plan
    # led by the stale statistics reads rows in proportion to the backlog (at least
    # BACKLOG; the quadratic claim read BACKLOG squared).
    assert after_claim - before < READ_BOUND, f"the claim read {after_claim - before} rows"
    assert after_fence - after_claim < READ_BOUND, f"the fence read {after_fence - after_claim}"


# A settled log of this size and a backlog recorded after its statistics: the
# claim's generic plan chooses between walking the availability index to the
# first runnable head and reading every active command (a bitmap scan) and
# sorting them. The walk is priced by how soon the planner expects a candidate.
LARGE_SETTLED = 30_000
LARGE_BACKLOG = 1_000


def claim_plan(statement: str, params: dict) -> dict:
    """The generic plan of the executor's claim, as PostgreSQL prices it (not run)."""
    text, names = direct_statements.converted(statement)
    assert names is not None
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE claim_plan_probe AS {text.decode()}")
        try:
            arguments = ", ".join(["%s"] * len(names))
            cursor.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE claim_plan_probe({arguments})",
                [params[name] for name in names],
            )
            return cursor.fetchone()[0][0]["Plan"]
        finally:
            cursor.execute("DEALLOCATE claim_plan_probe")


def plan_nodes(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


@pytest.mark.usefixtures("statistics_as_taken")
def test_the_claim_prices_its_walk_as_stopping_at_the_first_heads():
    """The kinds and the resident pins are tested by function calls, not operators.

    As operators (``?``, ``@>``) PostgreSQL's estimator gives each 0.1 %, so
    the planner expected no candidate before the end of the index and priced
    the walk as reading all of it; a plan that reads every active command and
    sorts them then cost it only 10 to 15 % more, and statistics taken later in a
    drain tipped some claims into that plan: every claim read the whole backlog
    (seen in a real one-thread drain of 2,000 instances: 146 instead of 650 a
    second, 4.3 million index scans). Called as functions (the same C functions)
    they are priced at a third each, and the walk at a few heads.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {T['instances']} (id, definition_id, definition_version, plan_hash,"
            " status, scope_key, definition_scope_key, metadata, baseline_logged, created_at,"
            " updated_at) SELECT gen_random_uuid(), 'order', 1, 'h', 'COMPLETED', 'default',"
            " 'default', '{}', TRUE, now(), now() FROM generate_series(1, %s)",
            [LARGE_SETTLED],
        )
        cursor.execute(
            f"INSERT INTO {T['commands']} (workflow_id, seq, kind, state, settled_at,"
            " available_at, recorded_at, attempts, transient_count, deferral_count)"
            f" SELECT id, 1, 'START', 'COMPLETE', now(), now(), now(), 1, 0, 0"
            f" FROM {T['instances']}"
        )
        cursor.execute(f"ANALYZE {T['commands']}, {T['instances']}")
    with transaction.atomic():
        for n in range(LARGE_BACKLOG):
            wf.start("order", {"amount": n}, idempotency_key=f"b{n}")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {T['commands']}, {T['instances']}")

    statement = commands.claim_statement(commands.CLAIM_NEXT, [("default", "order", 1)], ("START",))
    plan = claim_plan(statement, commands._claim_next_params("n1", 30, 5))
    walks = [
        node for node in plan_nodes(plan) if node.get("Index Name") == "wf_cmd_active_avail_idx"
    ]
    limits = [node for node in plan_nodes(plan) if node["Node Type"] == "Limit"]
    assert not [node for node in plan_nodes(plan) if node["Node Type"] == "Sort"]
    assert len(walks) == 1 and walks[0]["Node Type"] == "Index Scan"
    assert len(limits) == 1
    # the Limit is priced at the share of the walk it expects to read: a few heads,
    # not the whole index (the operators' estimates priced it at all of it)
    assert limits[0]["Total Cost"] < walks[0]["Total Cost"] / 10, (limits, walks)

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")  # as the executor
        claim()  # plans the statement
        before = rows_read()
        claim()
        assert rows_read() - before < READ_BOUND
