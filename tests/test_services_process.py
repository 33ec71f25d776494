"""The relay in real processes: killed between the call and its result, run by the executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from django.db import connection

import vertique_workflow as wf
from tests.conftest import ROOT, database_url, history_events
from tests.executor_process import ExecutorProcess, wait_until
from tests.flows.models import HandlerCall
from vertique_workflow.models import WorkflowServiceCall
from vertique_workflow.store import outbox
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"POLL_INTERVAL_MS": 100, "RELAY_LEASE_MARGIN_SECONDS": 1}


def relay(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        DATABASE_URL=database_url(connection.settings_dict["NAME"]),
        DJANGO_SETTINGS_MODULE="tests.settings",
        VERTIQUE_TEST_SETTINGS_JSON=json.dumps(FAST),
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", "workflow_relay", "--until-idle", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_for_the_lease_to_pass() -> None:
    """Sleep until the database clock says the held dispatch's lease has passed."""
    while True:
        delay = outbox.next_delay_ms()
        assert delay is not None, "the dispatch is still held or pending"
        if delay <= 0:
            return
        time.sleep(delay / 1000.0 + 0.01)


def test_a_relay_killed_between_call_and_result_calls_again_and_the_workflow_advances_once():
    instance = wf.start("svc-fragile", {"amount": 9, "kill_after_call": True}, idempotency_key="k")
    run_until_idle(services=False)

    killed = relay()
    assert killed.returncode == 9, killed.stderr
    row = WorkflowServiceCall.objects.get(workflow_id=instance.id)
    assert (row.state, row.attempts) == ("CLAIMED", 1), "the dead relay still holds its claim"
    assert HandlerCall.objects.count() == 1
    assert wf.get(instance.id).current_step == "pay", "no result was recorded"

    wait_for_the_lease_to_pass()
    second = relay()
    assert second.returncode == 0, second.stderr
    assert "1 call(s), 1 delivered" in second.stdout
    run_until_idle(services=False)

    view = wf.get(instance.id)
    assert view.status == "COMPLETED"
    assert view.state["charge"] == {"charge_id": "ch-9", "calls": 2}
    keys = set(HandlerCall.objects.values_list("dispatch_key", flat=True))
    assert keys == {row.dispatch_key}, "both calls carried the same idempotency key"
    assert history_events(instance.id).count("SERVICE_RESULT") == 1, "advanced once"


def test_the_executor_runs_the_relay_in_its_own_process():
    refs = [
        wf.start("svc-charge", {"amount": n, "fail_times": 1}, idempotency_key=f"k{n}").id
        for n in range(5)
    ]
    with ExecutorProcess("--concurrency", "2", settings=FAST) as executor:
        wait_until(
            lambda: all(wf.get(ref).status == "COMPLETED" for ref in refs),
            timeout=120,
            what="every instance completed",
            process=executor,
        )
        executor.stop()
    assert HandlerCall.objects.count() == 10, "each call failed once and was retried once"
    assert set(WorkflowServiceCall.objects.values_list("state", flat=True)) == {"DELIVERED"}


def test_with_no_relay_the_executor_leaves_the_calls_to_workflow_relay():
    ref = wf.start("svc-charge", {"amount": 1}, idempotency_key="k").id
    with ExecutorProcess("--concurrency", "1", "--no-relay", "--until-idle", settings=FAST) as ex:
        assert ex.wait(120) == 0, ex.log
    assert WorkflowServiceCall.objects.get(workflow_id=ref).state == "PENDING"
    assert HandlerCall.objects.count() == 0
    done = relay()
    assert done.returncode == 0, done.stderr
    run_until_idle(services=False)
    assert wf.get(ref).status == "COMPLETED"
