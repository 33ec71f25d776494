"""Races with real connections and threads: fencing, lock order, idempotency under contention."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import in_threads
from tests.flows.workflows import Blocking
from vertique_workflow import tables
from vertique_workflow.executor.segment import Claimed, run_claimed, run_head
from vertique_workflow.models import WorkflowCommand, WorkflowHistory
from vertique_workflow.pins import resident_plan
from vertique_workflow.store import commands
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]


def test_two_workers_racing_for_one_command_apply_it_once():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    head = commands.peek(1)[0]
    barrier = threading.Barrier(4)

    def worker(name: str) -> str:
        barrier.wait()
        return run_head(head, name).result

    outcomes = in_threads(*(lambda n=n: worker(f"node-{n}") for n in range(4)))
    assert sorted(outcomes).count("COMPLETED") == 1
    assert set(outcomes) <= {"COMPLETED", "BUSY"}
    command = WorkflowCommand.objects.get(workflow_id=ref.id)
    assert (command.state, command.attempts) == ("COMPLETE", 1)
    assert (
        WorkflowHistory.objects.filter(workflow_id=ref.id, event_type="WORKFLOW_STARTED").count()
        == 1
    )


def test_fence_refuses_a_stale_token_after_the_lease_moved_on():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    head = commands.peek(1)[0]
    with transaction.atomic():
        first = commands.claim(
            head.id, head.workflow_id, node_id="slow", lease_seconds=30, max_attempts=5
        )
    # the slow node's lease expires before it starts its segment
    WorkflowCommand.objects.filter(pk=head.id).update(lease_until="2000-01-01T00:00:00Z")
    expired_head = commands.peek(1)[0]
    assert run_head(expired_head, "fast").result == "COMPLETED"

    plan = resident_plan("order", 1)
    stale = Claimed(head.id, head.workflow_id, first.token, first.attempts)
    assert run_claimed(stale, plan, "slow").result == "LOST"
    command = WorkflowCommand.objects.get(pk=head.id)
    assert (command.state, command.claimed_by, command.attempts) == ("COMPLETE", "fast", 2)
    assert (
        WorkflowHistory.objects.filter(
            workflow_id=ref.id, step_id="reserve", event_type="DECISION"
        ).count()
        == 1
    )
    # the stale token can neither release nor retry the command
    assert commands.release(head.id, first.token) == 0
    assert commands.retry_transient(head.id, first.token, "x", base_ms=0, max_ms=0) == 0


def test_cancel_racing_a_segment_waits_for_it_and_does_not_deadlock():
    ref = wf.start("blocking", {}, idempotency_key="k1")
    head = commands.peek(1)[0]
    cancel_started = threading.Event()

    def segment() -> str:
        return run_head(head, "node-a").result

    def canceller() -> bool:
        assert Blocking.entered.wait(120), "the segment never started"
        cancel_started.set()
        return wf.cancel(ref.id, reason="racing")

    def releaser() -> None:
        assert cancel_started.wait(120)
        # release only once PostgreSQL shows the cancel queued behind the execution
        # lock: on a slow machine a fixed wait would release too early and the
        # test would no longer race (the guard fails loudly instead)
        try:
            guard = time.monotonic() + 120
            with connection.cursor() as cursor:
                while True:
                    cursor.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                    if cursor.fetchone()[0] >= 1:
                        return
                    assert time.monotonic() < guard, "the cancel never queued on the lock"
                    threading.Event().wait(0.01)
        finally:
            Blocking.release.set()

    # the cancel's lock wait spans the segment's commit: no 5 s lock_timeout here
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "LOCK_TIMEOUT_MS": 120_000}
    ):
        results = in_threads(segment, canceller, releaser)
    assert results[0] == "COMPLETED"
    assert results[1] is True
    instance = wf.get(ref.id)
    assert instance.status == "CANCELLED"
    assert instance.state == {"held": True}, "the segment committed before the cancel"
    assert [
        e
        for e in WorkflowHistory.objects.filter(workflow_id=ref.id)
        .order_by("sequence")
        .values_list("event_type", flat=True)
    ][-1] == ("WORKFLOW_CANCELLED")


def test_concurrent_starts_with_one_key_create_one_instance():
    barrier = threading.Barrier(4)

    def start() -> Any:
        barrier.wait()
        with transaction.atomic():
            return wf.start("order", {"amount": 5}, idempotency_key="same", business_key="BK")

    refs = in_threads(*([start] * 4))
    assert len({r.id for r in refs}) == 1
    assert sum(r.created for r in refs) == 1


def test_concurrent_signals_with_one_key_record_one_command():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    barrier = threading.Barrier(4)

    def send() -> Any:
        barrier.wait()
        return wf.signal(ref.id, "extra", None, dedup_key="one")

    receipts = in_threads(*([send] * 4))
    assert sum(not r.duplicate for r in receipts) == 1
    assert WorkflowCommand.objects.filter(workflow_id=ref.id, kind="SIGNAL").count() == 1


def test_every_statement_uses_the_configured_placement():
    """In the named-schema run nothing may resolve to an unqualified table."""
    schema = tables.SCHEMA
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('public.workflow_instances') IS NOT NULL")
        in_public = cursor.fetchone()[0]
        cursor.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.relname = 'workflow_commands'"
        )
        placed = [row[0] for row in cursor.fetchall()]
    assert placed == [schema or "public"]
    assert in_public == (schema is None)
    assert wf.get(ref.id).status == "WAITING"
