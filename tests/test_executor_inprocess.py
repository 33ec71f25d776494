"""The executor's supervision, in-process: a worker that dies is logged and restarted."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import vertique_workflow as wf
from vertique_workflow.executor import daemon, segment
from vertique_workflow.executor.daemon import Executor, ExecutorOptions
from vertique_workflow.models import WorkflowInstance

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dead_worker_is_logged_and_restarted(monkeypatch, caplog):
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    real_run_next = segment.run_next
    crashed = threading.Event()

    def crash_once(*args, **kwargs):
        if not crashed.is_set():
            crashed.set()
            raise RuntimeError("a bug outside any segment")
        return real_run_next(*args, **kwargs)

    # fault injection: the first loop of the worker dies of an unexpected error
    monkeypatch.setattr(daemon.segment, "run_next", crash_once)
    executor = Executor(
        ExecutorOptions(
            concurrency=1, poll_interval=0.05, until_idle=True, stats_interval=60, grace_seconds=10
        )
    )
    with caplog.at_level(logging.INFO, logger="vertique_workflow.executor"):
        assert executor.run() == 0
    messages = [record.getMessage() for record in caplog.records]
    assert "worker 0 died; it will be restarted" in messages
    assert "worker 0 is not running; restarting it" in messages
    assert crashed.is_set()
    assert wf.get(ref.id).status == "WAITING"
    assert executor.stats.snapshot()["completed"] == 1


def _one_worker(*, max_commands: int) -> Executor:
    """An in-process executor of one worker that stops after ``max_commands`` commands."""
    return Executor(
        ExecutorOptions(
            concurrency=1,
            poll_interval=0.05,
            max_commands=max_commands,
            stats_interval=60,
            grace_seconds=10,
        )
    )


def test_max_commands_stops_after_the_budget():
    for index in range(3):
        wf.start("order", {"amount": 5}, idempotency_key=f"k{index}")
    executor = _one_worker(max_commands=2)
    assert executor.run() == 0
    assert executor.stats.snapshot()["completed"] == 2
    statuses = sorted(WorkflowInstance.objects.values_list("status", flat=True))
    assert statuses == ["PENDING", "WAITING", "WAITING"]


def test_the_command_refuses_bad_options_and_record_only_nodes():
    from django.core.management import CommandError, call_command
    from django.test import override_settings

    with pytest.raises(CommandError, match="--concurrency must be at least 1"):
        call_command("workflow_executor", "--concurrency", "0")
    with pytest.raises(CommandError, match="unknown database alias 'nope'"):
        call_command("workflow_executor", "--database", "nope")
    with (
        override_settings(VERTIQUE_WORKFLOW={"EXECUTOR_ENABLED": False}),
        pytest.raises(CommandError, match="record-only"),
    ):
        call_command("workflow_executor", "--until-idle")


def test_the_daemons_refuse_a_database_without_this_releases_migrations(scratch_database):
    """Started before ``migrate``, an executor would fail every claim (0011's function) and
    retry forever: both daemons stop at start-up and name what is missing."""
    from django.db.migrations.loader import MigrationLoader

    from tests.conftest import run_manage

    later = sorted(
        name
        for app, name in MigrationLoader(None, ignore_no_migrations=True).disk_migrations
        if app == "vertique_workflow" and name[:4] > "0010"
    )
    assert later[0] == "0011_timer_hold_as_function"
    run_manage("migrate", "-v", "0", dbname=scratch_database)
    run_manage("migrate", "vertique_workflow", "0010", "-v", "0", dbname=scratch_database)
    for daemon_command in ("workflow_relay", "workflow_executor"):
        refused = run_manage(daemon_command, "--until-idle", dbname=scratch_database, check=False)
        assert refused.returncode != 0
        assert (
            f"the database 'default' lacks {len(later)} migration(s) of vertique_workflow: "
            f"{', '.join(later)}; run `manage.py migrate` first"
        ) in refused.stderr
    run_manage("migrate", "-v", "0", dbname=scratch_database)
    run_manage("workflow_executor", "--until-idle", dbname=scratch_database)


def _heads_of_ended_instances(count: int) -> list[int]:
    """``count`` SIGNAL heads of COMPLETED instances, which the common path's claim walks past.

    Each ``order`` of amount 0 ends in its START segment; its "paid" signal,
    recorded before, is then the head of an ended instance: only the general
    path settles it.
    """
    from vertique_workflow.models import WorkflowCommand

    refs = []
    for index in range(count):
        ref = wf.start("order", {"amount": 0}, idempotency_key=f"ended-{index}")
        wf.signal(ref.id, "paid", {"amount_paid": 1}, dedup_key=f"paid-{index}")
        refs.append(ref)
    while segment.run_next("test") is not None:
        pass
    assert {wf.get(ref.id).status for ref in refs} == {"COMPLETED"}
    heads = WorkflowCommand.objects.filter(kind="SIGNAL", state="PENDING")
    assert heads.count() == count  # the common path left them all
    return list(heads.values_list("id", flat=True))


def test_the_general_path_clears_heads_the_claim_walks_past_while_work_flows():
    """Heads the claim leaves (here: signals of ended instances) are settled by the periodic
    turn of the general path, oldest first, although the claim keeps finding work behind
    them; before, they stayed until the claim found nothing, each claim walking past them."""
    from vertique_workflow.models import WorkflowCommand

    stuck = _heads_of_ended_instances(6)
    for index in range(10):
        wf.start("order", {"amount": 0}, idempotency_key=f"later-{index}")
    executor = _one_worker(max_commands=6)
    assert executor.run() == 0
    states = dict(WorkflowCommand.objects.filter(id__in=stuck).values_list("id", "state"))
    assert states == {command_id: "REJECTED" for command_id in stuck}
    assert executor.stats.snapshot()["settled"] == 6
    assert executor.stats.snapshot()["completed"] == 0
    assert WorkflowInstance.objects.filter(status="PENDING").count() == 10


def test_the_general_path_turn_comes_once_an_interval(monkeypatch):
    """Between turns the common path runs first: with the interval not yet passed, the claim
    takes the work behind the left heads, which wait for the next turn."""
    from vertique_workflow.models import WorkflowCommand

    monkeypatch.setattr(daemon, "GENERAL_PATH_EVERY", 3600.0)
    stuck = _heads_of_ended_instances(2)
    for index in range(4):
        wf.start("order", {"amount": 0}, idempotency_key=f"later-{index}")
    executor = _one_worker(max_commands=5)
    executor._general_path_at = time.monotonic() + 3600.0  # the first turn already taken
    assert executor.run() == 0
    # the claim ran the four starts; only then, with nothing claimable, the general path
    assert executor.stats.snapshot()["completed"] == 4
    assert executor.stats.snapshot()["settled"] == 1
    states = sorted(WorkflowCommand.objects.filter(id__in=stuck).values_list("state", flat=True))
    assert states == ["PENDING", "REJECTED"]
    assert executor._general_path_due() is False


def test_a_turn_of_the_general_path_ends_at_a_batch_without_left_heads():
    """The turn goes on batch after batch only while a batch held a head the claim leaves:
    the first batch of four (two left heads, two starts) is followed by one of four starts,
    and there the turn ends, leaving the rest to the common path."""
    from vertique_workflow.models import WorkflowCommand

    stuck = _heads_of_ended_instances(2)
    for index in range(10):
        wf.start("order", {"amount": 0}, idempotency_key=f"later-{index}")
    executor = Executor(ExecutorOptions(concurrency=1, stats_interval=60))
    assert executor._general_path(0, sweep=True) is True
    assert WorkflowCommand.objects.filter(id__in=stuck, state="REJECTED").count() == 2
    assert executor.stats.snapshot()["completed"] == 6
    assert WorkflowInstance.objects.filter(status="PENDING").count() == 4


def test_in_a_turn_each_worker_runs_its_share_of_the_batch():
    """Workers that joined a turn peek the same oldest heads: each runs its share only (here
    the second of two workers the second half of a batch of four: two starts, no left head,
    so its turn ends) instead of walking into the heads the others are settling."""
    from vertique_workflow.models import WorkflowCommand

    stuck = _heads_of_ended_instances(2)
    for index in range(10):
        wf.start("order", {"amount": 0}, idempotency_key=f"later-{index}")
    executor = Executor(ExecutorOptions(concurrency=2, stats_interval=60))
    assert executor._general_path(1, sweep=True) is True
    assert executor.stats.snapshot()["completed"] == 2
    assert WorkflowCommand.objects.filter(id__in=stuck, state="PENDING").count() == 2
    assert executor._general_path(0, sweep=True) is True
    assert WorkflowCommand.objects.filter(id__in=stuck, state="REJECTED").count() == 2
