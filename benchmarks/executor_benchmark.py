"""Executor benchmark: figures and ratios against the same server's commit-rate limit.

    python scripts/with_postgres.py --durable -- python -m benchmarks.executor_benchmark

Against one PostgreSQL (the throwaway one above, or DATABASE_URL), in one run:

1. the commit-rate limit: single-row INSERT transactions from 4 client connections;
2. executor throughput, instances/s: a 3-action workflow start → COMPLETED, and
   start → wait → signal → COMPLETED, with 1 and 2 processes x 1/4/8 threads
   (the instances are recorded first; the clock runs while executors drain them);
3. latency from a committed signal to its applied segment on an idle executor
   (p50, p99): from the moment the signal's commit returns to the statement
   time of the segment's writes (host and database share the clock);
4. peak RSS of an executor process (VmHWM);
5. statements and commits per instance (pg_stat_statements, pg_stat_database).

Each figure is printed with the ratio of instance throughput to the commit limit.

Start the server with ``scripts/with_postgres.py --durable`` for production-like
commits (fsync and synchronous_commit on); without it the throwaway server runs
with fsync off, commits cost CPU only and the commit-rate limit is far higher.
The settings in force are printed with the figures. Statistics are refreshed
(ANALYZE) after the instances are recorded, as autovacuum would.

``--repetitions N`` runs every cell N times, in order and then reversed, and
prints each cell's median and range: a shared machine's speed drifts over
minutes, and one pass in a fixed order favours the cells that run first (the
one-process cells, here). ``--kinds three`` leaves out the signal workflow.

``--left-heads N`` puts N commands the executors' claim walks past in front of
every cell's instances (SIGNAL heads of completed instances, which only the
general path settles; docs/executor.md, "How work is found"): the cell's rate
is then its wall time, settling them included.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import statistics
import string
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import psycopg  # noqa: E402

ADMIN_URL = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1/postgres"


def admin_url() -> str:
    return ADMIN_URL


def url_for(dbname: str) -> str:
    base = admin_url().rsplit("/", 1)[0]
    return f"{base}/{dbname}"


def commit_rate(url: str, seconds: float = 5.0, clients: int = 4) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("fsync", "synchronous_commit", "full_page_writes")
        }
        print("server settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        conn.execute("DROP TABLE IF EXISTS bench_commit_rate")
        conn.execute("CREATE TABLE bench_commit_rate (id bigserial PRIMARY KEY, v int)")
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while time.monotonic() < stop:
                conn.execute("INSERT INTO bench_commit_rate (v) VALUES (1)")
                counts[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


@dataclasses.dataclass(frozen=True)
class CommitWait:
    """One client's autocommit INSERT at one size of WAL per commit, synchronous and not."""

    wal_bytes: float  # WAL written per commit, measured
    sync_us: float  # median per commit, synchronous_commit on
    async_us: float  # median per commit, synchronous_commit off

    @property
    def wait_us(self) -> float:
        """What waiting for the WAL flush adds to a commit."""
        return self.sync_us - self.async_us


def commit_wait(
    url: str, sizes: tuple[int, ...] = (100, 2000, 4000, 6000), commits: int = 300, rounds: int = 3
) -> list[CommitWait]:
    """What a synchronous commit costs one client on this server, by the WAL it flushes.

    The flush's price is the machine's (disk, file system, virtualisation), it
    moves from one run to the next on a shared machine and it need not be flat:
    on the 2-vCPU machine of docs/performance.md one run measured a 43 µs wait
    at 100 bytes of WAL and 150 µs from 4 kB on, another 200 to 250 µs at every
    size. A one-thread drain waits for each of its commits, so the figure is
    printed with each run, next to each system's WAL per unit. Rows of random
    letters stored out of line and uncompressed (``STORAGE EXTERNAL``), so the
    WAL per commit grows with the size; sizes interleaved and repeated, medians
    reported.
    """
    rng = random.Random(14)
    table = "bench_commit_wait"
    timings: dict[int, dict[str, list[float]]] = {
        s: {"on": [], "off": [], "wal": []} for s in sizes
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (payload text)")
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN payload SET STORAGE EXTERNAL")
        try:
            for _ in range(rounds):
                for size in sizes:
                    text = "".join(rng.choice(string.ascii_letters) for _ in range(size))
                    for mode in ("on", "off"):
                        conn.execute(f"SET synchronous_commit = {mode}")
                        start_lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                        started = time.perf_counter()
                        for _ in range(commits):
                            conn.execute(f"INSERT INTO {table} VALUES (%s)", (text,))
                        elapsed = time.perf_counter() - started
                        wal = conn.execute(
                            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start_lsn,)
                        ).fetchone()[0]
                        timings[size][mode].append(elapsed / commits * 1e6)
                        timings[size]["wal"].append(float(wal) / commits)
                    conn.execute(f"TRUNCATE {table}")
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return [
        CommitWait(
            statistics.median(t["wal"]), statistics.median(t["on"]), statistics.median(t["off"])
        )
        for t in (timings[s] for s in sizes)
    ]


def manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )


class Counters:
    def __init__(self, url: str) -> None:
        self.url = url

    def read(self) -> tuple[int, int]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            calls = conn.execute(
                "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]
            conn.execute("SELECT pg_stat_clear_snapshot()")
            commits = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()[0]
        return int(calls), int(commits)


def peak_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def active_span(url: str) -> float:
    """Seconds from the first claim to the last settlement (database clock).

    Process start-up (Django setup, definition sync) is excluded: the figure
    is what the executors sustain once running.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(h.created_at) - min(h.created_at)) "
            "FROM workflow_history h WHERE h.event_type IN "
            "('WORKFLOW_STARTED', 'SIGNAL_APPLIED', 'WORKFLOW_COMPLETED')"
        ).fetchone()
    return float(row[0] or 0.0)


def signal_span(url: str) -> float:
    """Both executor phases of the signal workflow, without the recording between them."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM "
            "  (max(created_at) FILTER (WHERE event_type = 'WORKFLOW_STARTED') "
            "   - min(created_at) FILTER (WHERE event_type = 'WORKFLOW_STARTED')) "
            "+ (max(created_at) FILTER (WHERE event_type = 'WORKFLOW_COMPLETED') "
            "   - min(created_at) FILTER (WHERE event_type = 'SIGNAL_APPLIED')))"
            "FROM workflow_history"
        ).fetchone()
    return float(row[0] or 0.0)


def run_executors(url: str, processes: int, threads: int) -> tuple[float, int]:
    """Drain everything with --until-idle executors; returns (wall seconds, peak RSS kB)."""
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "workflow_executor",
                "--until-idle",
                "-v",
                "0",
                "--concurrency",
                str(threads),
                "--poll-interval",
                "100",
                "--stats-interval",
                "3600",
            ],
            cwd=ROOT,
            env=env,
        )
        for _ in range(processes)
    ]
    peak = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            peak = max(peak, peak_rss_kb(p.pid))
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    if any(p.returncode for p in procs):
        raise SystemExit("an executor failed")
    return elapsed, peak


def analyze(url: str) -> None:
    """Refresh the statistics of the tables that hold rows, as autovacuum would.

    Not a bare ANALYZE: the benchmarks empty the tables between scenarios, and
    an empty ``workflow_history`` analyzed as empty (reltuples 0, not the -1 of
    a table never analyzed) gives the executors' generic plans a sequential
    scan for the persist's ``MAX(sequence)`` read, kept while the drain fills
    the table (docs/performance.md, "Statistics of an emptied table").
    Autovacuum never analyzes a table with no changes, so this is what a
    running installation sees.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables"
        ).fetchall()
        for (table,) in tables:
            if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]:
                conn.execute(f"ANALYZE {table}")


def record(kind: str, count: int) -> None:
    import django

    django.setup()
    from django.db import transaction

    import vertique_workflow as wf

    definition = "bench-three-actions" if kind == "three" else "bench-signal"
    batch = str(uuid.uuid4())
    with transaction.atomic():
        for i in range(count):
            wf.start(definition, {}, idempotency_key=f"{batch}-{i}")


def record_left_heads(count: int) -> None:
    """``count`` SIGNAL heads of completed instances, older than what a cell records next.

    Each ``bench-signal`` instance takes two "go" signals: the first completes
    it, the second is then the head of an ended instance. They are made
    in-process (``run_next`` until nothing is claimable), so they are in front
    of the queue before the executors start.
    """
    from django.db import transaction

    import vertique_workflow as wf
    from vertique_workflow.executor.segment import run_next

    batch = str(uuid.uuid4())
    with transaction.atomic():
        refs = [wf.start("bench-signal", {}, idempotency_key=f"{batch}-{i}") for i in range(count)]
        for ref in refs:
            wf.signal(ref.id, "go", None, dedup_key="go")
            wf.signal(ref.id, "go", None, dedup_key="go-again")
    while run_next("left-heads") is not None:
        pass


def left_heads_open(url: str) -> int:
    """SIGNAL commands still open (the left heads not settled yet)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM workflow_commands WHERE kind = 'SIGNAL' AND state = 'PENDING'"
        ).fetchone()
    return int(row[0])


