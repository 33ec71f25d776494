"""Service-step benchmark: a call through the outbox and the relay, against the commit limit.

    python scripts/with_postgres.py --durable -- python -m benchmarks.service_benchmark

A ``bench-service`` instance is start → service (a no-op handler) → end: the
START segment records the dispatch, the relay claims it, calls the handler
and records the result signal, the SIGNAL segment completes the instance.
``--until-idle`` executors (each with its relay thread) drain N recorded
instances; printed: instances/s over the database clock's active span, the
ratio to the same server's commit-rate limit, and statements and commits
per instance (pg_stat_statements, pg_stat_database) -- compare with the
3-action figure of ``benchmarks.executor_benchmark`` in the same run.
"""

from __future__ import annotations

import argparse

import psycopg

from benchmarks.executor_benchmark import (
    Counters,
    analyze,
    bench_database,
    commit_rate,
    reset_instances,
    run_executors,
)


def record(count: int) -> None:
    import uuid

    from django.db import transaction

    import vertique_workflow as wf

    batch = str(uuid.uuid4())
    with transaction.atomic():
        for i in range(count):
            wf.start("bench-service", {}, idempotency_key=f"{batch}-{i}")


def span(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM workflow_history"
            " WHERE event_type IN ('WORKFLOW_STARTED', 'WORKFLOW_COMPLETED')"
        ).fetchone()
    return float(row[0] or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--threads", default="1,4")
    args = parser.parse_args()
    with bench_database(statements=True) as url:
        limit = commit_rate(url)
        print(f"commit-rate limit (4 clients, single-row INSERT): {limit:,.0f} commits/s")
        counters = Counters(url)
        for threads in map(int, args.threads.split(",")):
            reset_instances()
            record(args.instances)
            analyze(url)
            calls0, commits0 = counters.read()
            run_executors(url, 1, threads)
            calls1, commits1 = counters.read()
            with psycopg.connect(url, autocommit=True) as conn:
                done = conn.execute(
                    "SELECT count(*) FROM workflow_instances WHERE status = 'COMPLETED'"
                ).fetchone()[0]
            rate = args.instances / span(url)
            print(
                f"service 1p x {threads}t: {rate:7.0f} instances/s "
                f"(ratio to commit limit {rate / limit:.3f}); completed {done}/{args.instances}; "
                f"statements/instance {(calls1 - calls0) / args.instances:.1f}, "
                f"commits/instance {(commits1 - commits0) / args.instances:.2f}"
            )


if __name__ == "__main__":
    main()
