"""The peers benchmark's gated executor: set up first, it runs only on the benchmark's go.

A drain by two processes started together used to measure the second one's
start-up too (benchmarks/gated_executor.py says why); these tests hold the gate
to what it promises: nothing runs before the go, after it the process is
``manage.py workflow_executor`` with the arguments given.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import vertique_workflow as wf
from benchmarks.gated_executor import READY
from benchmarks.peers import start_together, wait_all
from tests.conftest import ROOT
from tests.executor_process import process_environment, server_query
from tests.flows.models import Shipment
from vertique_workflow import tables

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T = tables.sql_names()
ARGS = ["-v", "0", "--concurrency", "2", "--no-relay", "--until-idle"]


def gated() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gated_executor", *ARGS],
        cwd=ROOT,
        env=process_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_states() -> list[str]:
    rows = server_query(f"SELECT state FROM {T['commands']} WHERE kind = 'START' ORDER BY id")
    return [state for (state,) in rows]


def sessions_of_this_database() -> int:
    rows = server_query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend'"
    )
    return rows[0][0]


def record(count: int) -> None:
    for i in range(count):
        wf.start("shipment", {"ref": f"S-{i}"}, idempotency_key=f"gate-{i}")


def test_a_gated_executor_runs_nothing_before_its_go_then_runs_as_workflow_executor():
    record(4)
    sessions = sessions_of_this_database()
    process = gated()
    try:
        assert process.stdout.readline().strip() == READY
        # set up and imported, blocked on its input: no session, no command taken
        assert sessions_of_this_database() == sessions
        assert start_states() == ["PENDING"] * 4
        assert Shipment.objects.count() == 0
        process.stdin.write("go\n")
        process.stdin.close()
        assert process.wait(120) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert start_states() == ["COMPLETE"] * 4
    assert sorted(Shipment.objects.values_list("order_ref", flat=True)) == [
        f"S-{i}" for i in range(4)
    ]


def test_a_gated_executor_whose_input_closes_before_the_go_exits_without_running():
    record(2)
    process = gated()
    assert process.stdout.readline().strip() == READY
    process.stdin.close()
    assert process.wait(120) != 0
    assert "no go" in process.stderr.read()
    assert start_states() == ["PENDING"] * 2
    assert Shipment.objects.count() == 0


def test_processes_started_together_are_let_go_and_drain_the_queue():
    record(12)
    command = [sys.executable, "-m", "benchmarks.gated_executor", *ARGS]
    wait_all(start_together(command, process_environment(), 2))
    assert start_states() == ["COMPLETE"] * 12
    assert Shipment.objects.count() == 12
