"""Scale benchmark: a million ended instances, and the claim as fast as on an empty database.

    python scripts/with_postgres.py --pg 18 --durable -- python -m benchmarks.scale_benchmark

In one throwaway database (the benchmark's settings and workflows):

1. the claim on an empty database: ``--claims`` 3-action instances started
   with ``wf.start`` (one transaction), EXPLAIN (ANALYZE, BUFFERS) of the
   executor's peek and claim statements with those heads waiting, then the
   instances drained in-process by the executor's own unit of work
   (``segment.run_next``: the claim statement, then the segment) on this
   thread; it prints claims/s, ms per claim statement (p50/p95), the idle
   poll and instances/s; ``--claim-rounds`` rounds, the median of each;
2. seeding of ``--instances`` instances with their history in bulk
   (benchmarks/scale_seed.py: ``INSERT ... SELECT generate_series``), the
   time per table, then VACUUM ANALYZE and the table and index sizes;
3. the same claim measurement again, on the seeded database, and the ratio
   seeded / empty of each figure;
4. the read models and operator tools at that size, each skipped with a
   "not available" line while its module is missing: instance list pages
   (first page, 100th page through cursors, with and without scope, by
   status), history pages, the doctor, retention batches of 500; p50/p95 of
   ``--repeat`` runs, with EXPLAIN of the list statements.

Not a test: the figures depend on the machine (see docs/scale.md for the
ones measured). What must hold is that the claim figures do not move with a
million ended instances beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.executor_benchmark import bench_database


def p50_p95(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def show_plan(
    title: str, sql: str, params: Any, *, rollback: bool = False, quiet: bool = False
) -> float:
    """Print EXPLAIN (ANALYZE, BUFFERS) of ``sql``; returns the execution time in ms.

    ``rollback``: run it in a transaction rolled back afterwards (the claim
    statement claims what it finds; the benchmark must not keep that claim).
    """
    from django.db import connection, transaction

    execution = 0.0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            lines = [row[0] for row in cursor.fetchall()]
        if rollback:
            transaction.set_rollback(True)
    if not quiet:
        print(f"--- EXPLAIN (ANALYZE, BUFFERS) {title}")
    for line in lines:
        if not quiet:
            print("    " + line)
        if line.startswith("Execution Time:"):
            execution = float(line.split()[2])
    return execution


def claim_statement() -> str:
    """The executor's claim statement, its kinds and resident pins written in."""
    from vertique_workflow.executor.segment import SUPPORTED_KINDS, resident_pins
    from vertique_workflow.store import commands

    return commands.claim_statement(commands.CLAIM_NEXT, resident_pins(), SUPPORTED_KINDS)


def claim_params() -> dict[str, Any]:
    from vertique_workflow.conf import workflow_settings
    from vertique_workflow.store import commands

    return commands._claim_next_params(
        "scale-benchmark:explain", workflow_settings.LEASE_SECONDS, workflow_settings.MAX_ATTEMPTS
    )