def record_signals() -> int:
    import vertique_workflow as wf
    from vertique_workflow.models import WorkflowInstance

    ids = list(WorkflowInstance.objects.filter(status="WAITING").values_list("id", flat=True))
    from django.db import transaction

    with transaction.atomic():
        for instance_id in ids:
            wf.signal(instance_id, "go", None, dedup_key="go")
    return len(ids)


def reset_instances() -> None:
    from vertique_workflow.testing import flush_workflow_tables

    flush_workflow_tables()


def latency(url: str, samples: int) -> list[float]:
    """Signal → applied on an idle executor, from the database clock."""
    from django.db import transaction

    import vertique_workflow as wf
    from vertique_workflow.models import WorkflowHistory

    record("signal", samples)
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "workflow_executor",
            "-v",
            "0",
            "--concurrency",
            "2",
            "--poll-interval",
            "60000",
            "--stats-interval",
            "3600",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        from vertique_workflow.models import WorkflowInstance

        while WorkflowInstance.objects.filter(status="WAITING").count() < samples:
            time.sleep(0.05)
        ids = list(WorkflowInstance.objects.filter(status="WAITING").values_list("id", flat=True))
        committed_at = {}
        for instance_id in ids:
            with transaction.atomic():
                wf.signal(instance_id, "go", None, dedup_key="lat")
            # the commit has returned: from here the clock runs (host clock, as the
            # database's: same machine)
            committed_at[instance_id] = time.time()
            while not WorkflowInstance.objects.filter(pk=instance_id, status="COMPLETED").exists():
                time.sleep(0.005)  # polls less: the figure comes from timestamps
        values = []
        for instance_id in ids:
            applied = WorkflowHistory.objects.get(
                workflow_id=instance_id, event_type="SIGNAL_APPLIED"
            )
            values.append((applied.created_at.timestamp() - committed_at[instance_id]) * 1000)
        return values
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def bench_database(*, statements: bool = True) -> Iterator[str]:
    """A throwaway database of its own, migrated, Django set up on it; its URL.

    ``statements``: install pg_stat_statements (for the per-instance counts).
    The database is dropped afterwards, whatever happens.
    """
    dbname = f"vw_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = url_for(dbname)
    os.environ["DATABASE_URL"] = url
    try:
        if statements:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        manage(url, "migrate", "-v", "0")
        import django

        django.setup()
        yield url
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@dataclasses.dataclass(frozen=True)
class Cell:
    """One drain: a workflow kind under ``processes`` executors of ``threads`` threads each."""

    kind: str
    processes: int
    threads: int

    @property
    def label(self) -> str:
        name = "3-action" if self.kind == "three" else "signal  "
        return f"{name} {self.processes}p x {self.threads}t"


T = TypeVar("T")


def run_order(cells: Sequence[T], repetition: int) -> list[T]:
    """The cells of one repetition: in order, then reversed, and so on.

    A shared machine's speed drifts over minutes; alternating the order puts
    each cell early in one repetition and late in the next, so a drift does
    not favour the cells that always run first.
    """
    return list(cells) if repetition % 2 == 0 else list(reversed(cells))


