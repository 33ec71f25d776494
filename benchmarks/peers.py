"""Side by side with the Postgres peers: vertique_workflow, Procrastinate and DBOS, one run.

    ./scripts/bench-peers            (installs the ``bench`` extra, starts PostgreSQL 15 durable)
    python scripts/with_postgres.py --pg 15 --durable -- python -m benchmarks.peers

Against one PostgreSQL (fsync and synchronous_commit on), with interleaved
repetitions (each repetition runs every scenario once, the scenarios a ratio
compares back to back and in the opposite order every other repetition, so a
slow minute of the shared machine lands on both sides of a ratio), it measures:

- drains: our 3-action workflow and our one-wait workflow (start -> wait ->
  signal -> end) drained by real ``workflow_executor`` processes (1x1, 1x4,
  2x4: processes x worker threads; each set up first and all let go together,
  ``benchmarks/gated_executor.py``); Procrastinate's no-op job drained by one
  worker (concurrency 1 and 4); DBOS's 3-step workflow (``start_workflow``,
  in one process). Rates from the database clock: units / (last finish -
  first start) for ours and Procrastinate (history / procrastinate_events),
  wall time for DBOS (it runs where it is started);
- per unit of each drain: commits (``pg_stat_database``, every database),
  WAL bytes and records (``pg_stat_wal``), CPU of PostgreSQL's processes (the
  postmaster and every backend, exited ones included: ``/proc`` of the
  postmaster, ``cutime``) and CPU of the Python worker processes
  (``RUSAGE_CHILDREN``, less what the same processes spend starting and
  stopping on an empty queue: Django's start-up is not a per-instance cost;
  DBOS starts and runs its workflows in one process, so its figure keeps it);
- ``wf.start()`` one per transaction vs Procrastinate's ``defer`` one at a time;
- latency from the commit's return: ``wf.start()`` returned -> the first action
  runs (an idle executor), ``defer`` returned -> the job starts (an idle
  worker), DBOS ``start_workflow`` returned -> first step runs;
- once per run, what a synchronous commit costs one client of this server by
  the WAL it flushes (``executor_benchmark.commit_wait``), printed with the WAL
  and commits per unit of the one-thread drains: a one-thread drain waits for
  each of its commits, and on some machines that wait grows with the WAL.

Before every scenario every database is vacuumed and the server checkpoints
(``--no-checkpoints`` leaves that to the server), so neither autovacuum of
earlier rows nor the full-page writes that follow a checkpoint land in a drain.

The medians over the repetitions are printed with each ratio ours / peer,
then in how many repetitions a second executor process raised our 3-action
rate (2x4 against the 1x4 drain next to it), the same 1x4 drain run again on
the 2x4 drain's other side (A/A: how far the machine moved on its own between
two drains) with 2x4 against the mean of the two, the 2x4 drain's PostgreSQL
CPU an instance over that of its two 1x4 neighbours in each repetition, and the
cores each drain kept busy (its rate times its CPU per unit).
The figures need the ``bench`` extra (``pip install -e ".[bench]"``); a peer
that is not installed is reported and its ratios left out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import psycopg  # noqa: E402

from benchmarks.executor_benchmark import (  # noqa: E402
    CommitWait,
    admin_url,
    commit_rate,
    commit_wait,
    manage,
    url_for,
)
from benchmarks.executor_benchmark import run_order as alternate  # noqa: E402
from benchmarks.gated_executor import READY  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
# Units each system runs before the figures (so no drain starts on empty tables).
WARM_UP = 500
# Job arguments of the latency samples (no other job of the run uses them).
LATENCY_BASE = 10**6


# -- meters ----------------------------------------------------------------------


def _proc_cpu(pid: int, *, children: bool) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # after the comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster, its live children, and its exited (waited) children."""
    total = _proc_cpu(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == postmaster:
            total += _proc_cpu(int(entry.name), children=False)
    return total


def python_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Reading:
    commits: int
    wal_bytes: int
    wal_records: int
    pg_cpu: float
    py_cpu: float
    checkpoints: int = 0

    def minus(self, other: Reading, units: int) -> dict[str, float]:
        return {
            # a count, not per unit: after a checkpoint begins, the first change of
            # each page writes the whole page to WAL, so a drain it lands in pays
            # more WAL and CPU per unit than its pair
            "checkpoints": float(self.checkpoints - other.checkpoints),
            "commits": (self.commits - other.commits) / units,
            "wal_bytes": (self.wal_bytes - other.wal_bytes) / units,
            "wal_records": (self.wal_records - other.wal_records) / units,
            "pg_cpu_ms": (self.pg_cpu - other.pg_cpu) * 1000 / units,
            "py_cpu_ms": (self.py_cpu - other.py_cpu) * 1000 / units,
        }


# Checkpoints the server counted since its statistics were reset (17 moved them).
CHECKPOINTS = {
    False: "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter",
    True: "SELECT num_timed + num_requested FROM pg_stat_checkpointer",
}


class Meter:
    def __init__(self) -> None:
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        self.postmaster = int(Path(data, "postmaster.pid").read_text().split()[0])

    def read(self) -> Reading:
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            commits = conn.execute("SELECT sum(xact_commit) FROM pg_stat_database").fetchone()[0]
            wal_bytes, wal_records = conn.execute(
                "SELECT wal_bytes::bigint, wal_records FROM pg_stat_wal"
            ).fetchone()
            checkpoints_sql = CHECKPOINTS[conn.info.server_version >= 170000]
            checkpoints = conn.execute(checkpoints_sql).fetchone()[0]
        return Reading(
            int(commits),
            int(wal_bytes),
            int(wal_records),
            postgres_cpu(self.postmaster),
            python_cpu(),
            int(checkpoints),
        )


# -- the server's WAL ------------------------------------------------------------

# WAL segments the run has the server create and recycle before the figures:
# 1 GB, PostgreSQL's default max_wal_size (the most a checkpoint recycles ahead).
WAL_SEGMENTS = 64


@dataclass(frozen=True)
class WalReady:
    """What :func:`ready_wal` did: segments created, the median switch, segments ahead."""

    created: int
    switch_ms: float
    ahead: int


def wal_ahead(conn: psycopg.Connection) -> int:
    """WAL segment files after the one being written: recycled, ready for the WAL to come."""
    return conn.execute(
        "SELECT count(*) FROM pg_ls_waldir() "
        "WHERE name ~ '^[0-9A-F]{24}$' AND name > pg_walfile_name(pg_current_wal_lsn())"
    ).fetchone()[0]


def wal_written(conn: psycopg.Connection) -> int:
    """Bytes of WAL the server has written since it was created (its insert position)."""
    return int(
        conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()[0]
    )


def ready_wal(url: str, segments: int = WAL_SEGMENTS) -> WalReady | None:
    """Have the server hold WAL segments ahead of its insert position, as a running one does.

    A fresh server creates each 16 MB WAL segment when its WAL first reaches it,
    zero-filled and fsynced while it holds the WAL write lock, so every
    committer waits (about 50 ms on the machine of docs/performance.md, against
    0.35 ms for a commit into a segment that exists). A server that has run
    through a checkpoint renames its old segments into the ones ahead instead
    and never pays it. The cost is per byte of WAL, and the sides of a ratio
    write different amounts (ours 3x Procrastinate's per unit), so a fresh
    server would bill them a cost a running one does not have. ``segments``
    switches, each after one WAL record, then a ``CHECKPOINT``, which recycles
    the old segments ahead of the insert position (up to ``max_wal_size``).
    None when the role may not (switching WAL and checkpoints need a
    superuser): the server is then measured as it is.
    """
    times = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(segments):
                started = time.perf_counter()
                conn.execute("SELECT pg_logical_emit_message(false, 'vertique-peers', '')")
                conn.execute("SELECT pg_switch_wal()")
                times.append((time.perf_counter() - started) * 1000)
            conn.execute("CHECKPOINT")
            ahead = wal_ahead(conn)
    except psycopg.errors.InsufficientPrivilege:
        return None
    return WalReady(segments, statistics.median(times) if times else 0.0, ahead)


def wal_line(ready: WalReady | None) -> str:
    """The report's line on the WAL the server held ahead when the figures began."""
    if ready is None:
        return "WAL: the server as it is (--wal-segments 0, or the role may not switch WAL)"
    return (
        f"WAL: {ready.created} segments created before the figures "
        f"(a switch: {ready.switch_ms:.1f} ms, median), "
        f"{ready.ahead} ready ahead of the insert position after a checkpoint"
    )


# -- databases -------------------------------------------------------------------


@contextlib.contextmanager
def database(name: str) -> Iterator[str]:
    dbname = f"peers_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield url_for(dbname)
    finally:
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def run_json(module: str, *args: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def span_seconds(url: str, sql: str, after: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        return float(conn.execute(sql, (after,)).fetchone()[0] or 0.0)


def last_id(url: str, table: str) -> int:
    """The newest row id of ``table``: a drain's own rows are the ones after it."""
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(f"SELECT COALESCE(max(id), 0) FROM {table}").fetchone()[0])


# -- ours ------------------------------------------------------------------------

OUR_SPAN = """
SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM workflow_history
WHERE id > %s AND event_type IN ('WORKFLOW_STARTED', 'SIGNAL_APPLIED', 'WORKFLOW_COMPLETED')
"""

OUR_WAIT_SPAN = """
SELECT extract(epoch FROM
    (max(created_at) FILTER (WHERE event_type = 'WORKFLOW_STARTED')
     - min(created_at) FILTER (WHERE event_type = 'WORKFLOW_STARTED'))
  + (max(created_at) FILTER (WHERE event_type = 'WORKFLOW_COMPLETED')
     - min(created_at) FILTER (WHERE event_type = 'SIGNAL_APPLIED')))
FROM workflow_history WHERE id > %s
"""


class Ours:
    name = "vertique_workflow"

    def __init__(self, url: str) -> None:
        self.url = url
        os.environ["DATABASE_URL"] = url
        manage(url, "migrate", "-v", "0")
        import django

        django.setup()
        # Work done before the figures: every drain then runs beside the rows of
        # earlier ones, as a live system does (and as its statistics say).
        self.record("bench-three-actions", WARM_UP)
        wait_all(self.executors(1, 4))

    def record(self, definition: str, count: int) -> None:
        from django.db import connections, transaction

        import vertique_workflow as wf

        batch = uuid.uuid4().hex
        with transaction.atomic():
            for i in range(count):
                wf.start(definition, {}, idempotency_key=f"{batch}-{i}")
        connections.close_all()

    def signal_all(self) -> None:
        from django.db import connections, transaction

        import vertique_workflow as wf
        from vertique_workflow.models import WorkflowInstance

        ids = WorkflowInstance.objects.filter(status="WAITING").values_list("id", flat=True)
        with transaction.atomic():
            for instance_id in list(ids):
                wf.signal(instance_id, "go", None, dedup_key="go")
        connections.close_all()

    def executors(
        self,
        processes: int,
        threads: int,
        *,
        until_idle: bool = True,
        env: dict[str, str] | None = None,
    ) -> list[Any]:
        """``processes`` executor processes of ``threads`` workers, let go together.

        Each is started through :mod:`benchmarks.gated_executor` and waits, set up
        and imported, until every one of them is: a drain's span (first start to
        last completion) then holds no process's start-up, however many there are.
        """
        args = ["-v", "0", "--concurrency", str(threads), "--no-relay"]
        args += ["--until-idle"] if until_idle else []
        environment = {**os.environ, "DATABASE_URL": self.url, "PYTHONPATH": str(ROOT)}
        return start_together(
            [sys.executable, "-m", "benchmarks.gated_executor", *args],
            {**environment, **(env or {})},
            processes,
        )

    def drain(self, meter: Meter, count: int, processes: int, threads: int, kind: str) -> dict:
        marker = last_id(self.url, "workflow_history")
        self.record("bench-three-actions" if kind == "three" else "bench-signal", count)
        analyze(self.url)
        before = meter.read()
        wait_all(self.executors(processes, threads))
        span = span_seconds(self.url, OUR_SPAN, marker)
        if kind == "wait":
            mid = meter.read()
            self.signal_all()  # the recording of the signals is the caller's work, not the drain's
            resumed = meter.read()
            before = Reading(
                before.commits + resumed.commits - mid.commits,
                before.wal_bytes + resumed.wal_bytes - mid.wal_bytes,
                before.wal_records + resumed.wal_records - mid.wal_records,
                before.pg_cpu + resumed.pg_cpu - mid.pg_cpu,
                before.py_cpu + resumed.py_cpu - mid.py_cpu,
                before.checkpoints + resumed.checkpoints - mid.checkpoints,
            )
            wait_all(self.executors(processes, threads))
            span = span_seconds(self.url, OUR_WAIT_SPAN, marker)
        figures = meter.read().minus(before, count)
        runs = 2 if kind == "wait" else 1
        figures["py_cpu_ms"] -= runs * self.idle_cpu((processes, threads)) * 1000 / count
        return {"rate": count / span, **figures}

    def idle_cpu(self, config: tuple[int, int]) -> float:
        """Python CPU seconds of executor processes that start, find nothing, and exit.

        Subtracted from a drain's Python CPU, so the figure is what a running
        executor spends per instance (Django's start-up is not per instance).
        Measured right after every drain, in its minute: a shared machine's speed
        moves between minutes, and until 7 December 2026 one sample per
        configuration and run, taken in another minute, was subtracted from every
        drain (twice at 2x4, which read 0.13 ms an instance in one repetition).
        """
        started = python_cpu()
        wait_all(self.executors(*config))
        return python_cpu() - started

    def start_each(self, count: int) -> float:
        rate = count / self.start_chunk(count)
        self.run_started()
        return rate

    def start_chunk(self, count: int) -> float:
        """Seconds ``count`` starts take, one after another, each its own transaction."""
        import vertique_workflow as wf

        batch = uuid.uuid4().hex
        started = time.perf_counter()
        for i in range(count):
            wf.start("bench-stamp", {}, idempotency_key=f"{batch}-{i}")
        return time.perf_counter() - started

    def run_started(self) -> None:
        """Run the started instances (untimed): the next figure starts empty."""
        from django.db import connections

        connections.close_all()
        wait_all(self.executors(1, 4))

    def latency(self, samples: int) -> float:
        from django.db import connections

        import vertique_workflow as wf

        stamps = Path(f"/tmp/peers-stamps-{uuid.uuid4().hex}")
        stamps.touch()
        procs = self.executors(1, 4, until_idle=False, env={"VERTIQUE_PEERS_STAMPS": str(stamps)})
        try:
            # the stamp action appends "<i> <time>" to the file, as the Procrastinate
            # peer's task does: both are timed by the same poll of that file
            batch = uuid.uuid4().hex
            values = []
            for i in range(-1, samples):  # -1: the warm-up the clock does not time
                wf.start("bench-stamp", {"i": i}, idempotency_key=f"{batch}-{i}")
                returned = time.time()
                started = wait_stamp(stamps, i)
                if i >= 0:
                    values.append((started - returned) * 1000)
            return statistics.median(values)
        finally:
            stop_all(procs)
            connections.close_all()
            stamps.unlink(missing_ok=True)


# -- Procrastinate ---------------------------------------------------------------

PROCRASTINATE_SPAN = """
SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                         - min(at) FILTER (WHERE type = 'started'))
FROM procrastinate_events WHERE id > %s
"""


class Procrastinate:
    name = "Procrastinate"

    def __init__(self, url: str) -> None:
        self.url = url
        self.env = {"PEERS_PROCRASTINATE_URL": url}
        run_json("benchmarks.peer_procrastinate", "schema", env=self.env)
        run_json("benchmarks.peer_procrastinate", "defer-batch", str(WARM_UP), env=self.env)
        run_json("benchmarks.peer_procrastinate", "worker", "4", env=self.env)

    def drain(self, meter: Meter, count: int, concurrency: int) -> dict:
        marker = last_id(self.url, "procrastinate_events")
        run_json("benchmarks.peer_procrastinate", "defer-batch", str(count), env=self.env)
        analyze(self.url)
        before = meter.read()
        run_json("benchmarks.peer_procrastinate", "worker", str(concurrency), env=self.env)
        span = span_seconds(self.url, PROCRASTINATE_SPAN, marker)
        figures = meter.read().minus(before, count)
        figures["py_cpu_ms"] -= self.idle_cpu(concurrency) * 1000 / count
        return {"rate": count / span, **figures}

    def idle_cpu(self, concurrency: int) -> float:
        """Python CPU seconds of a worker that starts, finds nothing, and exits.

        Measured right after every drain, in its minute, as ours is (:meth:`Ours.idle_cpu`).
        """
        started = python_cpu()
        run_json("benchmarks.peer_procrastinate", "worker", str(concurrency), env=self.env)
        return python_cpu() - started

    def defer_chunk(self, count: int) -> float:
        """Seconds ``count`` defers take, one after another (timed in the worker process)."""
        rate = run_json("benchmarks.peer_procrastinate", "defer-each", str(count), env=self.env)
        return count / float(rate["rate"])

    def run_deferred(self) -> None:
        """Run the deferred jobs (untimed): the next figure starts on an empty queue."""
        run_json("benchmarks.peer_procrastinate", "worker", "4", env=self.env)

    def latency(self, samples: int) -> float:
        stamps = Path(f"/tmp/peers-stamps-{uuid.uuid4().hex}")
        stamps.touch()
        env = {**os.environ, **self.env, "VERTIQUE_PEERS_STAMPS": str(stamps)}
        env["PYTHONPATH"] = str(ROOT)
        worker = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peer_procrastinate", "listen", "4"],
            cwd=ROOT,
            env=env,
        )
        os.environ.update(self.env)
        from benchmarks.peer_procrastinate_app import app, noop

        try:
            with app.open():
                values = []
                for i in range(-1, samples):  # -1: the warm-up the clock does not time
                    noop.defer(i=LATENCY_BASE + i)
                    returned = time.time()
                    started = wait_stamp(stamps, LATENCY_BASE + i)
                    if i >= 0:
                        values.append((started - returned) * 1000)
            return statistics.median(values)
        finally:
            stop_all([worker])
            stamps.unlink(missing_ok=True)


def wait_stamp(stamps: Path, i: int) -> float:
    prefix = f"{i} "
    while True:
        for line in stamps.read_text().splitlines():
            if line.startswith(prefix):
                return float(line.split()[1])
        time.sleep(0.002)  # the figure comes from the stamp, not from this poll


# -- DBOS ------------------------------------------------------------------------


class Dbos:
    name = "DBOS"

    def __init__(self, url: str) -> None:
        self.url = url
        self.env = {"PEERS_DBOS_URL": url}
        run_json("benchmarks.peer_dbos", "rate", str(WARM_UP), env=self.env)

    def drain(self, meter: Meter, count: int) -> dict:
        before = meter.read()
        figures = run_json("benchmarks.peer_dbos", "rate", str(count), env=self.env)
        return {"rate": figures["rate"], **meter.read().minus(before, count)}

    def latency(self, samples: int) -> dict:
        return run_json("benchmarks.peer_dbos", "latency", str(samples), env=self.env)


# -- the run ---------------------------------------------------------------------


def analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def vacuum(urls: list[str]) -> None:
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")


def checkpoint(url: str) -> bool:
    """Have the server checkpoint now, so none starts during the scenario that follows.

    A timed checkpoint comes ``checkpoint_timeout`` after the last one began and a
    requested one after ``max_wal_size`` of WAL since it, so a scenario that starts
    right after one (and writes less than that) meets none. A checkpoint that
    lands in a drain makes the first change of each page after it log the whole
    page: that drain pays several times the WAL (docs/performance.md, "What a
    3-action instance writes to the WAL") and its pair does not. Called before a
    scenario records its work, so the full pages of the tables that recording
    touches are billed to the recording, not to the drain. False when the role
    may not (a superuser or ``pg_checkpoint``): the server then checkpoints when
    it would.
    """
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def checkpoint_line(enabled: bool, allowed: bool) -> str:
    """The report's line on the checkpoints the run asked for before its scenarios."""
    if not enabled:
        return "checkpoints: when the server runs them (--no-checkpoints)"
    if not allowed:
        return "checkpoints: when the server runs them (the role may not checkpoint)"
    return "checkpoints: one before every scenario (none starts during a drain)"


def start_together(command: list[str], env: dict[str, str], count: int) -> list[Any]:
    """``count`` gated processes (:mod:`benchmarks.gated_executor`), released once all are ready."""
    procs = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline().strip()
            if line != READY:
                raise RuntimeError(f"an executor process did not get ready: {line!r}")
            proc.stdout.close()  # the process writes its output to standard error from here
    except BaseException:
        stop_all(procs)
        raise
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.close()
    return procs


def wait_all(procs: list[Any]) -> None:
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError("a worker process failed")


def stop_all(procs: list[Any]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(60)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@dataclass
class Results:
    figures: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, name: str, value: dict[str, float] | float) -> None:
        self.figures.setdefault(name, []).append(
            value if isinstance(value, dict) else {"value": value}
        )

    def median(self, name: str, key: str = "value") -> float | None:
        values = self.values(name, key)
        return statistics.median(values) if values else None

    def values(self, name: str, key: str = "value") -> list[float]:
        return [v[key] for v in self.figures.get(name, []) if key in v]


def ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or peer == 0:
        return "n/a"
    return f"{ours / peer:.2f}"


def paired(ours: list[float], peers: list[float]) -> str:
    """The ratio of each repetition, lowest to highest: the spread the median hides.

    The figures of one repetition ran minutes apart on the same machine, so their
    ratio cancels most of the machine's drift between repetitions.
    """
    if not ours or len(ours) != len(peers) or 0 in peers:
        return "n/a"
    ratios = sorted(a / b for a, b in zip(ours, peers, strict=True))
    return f"{ratios[0]:.2f} to {ratios[-1]:.2f}"


def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}{unit}"


