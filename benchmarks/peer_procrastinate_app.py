"""The Procrastinate app of benchmarks/peers.py: one no-op async task on the queue "peers".

``PEERS_PROCRASTINATE_URL`` is the database; ``VERTIQUE_PEERS_STAMPS`` names a
file the task appends ``<i> <time.time()>`` to when it starts (the latency
run). An importable module, as Procrastinate's docs ask of an app.
"""

from __future__ import annotations

import os
import time

import procrastinate

URL = os.environ["PEERS_PROCRASTINATE_URL"]
STAMPS = os.environ.get("VERTIQUE_PEERS_STAMPS")

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="noop", queue="peers")
async def noop(i: int = 0) -> None:
    if STAMPS:
        with open(STAMPS, "a") as stamps:
            stamps.write(f"{i} {time.time()}\n")
