"""Timer benchmark: how late a timer is applied after its ``fire_at`` (database clock).

    python scripts/with_postgres.py --durable -- python -m benchmarks.timer_benchmark

Against one PostgreSQL (the throwaway one above, or DATABASE_URL): ``--timers``
instances of ``bench-timer`` (start → ``timer(until=...)`` → end) are started,
each with its own instant in the start payload, spread evenly over
``--spread`` seconds beginning ``--lead`` seconds after the recording. One
real ``workflow_executor`` process (``--threads`` workers each, e.g. 1 and 4)
runs the start segments, which record the timers and their TIMER commands,
and then has no other traffic: it sleeps until the earliest availability
(``store/commands.availability_delays``) and wakes again for every timer.
The poll interval is 60 s, so a timer that fires on time was woken by the
executor's own schedule, not by polling, and not by a notification either
(the NOTIFY of a TIMER command's insert arrives when it is recorded, seconds
before it is due).

Lateness = applied - ``fire_at``, where "applied" is the ``created_at`` of
the instance's ``TIMER_FIRED`` history entry: the column's default is
Django's ``Now()``, ``statement_timestamp()`` on PostgreSQL, so it is the
start of the segment's history insert, its last statements but one (the
commit time itself is not stored). The TIMER command's ``settled_at`` (and
the timer row's ``updated_at``) are ``now()``, the start of the segment's
transaction; the benchmark prints that lateness too: the difference is the
segment's own work. p50/p99/max per configuration, and how many timers were
recorded after their own instant (a start backlog: those would measure the
backlog, not the timer; raise ``--lead`` if it is not 0).

Notifications lost (poll only) is not measured: the executor has no option
to run without its LISTEN connection, and a timer's wake-up does not come
from a notification anyway (see above).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
import uuid

import psycopg

from benchmarks.executor_benchmark import ROOT, bench_database

LATENESS_SQL = """
SELECT extract(epoch FROM h.created_at - t.fire_at) * 1000,
       extract(epoch FROM c.settled_at - t.fire_at) * 1000,
       t.created_at > t.fire_at
FROM workflow_timers t
JOIN workflow_history h ON h.workflow_id = t.workflow_id AND h.event_type = 'TIMER_FIRED'
JOIN workflow_commands c ON c.id = t.command_id
WHERE t.status = 'FIRED'
"""


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def start_executor(url: str, threads: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "workflow_executor",
            "-v",
            "0",
            "--concurrency",
            str(threads),
            "--poll-interval",
            "60000",
            "--stats-interval",
            "3600",
        ],
        cwd=ROOT,
        env=env,
    )


def run(url: str, threads: int, timers: int, lead: float, spread: float) -> None:
    from django.db import connection, transaction

    import vertique_workflow as wf
    from vertique_workflow.testing import flush_workflow_tables

    flush_workflow_tables()
    proc = start_executor(url, threads)
    try:
        # the executor is running (its LISTEN connection open) before the instants are chosen
        with connection.cursor() as cursor:
            deadline = time.monotonic() + 60
            while True:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
                )
                if cursor.fetchone()[0]:
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the executor did not start")
                time.sleep(0.1)
            cursor.execute("SELECT now()")
            base = cursor.fetchone()[0] + datetime.timedelta(seconds=lead)
        step = spread / max(1, timers - 1)
        batch = uuid.uuid4().hex
        with transaction.atomic():
            for i in range(timers):
                fire_at = base + datetime.timedelta(seconds=i * step)
                wf.start(
                    "bench-timer", {"fire_at": fire_at.isoformat()}, idempotency_key=f"{batch}-{i}"
                )
        last = base + datetime.timedelta(seconds=spread)
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT count(*) FILTER (WHERE status = 'COMPLETED'), now() "
                    "FROM workflow_instances"
                )
                done, now = cursor.fetchone()
                if done >= timers:
                    break
                if proc.poll() is not None:
                    raise SystemExit("the executor failed")
                if now > last + datetime.timedelta(seconds=120):
                    raise SystemExit(f"only {done} of {timers} timers applied")
                time.sleep(0.2)
            cursor.execute(LATENESS_SQL)
            rows = cursor.fetchall()
    finally:
        proc.terminate()
        proc.wait(30)
    history = [float(r[0]) for r in rows]
    settled = [float(r[1]) for r in rows]
    backlog = sum(1 for r in rows if r[2])
    print(
        f"timer fire_at → applied (TIMER_FIRED created_at), 1p x {threads}t "
        f"({len(history)} timers over {spread:.0f} s, idle executor, poll 60 s): "
        f"p50 {statistics.median(history):.2f} ms, p99 {percentile(history, 0.99):.2f} ms, "
        f"max {max(history):.2f} ms; segment transaction start (settled_at): "
        f"p50 {statistics.median(settled):.2f} ms, p99 {percentile(settled, 0.99):.2f} ms, "
        f"max {max(settled):.2f} ms; min {min(settled):.2f} ms; "
        f"recorded after their instant: {backlog}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=200)
    parser.add_argument("--threads", default="1,4")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds to the first instant")
    parser.add_argument("--spread", type=float, default=10.0, help="seconds over which they fall")
    args = parser.parse_args()

    with bench_database(statements=False) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("fsync", "synchronous_commit")
            }
        print("server settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        print(
            "applied = created_at of the TIMER_FIRED history entry (statement_timestamp() of "
            "the segment's history insert); settled_at = now() (the segment's start)"
        )
        for threads in map(int, args.threads.split(",")):
            run(url, threads, args.timers, args.lead, args.spread)


if __name__ == "__main__":
    main()