def report(results: Results, limit: float, waits: Sequence[CommitWait] = ()) -> None:
    m = results.median
    print("\n## medians over the repetitions\n")
    for name in sorted(results.figures):
        row = results.figures[name]
        keys = sorted({k for v in row for k in v})
        print(f"{name}: " + ", ".join(f"{k}={fmt(m(name, k), digits=2)}" for k in keys))
    rows: list[tuple[str, str, str, str, str]] = []

    def line(figure: str, ours: Any, peer: Any, unit: str, digits: int = 1) -> None:
        """``ours`` and ``peer``: (scenario name, key) of the figures compared."""
        a, b = m(*ours), m(*peer)
        spread = paired(results.values(*ours), results.values(*peer))
        rows.append((figure, fmt(a, unit, digits), fmt(b, unit, digits), ratio(a, b), spread))

    line(
        "3-action drain 1x4 / Procrastinate C=4",
        ("ours 3-action 1x4", "rate"),
        ("procrastinate C=4", "rate"),
        "/s",
        0,
    )
    line(
        "3-action drain 1x1 / Procrastinate C=1",
        ("ours 3-action 1x1", "rate"),
        ("procrastinate C=1", "rate"),
        "/s",
        0,
    )
    line(
        "3-action drain 2x4 / Procrastinate C=4",
        ("ours 3-action 2x4", "rate"),
        ("procrastinate C=4", "rate"),
        "/s",
        0,
    )
    line(
        "3-action drain 2x4 / 1x4 (a second executor process)",
        ("ours 3-action 2x4", "rate"),
        ("ours 3-action 1x4", "rate"),
        "/s",
        0,
    )
    line(
        "one-wait drain 1x4 / Procrastinate C=4",
        ("ours one-wait 1x4", "rate"),
        ("procrastinate C=4", "rate"),
        "/s",
        0,
    )
    line(
        "3-action drain 1x4 / DBOS 3-step (start_workflow)",
        ("ours 3-action 1x4", "rate"),
        ("dbos 3-step", "rate"),
        "/s",
        0,
    )
    line(
        "PostgreSQL CPU per instance / per job",
        ("ours 3-action 1x4", "pg_cpu_ms"),
        ("procrastinate C=4", "pg_cpu_ms"),
        " ms",
        2,
    )
    line(
        "Python CPU per instance / per job",
        ("ours 3-action 1x4", "py_cpu_ms"),
        ("procrastinate C=4", "py_cpu_ms"),
        " ms",
        2,
    )
    line(
        "WAL bytes per instance / per job",
        ("ours 3-action 1x4", "wal_bytes"),
        ("procrastinate C=4", "wal_bytes"),
        " B",
        0,
    )
    line(
        "WAL records per instance / per job",
        ("ours 3-action 1x4", "wal_records"),
        ("procrastinate C=4", "wal_records"),
        "",
        1,
    )
    line(
        "commits per instance / per job",
        ("ours 3-action 1x4", "commits"),
        ("procrastinate C=4", "commits"),
        "",
        2,
    )
    line(
        "start() one per transaction / defer one at a time",
        ("ours start each", "value"),
        ("procrastinate defer each", "value"),
        "/s",
        0,
    )
    line(
        "commit returned -> first action p50 / defer returned -> job starts",
        ("ours latency", "value"),
        ("procrastinate latency", "value"),
        " ms",
        2,
    )
    line(
        "commit returned -> first action p50 / DBOS start returned -> first step",
        ("ours latency", "value"),
        ("dbos latency", "first_step_p50"),
        " ms",
        2,
    )
    print(f"\ncommit-rate limit of this server (4 clients, single-row INSERT): {limit:,.0f}/s\n")
    print("| figure | ours | peer | ratio | per repetition |\n|---|---|---|---|---|")
    for figure, ours, peer, r, spread in rows:
        print(f"| {figure} | {ours} | {peer} | {r} | {spread} |")
    second_process(results)
    cores_busy(results)
    commit_waits(results, waits)


