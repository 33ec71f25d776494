"""The next claim sent behind a segment's COMMIT, in the same wait (``chain=True``).

A worker of a busy queue asks its segment's persist to carry the common path's
claim behind the transaction's COMMIT: the claim runs only once the segment
has committed, as a transaction of its own, and the worker runs what it
claimed next. What must hold: nothing is claimed behind a segment that fails
before its COMMIT; a COMMIT that fails ends the transaction and the claim
still runs as its own; a claim the worker does not run is released when it
stops; and the statement behind the COMMIT (``db.AfterCommit``) is sent once.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

import vertique_workflow as wf
from tests.flows.models import Shipment
from tests.flows.workflows import Gate
from vertique_workflow.executor import daemon
from vertique_workflow.executor import segment as executor_segment
from vertique_workflow.executor.segment import run_next, run_next_claimed
from vertique_workflow.models import WorkflowCommand
from vertique_workflow.store import db
from vertique_workflow.testing import run_until_idle

from .conftest import connect
from .test_commit_in_persist import refused_at_commit  # noqa: F401 (a fixture)
from .wire import client_trace

pytestmark = pytest.mark.django_db(transaction=True)


def start_command(ref) -> WorkflowCommand:
    return WorkflowCommand.objects.get(workflow_id=ref.id, kind="START")


def test_a_segment_claims_the_next_command_behind_its_commit_in_the_same_wait():
    wf.start("order", {"amount": 0}, idempotency_key="warm")
    run_until_idle()  # the statements are prepared on this connection from here on
    first = wf.start("order", {"amount": 0}, idempotency_key="first")
    second = wf.start("order", {"amount": 0}, idempotency_key="second")
    outcome = None

    def run() -> None:
        nonlocal outcome
        outcome = run_next("n1", chain=True)

    trace = client_trace(run).splitlines()
    assert outcome is not None and outcome.result == "COMPLETED"
    assert outcome.workflow_id == first.id and wf.get(first.id).status == "COMPLETED"
    chained = outcome.chained
    assert chained is not None and chained.workflow_id == second.id
    command = start_command(second)
    assert (command.state, command.claim_token, command.attempts) == ("CLAIMED", chained.token, 1)
    assert command.claimed_by == "n1"
    # the persist, its COMMIT and a Sync, then the claim and its own Sync, all sent
    # before the client read any of their results: one wait
    sent = [i for i, line in enumerate(trace) if line.startswith("F\t") and "\tSync" in line]
    commit = max(i for i, line in enumerate(trace) if line.startswith("F\t") and "COMMIT" in line)
    claim_sync, commit_sync = sent[-1], sent[-2]
    assert commit < commit_sync < claim_sync
    between = trace[commit_sync + 1 : claim_sync]
    assert any("\tExecute" in line for line in between)  # the claim
    assert not any(line.startswith("B\t") for line in trace[commit:claim_sync])
    # the chained claim runs like any other
    then = run_next_claimed(chained, "n1", chain=True)
    assert then.result == "COMPLETED" and wf.get(second.id).status == "COMPLETED"
    assert then.chained is None  # nothing left to claim


def test_without_chain_the_segment_claims_nothing_behind_its_commit():
    wf.start("order", {"amount": 0}, idempotency_key="a")
    second = wf.start("order", {"amount": 0}, idempotency_key="b")
    outcome = run_next("n1")
    assert outcome is not None and outcome.chained is None
    assert start_command(second).state == "PENDING"


def test_a_segment_that_fails_claims_nothing_behind_it():
    Gate.fail_times = 1
    failing = wf.start("policy", {}, idempotency_key="flaky")
    waiting = wf.start("order", {"amount": 0}, idempotency_key="waiting")
    outcome = run_next("n1", chain=True)
    assert outcome is not None and outcome.workflow_id == failing.id
    assert outcome.result == "RETRIED" and outcome.chained is None
    command = start_command(waiting)
    assert (command.state, command.attempts, command.claim_token) == ("PENDING", 0, None)


def test_a_segment_inside_the_caller_s_block_claims_nothing_behind_it():
    wf.start("order", {"amount": 0}, idempotency_key="inner")
    second = wf.start("order", {"amount": 0}, idempotency_key="after")
    with transaction.atomic():
        outcome = run_next("n1", chain=True)
        assert outcome is not None and outcome.result == "COMPLETED"
        assert outcome.chained is None  # the block commits, not the persist
        transaction.set_rollback(True)
    assert start_command(second).state == "PENDING"


def test_a_commit_that_fails_still_lets_the_claim_run_as_its_own_transaction(refused_at_commit):  # noqa: F811
    refused = wf.start("shipment", {"ref": "refused-at-commit"}, idempotency_key="refused")
    other = wf.start("order", {"amount": 0}, idempotency_key="other")
    outcome = run_next("n1", chain=True)
    assert outcome is not None and outcome.workflow_id == refused.id
    assert outcome.result == "RETRIED"
    assert not Shipment.objects.filter(order_ref="refused-at-commit").exists()
    # the failed COMMIT ended the transaction; the claim behind it took the next head
    chained = outcome.chained
    assert chained is not None and chained.workflow_id == other.id
    assert start_command(other).state == "CLAIMED"
    assert run_next_claimed(chained, "n1").result == "COMPLETED"
    assert wf.get(other.id).status == "COMPLETED"


def test_a_stopping_worker_releases_the_command_it_claimed_and_did_not_run(monkeypatch):
    # far more than a turn of the general path takes (it peeks 4 heads and chains nothing;
    # one comes every second, so a slow machine may run several before the first chain)
    refs = [wf.start("order", {"amount": 0}, idempotency_key=f"s{i}") for i in range(40)]
    executor = daemon.Executor(
        daemon.ExecutorOptions(concurrency=1, relay=False, stats_interval=0, until_idle=True)
    )
    original = executor_segment.run_claimed
    held: list = []

    def stop_once_chained(*args, **kwargs):
        outcome = original(*args, **kwargs)
        if outcome.chained is not None and not held:
            held.append(outcome.chained)
            executor.stopping.set()  # the worker stops before it runs the chained claim
        return outcome

    monkeypatch.setattr(executor_segment, "run_claimed", stop_once_chained)
    assert executor.run() == 0
    assert len(held) == 1
    command = WorkflowCommand.objects.get(pk=held[0].id)
    assert (command.state, command.claim_token, command.attempts) == ("PENDING", None, 0)
    assert not WorkflowCommand.objects.filter(state="CLAIMED").exists()
    counts = executor.stats.snapshot()
    assert counts["released"] == 1
    assert counts["completed"] == WorkflowCommand.objects.filter(state="COMPLETE").count()
    run_until_idle()
    assert {wf.get(ref.id).status for ref in refs} == {"COMPLETED"}


def test_a_busy_executor_runs_chained_claims_until_the_queue_is_empty(monkeypatch):
    refs = [wf.start("order", {"amount": 0}, idempotency_key=f"q{i}") for i in range(40)]
    seen: list = []
    original = executor_segment.run_claimed

    def recording(*args, **kwargs):
        outcome = original(*args, **kwargs)
        seen.append(outcome)
        return outcome

    monkeypatch.setattr(executor_segment, "run_claimed", recording)
    executor = daemon.Executor(
        daemon.ExecutorOptions(concurrency=2, relay=False, stats_interval=0, until_idle=True)
    )
    assert executor.run() == 0
    assert {wf.get(ref.id).status for ref in refs} == {"COMPLETED"}
    assert executor.stats.snapshot()["completed"] == 40
    assert any(outcome.chained is not None for outcome in seen)
    assert not WorkflowCommand.objects.filter(state="CLAIMED").exists()


def test_under_a_command_budget_nothing_is_claimed_past_it():
    for i in range(3):
        wf.start("order", {"amount": 0}, idempotency_key=f"b{i}")
    executor = daemon.Executor(
        daemon.ExecutorOptions(concurrency=1, relay=False, stats_interval=0, max_commands=2)
    )
    assert executor.run() == 0
    states = sorted(WorkflowCommand.objects.values_list("state", flat=True))
    assert states == ["COMPLETE", "COMPLETE", "PENDING"]


# -- the statement behind the COMMIT (db.AfterCommit) --------------------------------


@pytest.fixture
def notes():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE after_commit_notes (id int PRIMARY KEY)")
    yield
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE after_commit_notes")


INSERT = "INSERT INTO after_commit_notes VALUES (%s) RETURNING id, txid_current()"
AFTER = "INSERT INTO after_commit_notes VALUES (%s) RETURNING id, txid_current()"


def committed() -> list[int]:
    with connect(connection.settings_dict["NAME"]) as other:
        return [r[0] for r in other.execute("SELECT id FROM after_commit_notes ORDER BY id")]


def test_the_statement_behind_the_commit_is_a_transaction_of_its_own(notes):
    then = db.AfterCommit(AFTER, (2,))
    with transaction.atomic():
        db.fetchone_prepared("SELECT 1")
        row = db.fetchone_prepared_then_commit(INSERT, (1,), then)
        assert committed() == [1, 2]  # both committed before the block ends
    assert row is not None and row[0] == 1
    assert then.sent and then.error is None
    assert then.row is not None and then.row[0] == 2
    assert then.row[1] != row[1]  # another transaction
    # sent once: the same statement given again goes with nothing
    with transaction.atomic():
        db.fetchone_prepared("SELECT 1")
        db.fetchone_prepared_then_commit(INSERT, (3,), then)
    assert committed() == [1, 2, 3]
    assert then.error is None and then.row[0] == 2  # not run again (it would fail: id 2)


def test_behind_a_failed_statement_it_fails_without_running(notes):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO after_commit_notes VALUES (1)")
    then = db.AfterCommit(AFTER, (7,))
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        db.fetchone_prepared("SELECT 1")
        db.fetchone_prepared_then_commit(INSERT, (1,), then)  # a duplicate key
    assert db.sqlstate(raised.value) == "23505"
    assert then.sent and then.row is None
    assert isinstance(then.error, psycopg.errors.InFailedSqlTransaction)
    assert committed() == [1]


def test_where_the_commit_cannot_go_with_the_statement_it_is_not_sent(notes):
    then = db.AfterCommit(AFTER, (9,))
    with transaction.atomic(), transaction.atomic():  # a savepoint: the outer block commits
        db.fetchone_prepared("SELECT 1")
        db.fetchone_prepared_then_commit(INSERT, (8,), then)
    assert not then.sent and then.row is None and then.error is None
    assert committed() == [8]
