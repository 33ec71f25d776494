"""The executor benchmark's own rules: its ANALYZE and the order and summary of its cells.

The benchmarks' ANALYZE leaves an emptied table unanalyzed, as autovacuum
would: an emptied history analyzed as empty (``reltuples`` 0) gives the persist's
generic plan a sequential scan that the drain then runs on a growing table
(docs/performance.md, "Statistics of an emptied table"); left unanalyzed
(``reltuples`` -1 after ``TRUNCATE``) it is planned with its index.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

import vertique_workflow as wf
from benchmarks.executor_benchmark import Cell, analyze, commit_wait, run_order, spread
from tests.conftest import database_url
from vertique_workflow import tables


def _reltuples(table: str) -> float:
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])
        return float(cur.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_analyze_refreshes_the_tables_with_rows_and_leaves_the_emptied_history_alone(
    settings: Any,
) -> None:
    history = tables.qualified(tables.HISTORY)
    instances = tables.qualified(tables.INSTANCES)
    wf.start("order", {"amount": 1}, idempotency_key="stats")
    with connection.cursor() as cur:
        cur.execute(f"TRUNCATE {history}")  # emptied, as the benchmarks' reset empties it
    assert _reltuples(history) == -1  # what TRUNCATE leaves: never analyzed

    analyze(database_url(settings.DATABASES["default"]["NAME"]))

    assert _reltuples(history) == -1
    assert _reltuples(instances) >= 1


def test_repetitions_alternate_the_order_of_the_cells() -> None:
    cells = [Cell("three", 1, 4), Cell("three", 2, 2), Cell("signal", 1, 4)]
    assert run_order(cells, 0) == cells
    assert run_order(cells, 1) == cells[::-1]
    assert run_order(cells, 2) == cells
    assert cells[0].label == "3-action 1p x 4t"
    assert cells[2].label == "signal   1p x 4t"


def test_a_cell_is_summarized_by_its_median_and_range() -> None:
    assert spread([627.0, 900.4, 572.0]) == "627/s (572 to 900)"
    assert spread([655.0]) == "655/s"


@pytest.mark.django_db(transaction=True)
def test_commit_wait_measures_the_wal_each_size_writes_and_leaves_no_table(settings: Any) -> None:
    url = database_url(settings.DATABASES["default"]["NAME"])
    small, large = commit_wait(url, sizes=(100, 6000), commits=50, rounds=1)
    # the WAL per commit grows with the row: 5,900 more characters of out-of-line text
    # are at least 1 kB more WAL a commit (measured here: 6.4 kB more on PostgreSQL 15,
    # 2.8 kB more on 18), whatever else a commit writes (full-page images after a
    # checkpoint, and with PostgreSQL 18's default data checksums for hint bits too)
    assert large.wal_bytes - small.wal_bytes > 1000
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('bench_commit_wait')")
        assert cur.fetchone()[0] is None