def second_process(results: Results) -> None:
    """In how many repetitions the 2x4 drain ran faster than the 1x4 drain next to it.

    The target is about every repetition, not the medians: a second process on the
    same machine must never lower the rate.
    """
    one = results.values("ours 3-action 1x4", "rate")
    two = results.values("ours 3-action 2x4", "rate")
    if not one or len(one) != len(two):
        return
    raised = sum(b > a for a, b in zip(one, two, strict=True))
    # a repetition in which the server counted a checkpoint during either drain is marked
    marked = [
        bool(a or b)
        for a, b in zip(
            results.values("ours 3-action 1x4", "checkpoints") or [0.0] * len(one),
            results.values("ours 3-action 2x4", "checkpoints") or [0.0] * len(two),
            strict=True,
        )
    ]
    pairs = ", ".join(
        f"{a:,.0f} -> {b:,.0f}{'*' if mark else ''}"
        for a, b, mark in zip(one, two, marked, strict=True)
    )
    print(
        f"\na second executor process raised the 3-action rate in {raised} of {len(one)} "
        f"repetitions (1x4 -> 2x4, /s: {pairs})"
    )
    if any(marked):
        print("(*: the server counted a checkpoint during one of the two drains)")
    around(one, two, results.values(AGAIN, "rate"))
    one_cpu, two_cpu, again_cpu = (
        results.values(name, "pg_cpu_ms")
        for name in ("ours 3-action 1x4", "ours 3-action 2x4", AGAIN)
    )
    cpu_around(one_cpu, two_cpu, again_cpu)


