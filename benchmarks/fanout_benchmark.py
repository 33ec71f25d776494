"""Fan-out benchmark: branches/s, statements and commits per branch, against the commit limit.

    python scripts/with_postgres.py --durable -- python -m benchmarks.fanout_benchmark

Against one PostgreSQL (the throwaway one above, or DATABASE_URL), in one run:

1. the commit-rate limit: single-row INSERT transactions from 4 client
   connections (``executor_benchmark.commit_rate``);
2. ``bench-fan``: a fork over ``items`` (``--widths``, e.g. 10, 100, 1000
   items) where each branch runs one action and arrives at a join (policy
   all). The whole fan-out is one segment (the START's): ``--branches``
   branches in all, as ``--branches / width`` instances, recorded first and
   drained by one real ``workflow_executor`` with 1 and 4 workers
   (``--threads``);
3. ``bench-fan-signal``: the same fork, but each branch waits for a
   branch-addressed signal ``go`` before its action, so every branch is a
   segment of its own. The START segments (fork → every branch waiting) are
   drained and measured first; then one signal per branch is recorded and
   the executor drains them: the branches of one instance share its
   execution lock, so more workers only help across instances.

Per configuration: branches/s over the executors' active span, from the
earliest ``settled_at`` of the measured commands (``now()``, the start of a
segment's transaction) to the last history entry's ``created_at`` (the
statement time of a segment's last insert but one) -- process start-up is
excluded, the wall figure including it is printed too; statements per branch
(``pg_stat_statements``, every session of the database: the executor's
claims, idle polls and listener included) and commits per branch
(``pg_stat_database.xact_commit``); and the size of the branch-token table
afterwards (each branch stores its own copy of the state, ``items`` included).

Start the server with ``scripts/with_postgres.py --durable`` for
production-like commits (fsync and synchronous_commit on); without it the
throwaway server runs with fsync off, commits cost CPU only and the
commit-rate limit is far higher. The settings in force are printed with the
figures (``commit_rate``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass

import psycopg

from benchmarks.executor_benchmark import (
    Counters,
    analyze,
    bench_database,
    commit_rate,
    run_executors,
)

SPAN_SQL = """
SELECT extract(epoch FROM
  (SELECT max(created_at) FROM workflow_history)
  - (SELECT min(settled_at) FROM workflow_commands WHERE kind = %s))
"""

TOKENS_SIZE_SQL = "SELECT pg_total_relation_size('workflow_branch_tokens')"


@dataclass(frozen=True)
class Figure:
    """One configuration's figures, per branch."""

    label: str
    width: int
    threads: int
    branches: int
    rate: float
    wall_rate: float
    statements: float
    commits: float
    tokens_mb: float


def span(url: str, kind: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        return float(conn.execute(SPAN_SQL, (kind,)).fetchone()[0] or 0.0)


def tokens_mb(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(TOKENS_SIZE_SQL).fetchone()[0] / (1024 * 1024)


def record_fan_outs(definition: str, width: int, instances: int) -> None:
    from django.db import transaction

    import vertique_workflow as wf

    batch = uuid.uuid4().hex
    with transaction.atomic():
        for i in range(instances):
            wf.start(definition, {"items": list(range(width))}, idempotency_key=f"{batch}-{i}")


def record_branch_signals(width: int) -> int:
    """One branch-addressed ``go`` per branch of every waiting instance."""
    from django.db import transaction

    import vertique_workflow as wf
    from vertique_workflow.models import WorkflowInstance

    ids = list(WorkflowInstance.objects.filter(status="WAITING").values_list("id", flat=True))
    with transaction.atomic():
        for instance_id in ids:
            for item in range(width):
                wf.signal(
                    instance_id, "go", None, dedup_key=f"go-{item}", branch=("spread", str(item))
                )
    return len(ids) * width


def check_completed(expected: int) -> None:
    from vertique_workflow.models import WorkflowInstance

    done = WorkflowInstance.objects.filter(status="COMPLETED").count()
    if done != expected:
        raise SystemExit(f"only {done} of {expected} fan-out instances completed")


def measure(
    url: str,
    counters: Counters,
    label: str,
    kind: str,
    width: int,
    threads: int,
    branches: int,
) -> Figure:
    """Drain what is recorded with one executor of ``threads`` workers; per-branch figures."""
    analyze(url)
    calls0, commits0 = counters.read()
    started = time.monotonic()
    run_executors(url, 1, threads)
    wall = time.monotonic() - started
    calls1, commits1 = counters.read()
    seconds = span(url, kind)
    return Figure(
        label,
        width,
        threads,
        branches,
        branches / seconds if seconds else float("inf"),
        branches / wall,
        (calls1 - calls0) / branches,
        (commits1 - commits0) / branches,
        tokens_mb(url),
    )


def run_width(url: str, counters: Counters, width: int, threads: int, total: int) -> list[Figure]:
    from vertique_workflow.testing import flush_workflow_tables

    instances = max(1, total // width)
    branches = instances * width
    figures = []

    flush_workflow_tables()
    record_fan_outs("bench-fan", width, instances)
    figures.append(
        measure(url, counters, "fork → action → join", "START", width, threads, branches)
    )
    check_completed(instances)

    flush_workflow_tables()
    record_fan_outs("bench-fan-signal", width, instances)
    figures.append(measure(url, counters, "fork → N waits", "START", width, threads, branches))
    # recorded before the counters are read again: the recording is not the executor's work
    if record_branch_signals(width) != branches:
        raise SystemExit("not every branch got its signal")
    figures.append(
        measure(url, counters, "signal → action → join", "SIGNAL", width, threads, branches)
    )
    check_completed(instances)
    return figures


def print_figure(figure: Figure, limit: float) -> None:
    print(
        f"{figure.label:<24} width {figure.width:>5} 1p x {figure.threads}t: "
        f"{figure.rate:8.0f} branches/s (wall incl. process start {figure.wall_rate:6.0f}/s) "
        f"(ratio to commit limit {figure.rate / limit:.3f}); "
        f"statements/branch {figure.statements:6.2f}, commits/branch {figure.commits:5.3f}; "
        f"branch tokens {figure.tokens_mb:.1f} MB",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="10,100,1000", help="branches per fan-out")
    parser.add_argument("--branches", type=int, default=2000, help="branches per configuration")
    parser.add_argument("--threads", default="1,4")
    args = parser.parse_args()

    with bench_database(statements=True) as url:
        limit = commit_rate(url)
        print(f"commit-rate limit (4 clients, single-row INSERT): {limit:,.0f} commits/s")
        counters = Counters(url)
        for width in map(int, args.widths.split(",")):
            for threads in map(int, args.threads.split(",")):
                for figure in run_width(url, counters, width, threads, args.branches):
                    print_figure(figure, limit)


if __name__ == "__main__":
    main()
