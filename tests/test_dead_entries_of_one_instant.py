"""Commands recorded together: the dead versions their claims leave are skipped, not re-read.

Commands recorded in one transaction share ``available_at`` (its ``now()``). A
claim leaves two dead versions of its command in ``wf_cmd_active_avail_idx``
(PENDING at the claim, CLAIMED at the settlement), and PostgreSQL marks an
index entry dead, so that later scans skip it without reading the table, once a
scan finds its row dead to every transaction. With B-tree deduplication the
equal keys of a batch sat in posting lists, which PostgreSQL marks only when all
of their rows are dead: every claim read the table for every dead version of
the batch before it. Migration 0009 stores each entry on its own
(docs/performance.md, "Dead entries of one instant"). The entries a claim reads
are counted by PostgreSQL's statistics, within the claim's own transaction.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

import vertique_workflow as wf
from vertique_workflow import tables
from vertique_workflow.executor import segment
from vertique_workflow.store import commands

# committed rows and no transaction around the test: a row is dead to every
# transaction only when no snapshot older than its deletion is left open
pytestmark = pytest.mark.django_db(transaction=True)

# A batch of more entries than one index page holds (a few hundred): the claims'
# own updates then change the pages the dead versions are on only now and then,
# so their scans can mark what they found dead. Within one page every claim
# changes the page it walked before its scan ends, and marks nothing, with or
# without deduplication (measured: 50 recorded, 40 settled: 41 entries read by
# the next claim either way); the page's own clean-up bounds that walk.
BATCH = 600
SETTLED = 200  # commands of the batch claimed and settled before the measured claim
AVAILABILITY_INDEX = tables.qualified("wf_cmd_active_avail_idx")


@pytest.fixture
def no_autovacuum():
    """Autovacuum would remove the dead versions itself, in its own time."""
    commands_table = tables.qualified(tables.COMMANDS)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {commands_table} SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {commands_table} RESET (autovacuum_enabled)")


def analyze_the_backlog() -> None:
    """Statistics of the recorded batch, as autovacuum takes them after 200 changes (0007).

    The test turns autovacuum off for the command log, so it analyzes itself.
    Without it the plans are made from whatever statistics earlier tests left:
    the active partial indexes analyzed while empty make the claim a bitmap
    scan and a sort of every active command, which reads the whole batch (608
    entries, seen once in CI on PostgreSQL 18) whatever the index marks dead;
    docs/performance.md, "Statistics of the active commands".
    """
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {tables.qualified(tables.COMMANDS)}")


def entries_returned() -> int:
    """Entries the availability index returned to this backend's scans, by its statistics.

    Counted since the backend last reported its statistics (PostgreSQL 15 on),
    not per transaction: read the difference within one transaction.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", [AVAILABILITY_INDEX]
        )
        return cursor.fetchone()[0]


def entries_a_claim_reads() -> int:
    """Index entries the claim's walk returns, in a transaction rolled back after it."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")  # as the executor
        before = entries_returned()
        claimed = commands.claim_next(
            node_id="measure",
            lease_seconds=30,
            max_attempts=5,
            resident=[("default", "order", 1)],
            kinds=("START",),
        )
        read = entries_returned() - before
        assert claimed is not None
        transaction.set_rollback(True)
    return read


def index_definition() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef(%s::regclass)", [AVAILABILITY_INDEX])
        return cursor.fetchone()[0]


@pytest.mark.usefixtures("no_autovacuum")
def test_a_claim_skips_the_dead_versions_of_commands_recorded_in_the_same_transaction():
    with transaction.atomic():  # one transaction: one available_at for the whole batch
        for n in range(BATCH):
            wf.start("order", {"amount": n}, idempotency_key=f"batch-{n}")
    analyze_the_backlog()
    for _ in range(SETTLED):
        assert segment.run_next("n1") is not None  # each START claimed, then settled

    read = entries_a_claim_reads()

    assert "deduplicate_items=off" in index_definition()
    # The head, and a few dead versions the last claims could not mark yet (5
    # measured). With posting lists the claim read the table for the dead versions
    # of the batch before it (390 measured, 2 * SETTLED at most).
    assert read < SETTLED // 4, f"the claim read {read} index entries"