def over_neighbours(one: list[float], two: list[float], again: list[float]) -> list[float]:
    """Each repetition's 2x4 figure over the mean of the two 1x4 figures around it."""
    return [t / ((a + b) / 2) for a, b, t in zip(one, again, two, strict=True)]


def around(one: list[float], two: list[float], again: list[float]) -> None:
    """The 2x4 drain against the two 1x4 drains around it, and those two against each other.

    The same drain run twice a minute apart (A/A) is how far this machine moves
    on its own: a 2x4 / 1x4 ratio inside that spread says nothing about a second
    process. Against the mean of its two neighbours the 2x4 drain is compared
    with the machine on both sides of it, so a steady drift cancels.
    """
    if not again or len(again) != len(one):
        return
    same = [b / a for a, b in zip(one, again, strict=True)]
    both = over_neighbours(one, two, again)
    print(
        f"the same 1x4 drain twice, before and after the 2x4 drain (A/A): "
        f"{min(same):.2f} to {max(same):.2f}; 2x4 / the mean of the two: "
        f"{min(both):.2f} to {max(both):.2f}, above 1 in {sum(r > 1 for r in both)} "
        f"of {len(both)} repetitions"
    )


def cpu_around(one: list[float], two: list[float], again: list[float]) -> None:
    """The 2x4 drain's PostgreSQL CPU an instance over that of the 1x4 drains around it.

    Both run the same statements on the same buffers an instance
    (docs/performance.md, "What a second process costs the backends"), yet in most
    repetitions a second process lowered the rate the 2x4 drain's backends spent a
    quarter to a half more CPU an instance: printed per repetition, in order, so a
    lowered rate can be read against it (and against the A/A line above it).
    """
    if not again or not len(one) == len(two) == len(again) or 0.0 in one + again:
        return
    ratios = ", ".join(f"{r:.2f}" for r in over_neighbours(one, two, again))
    print(f"PostgreSQL CPU an instance, 2x4 / the mean of the two 1x4 drains: {ratios}")


