"""Procrastinate's side of benchmarks/peers.py: a no-op task, its worker, its defers.

    python -m benchmarks.peer_procrastinate schema|defer-batch N|defer-each N|worker C|listen C

Configured as Procrastinate's docs recommend for a PostgreSQL-only deployment:
``PsycopgConnector`` (psycopg 3, its connection pool), an ``async`` task (the
docs' advice for ``concurrency > 1``), one worker process with
``concurrency=C`` and LISTEN/NOTIFY on (the default). Every mode prints one
JSON line with its figures. The app and its task live in
``peer_procrastinate_app`` (Procrastinate wants them in an importable module,
not in ``__main__``).
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks.peer_procrastinate_app import app, noop


def main() -> None:
    mode = sys.argv[1]
    if mode == "schema":
        with app.open():
            app.schema_manager.apply_schema()
        print(json.dumps({"ok": True}))
    elif mode == "defer-batch":
        count = int(sys.argv[2])
        with app.open():
            for start in range(0, count, 1000):
                noop.batch_defer(*({"i": i} for i in range(start, min(count, start + 1000))))
        print(json.dumps({"deferred": count}))
    elif mode == "defer-each":
        count = int(sys.argv[2])
        with app.open():
            started = time.perf_counter()
            for i in range(count):
                noop.defer(i=i)
            elapsed = time.perf_counter() - started
        print(json.dumps({"rate": count / elapsed}))
    elif mode == "worker":
        # drains the queue and returns (wait=False): the drain figure
        app.run_worker(queues=["peers"], concurrency=int(sys.argv[2]), wait=False)
        print(json.dumps({"ok": True}))
    elif mode == "listen":
        # an idle worker woken by LISTEN/NOTIFY: the latency figure (stopped by SIGTERM)
        app.run_worker(queues=["peers"], concurrency=int(sys.argv[2]), wait=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
