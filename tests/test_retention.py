"""Retention: archive and purge batches (skip busy, leave active alone, purge every row)."""

from __future__ import annotations

import datetime
import io
import threading
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import in_threads
from vertique_workflow import retention, tables
from vertique_workflow.models import WorkflowInstance, WorkflowTask
from vertique_workflow.store.commands import EXECUTION_LOCK_NAMESPACE
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

DAY = datetime.timedelta(days=1)
T = tables.sql_names()


def started(n: int, prefix: str, *, amount: int = 0, flow: str = "order") -> list[Any]:
    payload = {"order": {"amount": amount}, "review": {"manager": "ann"}}.get(flow, {})
    return [wf.start(flow, payload, idempotency_key=f"{prefix}-{i}").id for i in range(n)]


def age(ids: list[Any], days: int) -> None:
    """Move the instances' last change back (the database clock decides eligibility)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['instances']} SET updated_at = now() - make_interval(days => %s) "
            "WHERE id = ANY(%s::uuid[])",
            [days, [str(i) for i in ids]],
        )


def archived(ids: list[Any]) -> set[Any]:
    return set(
        WorkflowInstance.objects.filter(id__in=ids, archived_at__isnull=False).values_list(
            "id", flat=True
        )
    )


def failed_shipment(key: str) -> Any:
    """A FAILED instance: the carrier refuses the shipment for good."""
    from tests.flows.workflows import Gate

    (failed,) = started(1, key, flow="shipment")
    Gate.non_retryable = True
    try:
        run_until_idle()
    finally:
        Gate.non_retryable = False
    assert wf.get(failed).status == "FAILED"
    return failed


def test_archive_takes_old_instances_of_the_status_only():
    old = started(3, "old")
    recent = started(2, "recent")
    waiting = started(2, "waiting", amount=5)
    run_until_idle()
    age(old + waiting, 40)
    result = retention.archive("COMPLETED", 30 * DAY)
    assert (result.candidates, result.processed, result.busy, result.left_alone) == (3, 3, 0, 0)
    assert archived(old + recent + waiting) == set(old)
    # hidden from the read models unless asked
    listed = {r.id for r in wf.instances(limit=100)}
    assert listed.isdisjoint(old) and set(recent) <= listed
    assert set(old) <= {r.id for r in wf.instances(limit=100, include_archived=True)}
    assert retention.archive("COMPLETED", 30 * DAY).processed == 0  # nothing twice


def test_tasks_of_archived_instances_are_hidden():
    (review,) = started(1, "rv", flow="review")
    run_until_idle()
    wf.cancel(review, reason="test")
    age([review], 40)
    assert wf.tasks(include_archived=True).items
    assert retention.archive("CANCELLED", 30 * DAY).processed == 1
    assert wf.tasks().items == []
    assert wf.tasks(include_archived=True).items


def test_a_busy_instance_is_skipped_counted_and_taken_later(holder):
    busy, free = started(2, "busy")
    run_until_idle()
    age([busy, free], 40)
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(%s::text))", (EXECUTION_LOCK_NAMESPACE, busy)
    )
    result = retention.archive("COMPLETED", 30 * DAY)
    assert (result.processed, result.busy) == (1, 1)
    assert archived([busy, free]) == {free}
    holder.rollback()  # the segment (here: the holder) ends
    assert retention.archive("COMPLETED", 30 * DAY).processed == 1
    assert archived([busy, free]) == {busy, free}


def test_an_instance_with_an_active_command_is_never_archived():
    failed = failed_shipment("f")
    wf.retry(failed)  # a RETRY is PENDING: the instance keeps its place
    age([failed], 40)
    result = retention.archive("FAILED", 30 * DAY)
    assert (result.processed, result.left_alone) == (0, 1)
    assert archived([failed]) == set()


def test_a_retry_unarchives_a_failed_instance():
    failed = failed_shipment("u")
    age([failed], 40)
    assert retention.archive("FAILED", 30 * DAY).processed == 1
    assert archived([failed]) == {failed}
    wf.retry(failed)
    assert archived([failed]) == set()
    run_until_idle()
    assert wf.get(failed).status == "WAITING"  # retried: waits for "confirm" again


RECORDERS = [
    "vertique_workflow.side_effects.outbox.ServiceOutboxRecorder",
    "vertique_workflow.side_effects.events.EventsRecorder",
]

DEPENDENTS = {
    "history": "workflow_id",
    "commands": "workflow_id",
    "command_queues": "workflow_id",
    "timers": "workflow_id",
    "tasks": "workflow_id",
    "branch_tokens": "workflow_id",
    "join_states": "workflow_id",
    "service_outbox": "workflow_id",
    "events": "workflow_id",
    "instances": "id",
}


def counts(ids: list[Any]) -> dict[str, int]:
    found = {}
    with connection.cursor() as cursor:
        for table, column in DEPENDENTS.items():
            cursor.execute(
                f"SELECT count(*) FROM {T[table]} WHERE {column} = ANY(%s::uuid[])",
                [[str(i) for i in ids]],
            )
            found[table] = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT kind, count(*) FROM {T['dedup']} WHERE workflow_id = ANY(%s::uuid[]) "
            "GROUP BY kind",
            [[str(i) for i in ids]],
        )
        for kind, count in cursor.fetchall():
            found[f"dedup {kind}"] = count
    return found


def test_purge_removes_every_row_of_the_instance_and_keeps_the_start_key():
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "RECORDERS": RECORDERS}
    ):
        review = wf.start("review", {"manager": "ann"}, idempotency_key="p-review").id
        parallel = wf.start("parallel", {}, idempotency_key="p-parallel").id
        charge = wf.start("svc-charge", {"amount": 5}, idempotency_key="p-charge").id
        order = wf.start("order", {"amount": 5}, idempotency_key="p-order").id
        kept = wf.start("order", {"amount": 5}, idempotency_key="p-kept").id
        run_until_idle(services=False)
        wf.signal(order, "paid", {"amount_paid": 5}, dedup_key="pay-1")
        wf.signal(kept, "paid", {"amount_paid": 5}, dedup_key="pay-1")
        run_until_idle(services=False)
        task = WorkflowTask.objects.get(workflow_id=review)
        wf.reassign_task(task.id, assignee="bob", idempotency_key="p-reassign")
        for instance in (review, parallel, charge):
            wf.cancel(instance, reason="purge test")
    doomed = [review, parallel, charge, order]
    before = counts(doomed)
    for table in DEPENDENTS:
        assert before[table] > 0, f"the test instances have no {table} rows"
    assert before["dedup SIGNAL"] == 1 and before["dedup START"] == 4
    assert before["dedup DISPATCH"] == 1 and before["dedup TASK_REASSIGNMENT"] == 1
    kept_before = counts([kept])
    age([*doomed, kept], 40)
    assert retention.archive("CANCELLED", 30 * DAY).processed == 3
    assert retention.archive("COMPLETED", 30 * DAY).processed == 2
    WorkflowInstance.objects.filter(id=kept).update(archived_at=None)  # kept: not archived
    result = retention.purge_archived(before=datetime.datetime.now(datetime.UTC) + DAY)
    assert (result.processed, result.busy, result.left_alone) == (4, 0, 0)
    after = counts(doomed)
    assert after == {"dedup START": 4, **{table: 0 for table in DEPENDENTS}}
    assert counts([kept]) == kept_before
    # the start key outlived its instance: a replay says so instead of starting again
    with pytest.raises(wf.WorkflowNotFound):
        wf.start("order", {"amount": 5}, idempotency_key="p-order")


def test_two_concurrent_sweeps_never_share_an_instance_nor_deadlock_with_executors():
    done = started(60, "c")
    run_until_idle()
    age(done, 40)
    live = started(20, "live", amount=5)
    barrier = threading.Barrier(3)

    def sweep() -> dict[str, int]:
        barrier.wait(30)
        return retention.sweep(archive_ages={"COMPLETED": 30 * DAY}, batch=7).archived

    def execute() -> int:
        barrier.wait(30)
        for instance in live:
            wf.signal(instance, "paid", {"amount_paid": 5}, dedup_key="pay")
        return len(run_until_idle().outcomes)

    first, second, ran = in_threads(sweep, sweep, execute)
    assert first["COMPLETED"] + second["COMPLETED"] == 60  # each instance exactly once
    assert archived(done) == set(done)
    assert ran >= 20 and all(wf.get(i).status == "COMPLETED" for i in live)


def test_bad_arguments_are_refused_before_anything_is_written():
    for call in (
        lambda: retention.archive("DONE", DAY),
        lambda: retention.archive("COMPLETED", "30d"),
        lambda: retention.archive("COMPLETED", -1),
        lambda: retention.archive("COMPLETED", DAY, batch=0),
        lambda: retention.purge_archived(),
        lambda: retention.purge_archived(DAY, before=datetime.datetime.now(datetime.UTC)),
        lambda: retention.purge_archived(before=datetime.datetime(2026, 1, 1)),
        lambda: retention.sweep(archive_ages={"NOPE": DAY}),
    ):
        with pytest.raises(wf.WorkflowValidationError):
            call()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("workflow_retention", *args, stdout=out)
    return out.getvalue()


def test_the_command_archives_purges_and_summarises():
    ids = started(5, "cmd")
    run_until_idle()
    age(ids, 40)
    output = run("--archive", "COMPLETED=30d", "--batch", "2")
    assert output.count("archive COMPLETED: batch of") == 3  # 2 + 2 + 1
    assert "archived 5 COMPLETED; purged 0" in output
    assert archived(ids) == set(ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['instances']} SET archived_at = now() - interval '2 days' "
            "WHERE id = ANY(%s::uuid[])",
            [[str(i) for i in ids]],
        )
    output = run("--purge-archived", "1d")
    assert "purged 5" in output
    assert not WorkflowInstance.objects.filter(id__in=ids).exists()


def test_the_command_uses_the_settings_and_says_when_there_is_nothing_to_do():
    assert "nothing to do" in run()
    ids = started(2, "set")
    run_until_idle()
    age(ids, 3)
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "RETENTION_ARCHIVE": {"COMPLETED": 86400}}
    ):
        assert "archived 2 COMPLETED" in run()


@pytest.mark.parametrize(
    "args",
    [
        ["--archive", "COMPLETED"],
        ["--archive", "COMPLETED=30x"],
        ["--archive", "SLEEPING=1d"],
        ["--archive", "COMPLETED=1d", "--archive", "COMPLETED=2d"],
        ["--purge-archived", "soon"],
        ["--archive", "COMPLETED=1d", "--batch", "0"],
        ["--archive", "COMPLETED=1d", "--max-seconds", "0"],
    ],
)
def test_the_command_refuses_bad_input_clearly(args: list[str]):
    ids = started(1, "bad")
    run_until_idle()
    age(ids, 40)
    with pytest.raises(CommandError):
        run(*args)
    assert archived(ids) == set()


def test_the_try_lock_runs_once_per_candidate_and_no_more():
    """The MATERIALIZED candidates: with five eligible rows and a batch of two,
    the batch's transaction holds exactly two execution locks (a try-lock
    evaluated on rows the LIMIT drops would hold locks nobody asked for)."""
    from django.db import transaction

    from vertique_workflow.store import retention as store

    done = started(5, "once")
    run_until_idle()
    age(done, 40)
    with transaction.atomic():
        batch = store.archive_batch("COMPLETED", (30 * DAY).total_seconds(), 2, None)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid() AND classid::bigint = %s",
                [EXECUTION_LOCK_NAMESPACE],
            )
            (held,) = cursor.fetchone()
    assert (batch.candidates, batch.processed, held) == (2, 2, 2)


def test_a_busy_archived_instance_is_not_purged_until_its_lock_is_free(holder):
    busy, free = started(2, "pbusy")
    run_until_idle()
    age([busy, free], 40)
    assert retention.archive("COMPLETED", 30 * DAY).processed == 2
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(%s::text))", (EXECUTION_LOCK_NAMESPACE, busy)
    )
    cutoff = datetime.datetime.now(datetime.UTC) + DAY
    result = retention.purge_archived(before=cutoff)
    assert (result.processed, result.busy, result.left_alone) == (1, 1, 0)
    assert set(
        WorkflowInstance.objects.filter(id__in=[busy, free]).values_list("id", flat=True)
    ) == {busy}
    holder.rollback()
    assert retention.purge_archived(before=cutoff).processed == 1
    assert not WorkflowInstance.objects.filter(id__in=[busy, free]).exists()