def drain_cores(figures: dict[str, float]) -> tuple[float, float] | None:
    """(PostgreSQL, Python) cores a drain kept busy: its rate times its CPU per unit.

    None when the drain has no CPU figures. Both meters bound the true figure from
    above (PostgreSQL's counts the backends' start-up; DBOS's Python its start-up).
    """
    if not {"rate", "pg_cpu_ms", "py_cpu_ms"} <= figures.keys():
        return None
    rate = figures["rate"]
    return rate * figures["pg_cpu_ms"] / 1000, rate * figures["py_cpu_ms"] / 1000


def cores_busy(results: Results) -> None:
    """The cores each drain kept busy (medians over the repetitions).

    On a machine of two cores this says which side's rate is bound by what: a drain
    whose Python holds one core is bound by its interpreter lock, one whose total
    nears two by the machine; and a side that needs more of the machine loses more
    of its rate when other work takes part of it.
    """
    rows = []
    for name in sorted(results.figures):
        cores = [c for c in map(drain_cores, results.figures[name]) if c is not None]
        if cores:
            pg = statistics.median(c[0] for c in cores)
            py = statistics.median(c[1] for c in cores)
            total = statistics.median(c[0] + c[1] for c in cores)
            rows.append(f"| {name} | {pg:.2f} | {py:.2f} | {total:.2f} |")
    if rows:
        print(
            "\ncores kept busy during each drain (rate x CPU per unit, medians):\n\n"
            "| drain | PostgreSQL | Python | both |\n|---|---|---|---|"
        )
        print("\n".join(rows))


