"""DBOS Transact's side of benchmarks/peers.py: a 3-step workflow started with start_workflow.

    python -m benchmarks.peer_dbos rate N | latency N

Configured as DBOS's docs describe for Python: ``DBOS(config=...)`` with a
PostgreSQL system database, ``DBOS.launch()``, steps as ``@DBOS.step()``
functions of a ``@DBOS.workflow()``, started with ``DBOS.start_workflow`` (it
runs in this process). ``rate`` starts N workflows and waits for every
result; ``latency`` starts them one at a time and times start returned ->
first step runs, and start -> result. One JSON line of figures.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from dbos import DBOS

URL = os.environ["PEERS_DBOS_URL"]
FIRST_STEP_AT: dict[int, float] = {}

DBOS(config={"name": "peers", "system_database_url": URL, "log_level": "WARNING"})


@DBOS.step()
def step_one(i: int) -> int:
    FIRST_STEP_AT.setdefault(i, time.time())
    return 1


@DBOS.step()
def step_two() -> int:
    return 2


@DBOS.step()
def step_three() -> int:
    return 3


@DBOS.workflow()
def three_steps(i: int) -> int:
    return step_one(i) + step_two() + step_three()


def main() -> None:
    mode, count = sys.argv[1], int(sys.argv[2])
    DBOS.launch()
    if mode == "rate":
        started = time.perf_counter()
        handles = [DBOS.start_workflow(three_steps, i) for i in range(count)]
        for handle in handles:
            handle.get_result()
        print(json.dumps({"rate": count / (time.perf_counter() - started)}))
    elif mode == "latency":
        first, result = [], []
        for i in range(count):
            before = time.time()
            handle = DBOS.start_workflow(three_steps, 10**6 + i)
            returned = time.time()
            handle.get_result()
            done = time.time()
            first.append((FIRST_STEP_AT[10**6 + i] - returned) * 1000)
            result.append((done - before) * 1000)
        print(
            json.dumps(
                {
                    "first_step_p50": statistics.median(first),
                    "result_p50": statistics.median(result),
                }
            )
        )
    DBOS.destroy()


if __name__ == "__main__":
    main()