def prepared_plans() -> tuple[int | None, int | None]:
    """(generic, custom) plan counts of this connection's prepared claim statement.

    PostgreSQL plans a prepared statement's first five executions for their
    parameters, then keeps a generic plan only if it is not estimated dearer
    than those; otherwise every call is planned again. None: not prepared.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements "
            "WHERE statement LIKE %s HAVING count(*) > 0",
            ["%async_commit AS (SELECT set_config('synchronous_commit'%"],
        )
        row = cursor.fetchone()
    return (None, None) if row is None else (int(row[0]), int(row[1]))


def measure_claims(label: str, count: int, *, plans: bool = True) -> dict[str, float]:
    """Start ``count`` 3-action instances, EXPLAIN peek and claim, drain them in-process."""
    from django.db import transaction

    import vertique_workflow as wf
    from vertique_workflow.executor import segment
    from vertique_workflow.store import commands
    from vertique_workflow.testing import ensure_synced

    ensure_synced()
    batch = uuid.uuid4().hex[:8]
    with transaction.atomic():
        for i in range(count):
            wf.start("bench-three-actions", {}, idempotency_key=f"{batch}-{i}")
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would after the burst of starts
    peek_ms = show_plan(
        f"peek ({label}, {count} heads waiting)", commands.PEEK, (100,), quiet=not plans
    )
    claim_ms = show_plan(
        f"claim ({label}, {count} heads waiting)",
        claim_statement(),
        claim_params(),
        rollback=True,
        quiet=not plans,
    )
    claim_times: list[float] = []
    original = commands.claim_next

    def timed_claim(**kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(**kwargs)
        finally:
            claim_times.append(time.perf_counter() - t0)

    node = f"scale-benchmark:{os.getpid()}"
    completed = 0
    commands.claim_next = timed_claim  # the executor's own call, timed where it is made
    try:
        began = time.perf_counter()
        while segment.run_next(node) is not None:
            completed += 1
        elapsed = time.perf_counter() - began
        # the last call found nothing: it was the first idle poll, not a claim
        claim_times.pop()
        drained = list(claim_times)
        claim_times.clear()
        for _ in range(20):  # the idle poll: what every executor runs when there is no work
            assert segment.run_next(node) is None
    finally:
        commands.claim_next = original
    idle_poll, _ = p50_p95(claim_times)
    claim_times = drained
    generic, custom = prepared_plans()
    idle_ms = show_plan(
        f"claim, idle ({label}, nothing claimable)",
        claim_statement(),
        claim_params(),
        rollback=True,
        quiet=not plans,
    )
    p50, p95 = p50_p95(claim_times)
    figures = {
        "instances/s": completed / elapsed,
        "claims/s": len(claim_times) / elapsed,
        "claim p50 ms": p50 * 1000,
        "claim p95 ms": p95 * 1000,
        "idle poll p50 ms": idle_poll * 1000,
        "peek EXPLAIN ms": peek_ms,
        "claim EXPLAIN ms": claim_ms,
        "idle claim EXPLAIN ms": idle_ms,
    }
    if generic is not None:
        print(
            f"claim ({label}): prepared claim statement so far: {generic} generic plans, "
            f"{custom} custom plans (custom: planned again at each call)"
        )
    print(
        f"claim ({label}): {completed} instances drained in {elapsed:.2f} s in-process, "
        f"{figures['instances/s']:.0f} instances/s, {figures['claims/s']:.0f} claims/s; "
        f"claim statement p50 {p50 * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms; "
        f"idle poll p50 {idle_poll * 1000:.2f} ms"
    )
    return figures


def claim_rounds(label: str, count: int, rounds: int) -> dict[str, float]:
    """``rounds`` claim measurements (plans printed once); the median of each figure.

    The machine is shared: one round can be disturbed by a neighbour, the
    median of three rarely is.
    """
    runs = [measure_claims(label, count, plans=n == 0) for n in range(rounds)]
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def vacuum_analyze() -> float:
    from django.db import connection

    t0 = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - t0


def print_sizes() -> None:
    from benchmarks.scale_seed import table_sizes

    print(f"{'table':34s} {'rows (est.)':>12s} {'heap':>10s} {'indexes':>10s}")
    for name, rows, heap, indexes in table_sizes():
        print(f"{name:34s} {rows:12,d} {heap / 2**20:8.1f} MB {indexes / 2**20:8.1f} MB")


def repeat(name: str, func: Callable[[], Any], times: int) -> Any:
    """Run ``func`` ``times`` times (after one warm-up); print p50/p95; return its last result."""
    result = func()
    values = []
    for _ in range(times):
        t0 = time.perf_counter()
        result = func()
        values.append(time.perf_counter() - t0)
    p50, p95 = p50_p95(values)
    print(f"{name:52s} p50 {ms(p50)}  p95 {ms(p95)}")
    return result


@contextlib.contextmanager
def hook(name: str) -> Iterator[None]:
    """A measurement that depends on work merged later: skipped (printed) until it exists."""
    try:
        yield
    except ImportError as exc:
        print(f"{name}: not available ({exc})")
    except (TypeError, AttributeError) as exc:
        print(f"{name}: not available, the signature differs ({exc})")


def measure_lists(times: int) -> None:
    with hook("instance list pages"):
        import vertique_workflow as wf
        from vertique_workflow.store import read_models

        wf_instances = wf.instances
        cases: dict[str, dict[str, Any]] = {
            "all scopes": {},
            "scope default": {"scope": "default"},
            "scope tenant-b": {"scope": "tenant-b"},
            "status FAILED": {"status": "FAILED"},
            "status WAITING, scope tenant-a": {"status": "WAITING", "scope": "tenant-a"},
            "definition scale-refund": {"definition_id": "scale-refund"},
        }
        for label, filters in cases.items():
            repeat(
                f"wf.instances(limit=50) first page, {label}",
                lambda f=filters: wf_instances(limit=50, **f),
                times,
            )

            def hundredth(f: dict[str, Any] = filters) -> Any:
                cursor = None
                for _ in range(99):
                    cursor = wf_instances(limit=50, cursor=cursor, **f).next_cursor
                return cursor

            cursor = hundredth()
            if cursor is None:
                print(f"wf.instances 100th page, {label}: fewer than 100 pages")
                continue
            repeat(
                f"wf.instances(limit=50) 100th page, {label}",
                lambda c=cursor, f=filters: wf_instances(limit=50, cursor=c, **f),
                times,
            )
        # the statements themselves (the same builder wf.instances uses)
        explained = {
            "all scopes": {},
            "scope default": {"scope": "default"},
            "status FAILED": {"statuses": ["FAILED"]},
        }
        for label, filters in explained.items():
            sql, params, _ = read_models.instance_page_sql(limit=50, **filters)
            show_plan(f"instance list, first page, {label}", sql, params)
            page = wf_instances(
                limit=50, **{k if k != "statuses" else "status": v for k, v in filters.items()}
            )
            sql, params, _ = read_models.instance_page_sql(
                limit=50, cursor=page.next_cursor, **filters
            )
            show_plan(f"instance list, second page, {label}", sql, params)


def measure_history(times: int) -> None:
    with hook("history pages"):
        import vertique_workflow as wf
        from vertique_workflow.models import WorkflowInstance

        sample = WorkflowInstance.objects.filter(status="FAILED").values_list("id", flat=True)[:1]
        instance_id = sample[0]
        repeat(
            "wf.history(id, limit=50) of a seeded FAILED instance",
            lambda: wf.history(instance_id, limit=50),
            times,
        )
        repeat(
            "wf.history(id, limit=50, newest_first=True)",
            lambda: wf.history(instance_id, limit=50, newest_first=True),
            times,
        )


def measure_doctor(times: int) -> None:
    with hook("doctor"):
        from vertique_workflow import doctor

        result = repeat("doctor.diagnose()", doctor.diagnose, max(1, times // 2))
        found = ", ".join(f"{f.kind} {f.count}" for f in result.findings) or "nothing"
        print(f"doctor found: {found}")


def measure_retention(batches: int) -> None:
    """Archive then purge, 500 per batch (each batch one transaction, the reference's way)."""
    with hook("retention"):
        from vertique_workflow import retention

        for name, call in (
            (
                "archive",
                lambda: retention.archive("COMPLETED", datetime.timedelta(days=30), batch=500),
            ),
            (
                "purge_archived",
                lambda: retention.purge_archived(datetime.timedelta(days=30), batch=500),
            ),
        ):
            values = []
            result = None
            for _ in range(batches):
                t0 = time.perf_counter()
                result = call()
                values.append(time.perf_counter() - t0)
            p50, p95 = p50_p95(values)
            print(
                f"retention.{name} batch of 500: p50 {ms(p50)}  p95 {ms(p95)}  "
                f"({500 / p50:,.0f} rows/s at p50); last batch: {result.processed} of "
                f"{result.candidates}, {result.busy} busy, {result.left_alone} left alone"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--claim-rounds", type=int, default=3)
    parser.add_argument(
        "--generic-plans",
        action="store_true",
        help="SET plan_cache_mode = force_generic_plan on the benchmark's connection",
    )
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--retention-batches", type=int, default=5)
    args = parser.parse_args()
    with bench_database(statements=False):
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT version(), current_setting('fsync'), "
                "current_setting('synchronous_commit'), current_setting('shared_buffers')"
            )
            version, fsync, sync, buffers = cursor.fetchone()
        print(
            f"server: {version.split(',')[0]}; fsync={fsync}, synchronous_commit={sync}, "
            f"shared_buffers={buffers}; {os.cpu_count()} CPUs"
        )
        if args.generic_plans:
            with connection.cursor() as cursor:
                cursor.execute("SET plan_cache_mode = force_generic_plan")
        with connection.cursor() as cursor:
            cursor.execute("SHOW plan_cache_mode")
            print(f"plan_cache_mode={cursor.fetchone()[0]}")
        empty = claim_rounds("empty", args.claims, args.claim_rounds)

        from benchmarks.scale_seed import seed

        print(f"seeding {args.instances:,d} instances:")
        report = seed(args.instances, progress=print)
        print(
            f"seeded {args.instances:,d} instances in {report.seconds:.1f} s "
            f"({args.instances / report.seconds:,.0f} instances/s)"
        )
        print(f"VACUUM ANALYZE: {vacuum_analyze():.1f} s")
        print_sizes()
        seeded = claim_rounds(f"{args.instances:,d} seeded", args.claims, args.claim_rounds)
        for name in empty:
            ratio = seeded[name] / empty[name] if empty[name] else float("nan")
            print(
                f"median of {args.claim_rounds}: {name:22s} empty {empty[name]:10.2f}  "
                f"seeded {seeded[name]:10.2f}  "
                f"ratio seeded/empty {ratio:.2f}"
            )
        measure_lists(args.repeat)
        measure_history(args.repeat)
        measure_doctor(args.repeat)
        measure_retention(args.retention_batches)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