def commit_waits(results: Results, waits: Sequence[CommitWait]) -> None:
    """The server's synchronous-commit price by WAL per commit, and the one-thread drains' WAL.

    One thread's drain waits for every commit it makes, so this is the part of the
    1x1 figures that belongs to the machine's disk rather than to either system.
    """
    if not waits:
        return
    print(
        "\nsynchronous commit of this server, one client, autocommit INSERT (medians):\n\n"
        "| WAL per commit | commit, synchronous | commit, asynchronous | flush wait |\n"
        "|---|---|---|---|"
    )
    for wait in waits:
        print(
            f"| {wait.wal_bytes:,.0f} B | {wait.sync_us:,.0f} µs | {wait.async_us:,.0f} µs "
            f"| {wait.wait_us:,.0f} µs |"
        )
    m = results.median
    print(
        "\nWAL and commits per unit of the one-thread drains: "
        f"ours {fmt(m('ours 3-action 1x1', 'wal_bytes'), ' B', 0)} in "
        f"{fmt(m('ours 3-action 1x1', 'commits'), '', 2)} commits (the claim's commit does "
        "not wait for its flush: the segment's commit flushes both), Procrastinate "
        f"{fmt(m('procrastinate C=1', 'wal_bytes'), ' B', 0)} in "
        f"{fmt(m('procrastinate C=1', 'commits'), '', 2)} commits"
    )