def spread(values: list[float]) -> str:
    """``median (lowest to highest)`` of one cell's rates over the repetitions."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return f"{ordered[0]:.0f}/s"
    return f"{statistics.median(ordered):.0f}/s ({ordered[0]:.0f} to {ordered[-1]:.0f})"


def measure(
    url: str, counters: Counters, cell: Cell, instances: int, left_heads: int = 0
) -> dict[str, float]:
    """Record ``instances`` instances of the cell's kind, drain them, and return its figures.

    ``left_heads``: that many heads the claim walks past are recorded first
    (:func:`record_left_heads`); the rate is then the executors' wall time.
    """
    reset_instances()
    if left_heads:
        record_left_heads(left_heads)
    record(cell.kind, instances)
    analyze(url)
    calls0, commits0 = counters.read()
    wall, rss = run_executors(url, cell.processes, cell.threads)
    span = active_span(url)
    if cell.kind == "signal":
        # the recording of the signals is not the executor's work
        calls_mid, commits_mid = counters.read()
        record_signals()
        analyze(url)
        calls_resume, commits_resume = counters.read()
        calls0 += calls_resume - calls_mid
        commits0 += commits_resume - commits_mid
        more, rss2 = run_executors(url, cell.processes, cell.threads)
        wall += more
        rss = max(rss, rss2)
    calls1, commits1 = counters.read()
    seconds = span if cell.kind == "three" else signal_span(url)
    if left_heads:
        if left_heads_open(url):
            raise SystemExit("the executors left heads of ended instances unsettled")
        seconds = wall
    return {
        "rate": instances / seconds,
        "wall_rate": instances / wall,
        "rss": rss,
        "statements": (calls1 - calls0) / instances,
        "commits": (commits1 - commits0) / instances,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--threads", default="1,4,8")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--kinds", default="three,signal", help="three, signal or both")
    parser.add_argument(
        "--repetitions",
        type=int,
        default=1,
        help="run every cell this many times, alternating the order; print medians",
    )
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput table")
    parser.add_argument(
        "--left-heads",
        type=int,
        default=0,
        help="this many heads the claim walks past in front of each cell (three only)",
    )
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]
    if not set(kinds) <= {"three", "signal"} or args.repetitions < 1:
        parser.error("--kinds takes three and/or signal; --repetitions at least 1")
    if args.left_heads < 0 or (args.left_heads and kinds != ["three"]):
        parser.error("--left-heads takes a count of at least 0, with --kinds three")
    cells = [
        Cell(kind, processes, threads)
        for kind in ([] if args.latency_only else kinds)
        for processes in map(int, args.processes.split(","))
        for threads in map(int, args.threads.split(","))
    ]

    with bench_database(statements=True) as url:
        limit = commit_rate(url)
        print(f"commit-rate limit (4 clients, single-row INSERT): {limit:,.0f} commits/s")
        counters = Counters(url)
        rates: dict[Cell, list[float]] = {cell: [] for cell in cells}
        for repetition in range(args.repetitions):
            if args.repetitions > 1:
                print(f"-- repetition {repetition + 1} of {args.repetitions}", flush=True)
            for cell in run_order(cells, repetition):
                figures = measure(url, counters, cell, args.instances, args.left_heads)
                rates[cell].append(figures["rate"])
                behind = f" behind {args.left_heads:,} left heads" if args.left_heads else ""
                print(
                    f"{cell.label}{behind}: {figures['rate']:7.0f} instances/s "
                    f"(wall incl. process start {figures['wall_rate']:5.0f}/s) "
                    f"(ratio to commit limit {figures['rate'] / limit:.3f}); peak RSS "
                    f"{figures['rss'] / 1024:.0f} MB; executor statements/instance "
                    f"{figures['statements']:.1f}, commits/instance {figures['commits']:.2f}",
                    flush=True,
                )
        if args.repetitions > 1:
            print(f"-- medians of {args.repetitions} repetitions (lowest to highest)")
            for cell in cells:
                print(f"{cell.label}: {spread(rates[cell])}")
        reset_instances()
        values = sorted(latency(url, args.latency_samples))
        p50 = statistics.median(values)
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        print(
            f"signal committed → applied (idle executor, {len(values)} samples): "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        )
        best = max(
            (
                statistics.median(values)
                for cell, values in rates.items()
                if cell.kind == "three" and cell.processes == 1 and values
            ),
            default=0.0,
        )
        print(
            f"best 3-action single-process throughput: {best:.0f}/s = "
            f"{best / limit:.3f} x commit limit (target 0.05)"
        )


if __name__ == "__main__":
    main()