# The 1x4 drain run a second time, on the 2x4 drain's other side (A/A).
AGAIN = "ours 3-action 1x4 again"

# The scenarios a ratio compares run next to each other: a shared machine's speed
# drifts over minutes, and a ratio of figures measured a minute apart measured the
# drift too (on 6 December 2026 Procrastinate's own C=4 drain moved from 594 to 867/s
# between the repetitions of one run). Each group's scenarios run back to back, in
# the listed order in even repetitions and reversed in odd ones, so neither side of a
# ratio always runs first.
GROUPS: list[list[str]] = [
    [
        # 2x4 between two 1x4 drains: does a second process raise the rate, and how
        # far did the machine move while it ran (the same drain twice, A/A)?
        AGAIN,
        "ours 3-action 2x4",
        "ours 3-action 1x4",
        "procrastinate C=4",
        "dbos 3-step",
        "ours one-wait 1x4",
    ],
    ["ours 3-action 1x1", "procrastinate C=1"],
    ["ours start each", "procrastinate defer each"],
    ["ours latency", "procrastinate latency", "dbos latency"],
]


def each_interleaved(ours: Ours, proc: Procrastinate, count: int, chunks: int) -> dict[str, float]:
    """Our one-at-a-time starts and Procrastinate's defers, in alternating chunks.

    A figure of one or two seconds takes whatever that minute of a shared
    machine gives (on 6 December 2026 the same starts ran at 1,134 to 3,122/s
    within minutes): ``chunks`` alternating slices, each side first in every
    other one, put both sides in the same minutes. Each rate is its side's
    count over the sum of its slices; the started and deferred work is run
    afterwards, untimed.
    """
    size = max(1, count // chunks)
    spent = {"ours": 0.0, "proc": 0.0}
    timed = {"ours": ours.start_chunk, "proc": proc.defer_chunk}
    for chunk in range(chunks):
        for side in ("ours", "proc") if chunk % 2 == 0 else ("proc", "ours"):
            spent[side] += timed[side](size)
    ours.run_started()
    proc.run_deferred()
    return {side: size * chunks / seconds for side, seconds in spent.items()}


def run_order(groups: list[list[str]], repetition: int) -> list[str]:
    """The scenarios of one repetition: each group back to back, reversed in odd repetitions.

    Each group alternates as the executor benchmark's cells do
    (:func:`benchmarks.executor_benchmark.run_order`).
    """
    return [name for group in groups for name in alternate(group, repetition)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=2000, help="units per drain")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument("--starts", type=int, default=2000, help="one-per-transaction starts")
    parser.add_argument(
        "--each-chunks",
        type=int,
        default=8,
        help="alternating slices the one-at-a-time starts and defers are measured in",
    )
    parser.add_argument(
        "--wal-segments",
        type=int,
        default=WAL_SEGMENTS,
        help="WAL segments created and recycled before the figures (0: the server as it is)",
    )
    parser.add_argument(
        "--no-checkpoints",
        action="store_true",
        help="no CHECKPOINT before every scenario: the server checkpoints when it would",
    )
    parser.add_argument("--skip", default="", help="comma list: procrastinate,dbos,ours-wide")
    parser.add_argument(
        "--only",
        default="",
        help="comma list of words: run only the scenarios whose name holds one (e.g. latency)",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    meter = Meter()
    results = Results()
    with contextlib.ExitStack() as stack:
        ours = Ours(stack.enter_context(database("vw")))
        limit = commit_rate(ours.url)
        waits = commit_wait(ours.url)
        peers_present = {
            "procrastinate": installed("procrastinate") and "procrastinate" not in skip,
            "dbos": installed("dbos") and "dbos" not in skip,
        }
        for peer, present in peers_present.items():
            if not present:
                print(f"{peer}: not installed or skipped (pip install -e '.[bench]'): left out")
        proc = (
            Procrastinate(stack.enter_context(database("proc")))
            if peers_present["procrastinate"]
            else None
        )
        dbos = Dbos(stack.enter_context(database("dbos"))) if peers_present["dbos"] else None
        n = args.instances
        measured: dict[str, float] = {}

        def each(side: str) -> float:
            """One side of the one-at-a-time pair: both run together, interleaved."""
            if proc is None:
                return ours.start_each(args.starts)
            if side not in measured:
                measured.update(each_interleaved(ours, proc, args.starts, args.each_chunks))
            return measured.pop(side)

        available: dict[str, Callable[[], Any]] = {
            "ours 3-action 1x1": lambda: ours.drain(meter, n, 1, 1, "three"),
            "ours 3-action 1x4": lambda: ours.drain(meter, n, 1, 4, "three"),
            AGAIN: lambda: ours.drain(meter, n, 1, 4, "three"),
            "ours 3-action 2x4": lambda: ours.drain(meter, n, 2, 4, "three"),
            "ours one-wait 1x4": lambda: ours.drain(meter, n, 1, 4, "wait"),
            "ours start each": lambda: each("ours"),
            "ours latency": lambda: ours.latency(args.latency_samples),
        }
        if proc is not None:
            available |= {
                "procrastinate C=1": lambda: proc.drain(meter, n, 1),
                "procrastinate C=4": lambda: proc.drain(meter, n, 4),
                "procrastinate defer each": lambda: each("proc"),
                "procrastinate latency": lambda: proc.latency(args.latency_samples),
            }
        if dbos is not None:
            available |= {
                "dbos 3-step": lambda: dbos.drain(meter, n),
                "dbos latency": lambda: dbos.latency(args.latency_samples),
            }
        only = [word for word in args.only.split(",") if word]
        groups = [
            [
                name
                for name in group
                if name in available and (not only or any(w in name for w in only))
            ]
            for group in GROUPS
        ]
        urls = [system.url for system in (ours, proc, dbos) if system is not None]
        print(wal_line(ready_wal(admin_url(), args.wal_segments) if args.wal_segments else None))
        checkpoints = not args.no_checkpoints and checkpoint(admin_url())
        print(checkpoint_line(not args.no_checkpoints, checkpoints))
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            wal_before = wal_written(conn)
        for repetition in range(args.repetitions):
            print(f"-- repetition {repetition + 1} of {args.repetitions}", flush=True)
            for name in run_order(groups, repetition):
                # earlier scenarios' dead rows vacuumed now, so autovacuum does not bill
                # them to this one; then a checkpoint, so none lands in its drain
                vacuum(urls)
                if checkpoints:
                    checkpoint(admin_url())
                value = available[name]()
                results.add(name, value)
                shown = (
                    value
                    if isinstance(value, float)
                    else {k: round(v, 2) for k, v in value.items()}
                )
                print(f"   {name}: {shown}", flush=True)
        report(results, limit, waits)
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            written = (wal_written(conn) - wal_before) / 2**20
            print(f"WAL written during the figures: {written:,.0f} MB")
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                print(f"WAL segments ahead of the insert position after the run: {wal_ahead(conn)}")


if __name__ == "__main__":
    main()
