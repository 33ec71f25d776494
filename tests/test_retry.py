"""Repair: ``wf.retry`` and ``manage.py workflow_retry`` end to end through the executor.

A dead-lettered START, a dead-lettered signal fixed by a deploy, a failed
action, a ``fail`` step; refusals write nothing; idempotency; signals to a
FAILED instance are parked until the retry.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

import vertique_workflow as wf
from tests.conftest import history_events as events
from tests.conftest import table_counts
from tests.executor_process import ExecutorProcess, wait_until
from tests.flows.models import Shipment
from tests.flows.workflows import Billing, Gate
from vertique_workflow.models import WorkflowCommand, WorkflowCommandQueue, WorkflowHistory
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]


def commands_of(instance_id) -> list[tuple[str, str, int]]:
    return list(
        WorkflowCommand.objects.filter(workflow_id=instance_id)
        .order_by("seq")
        .values_list("kind", "state", "attempts")
    )


def open_signals(instance_id) -> int:
    return WorkflowCommandQueue.objects.get(workflow_id=instance_id).open_signals


def test_a_dead_lettered_start_is_superseded_and_started_again():
    Gate.fail_times = 100
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    assert wf.get(ref.id).status == "FAILED"
    Gate.fail_times = 0  # the cause is fixed
    receipt = wf.retry(ref.id, actor=wf.Actor.user("ops"), reason="carrier back")
    assert not receipt.duplicate
    assert run_until_idle().outcomes == ["COMPLETED"]
    instance = wf.get(ref.id)
    assert (instance.status, instance.current_step) == ("WAITING", "confirm_wait")
    assert (instance.error_type, instance.error_message, instance.completed_at) == (None,) * 3
    assert instance.state == {"ref": "A-1", "shipment_created": True}
    assert (instance.dead_commands, instance.needs_attention, instance.last_failure) == (
        0,
        False,
        None,
    )
    assert commands_of(ref.id) == [("START", "SUPERSEDED", 5), ("RETRY", "COMPLETE", 1)]
    assert Shipment.objects.count() == 1
    history = events(ref.id)
    assert history[:2] == ["COMMAND_DEAD_LETTERED", "FAILED"]
    assert history[2:5] == ["WORKFLOW_RETRIED", "COMMAND_SUPERSEDED", "STATE_BASELINE"]
    retried = WorkflowHistory.objects.get(workflow_id=ref.id, event_type="WORKFLOW_RETRIED")
    assert (retried.actor_kind, retried.actor_id, retried.actor_reason) == (
        "USER",
        "ops",
        "carrier back",
    )


def test_a_start_failed_by_a_non_retryable_error_is_started_again():
    Gate.non_retryable = True
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    assert wf.get(ref.id).error_type == "SHIPMENT_REFUSED"
    Gate.non_retryable = False
    wf.retry(ref.id)
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    assert commands_of(ref.id) == [("START", "FAILED", 1), ("RETRY", "COMPLETE", 1)]


def test_a_dead_lettered_signal_is_visible_and_re_offered_after_a_deploy():
    ref = wf.start("billing", {}, idempotency_key="k1")
    run_until_idle()
    Billing.fail_times = 100
    wf.signal(ref.id, "charge", None, dedup_key="c1")
    run_until_idle()
    stuck = wf.get(ref.id)
    # the instance still waits, but it says why it needs a human
    assert (stuck.status, stuck.current_step) == ("WAITING", "await_charge")
    assert (stuck.dead_commands, stuck.needs_attention) == (1, True)
    assert stuck.last_failure.reason_code == "ATTEMPTS_EXHAUSTED"
    assert stuck.last_failure.step == "charge"
    assert stuck.last_failure.at is not None
    assert "gateway" not in stuck.last_failure.message
    assert wf.signal(ref.id, "charge", None, dedup_key="c1").duplicate
    assert open_signals(ref.id) == 0
    Billing.fail_times = 0  # the deploy
    wf.retry(ref.id)
    assert run_until_idle().outcomes == ["COMPLETED", "COMPLETED"]
    done = wf.get(ref.id)
    assert (done.status, done.current_step, done.state) == (
        "WAITING",
        "await_note",
        {"opened": True, "charged": True},
    )
    assert done.dead_commands == 0
    assert commands_of(ref.id) == [
        ("START", "COMPLETE", 1),
        ("SIGNAL", "COMPLETE", 1),
        ("RETRY", "COMPLETE", 1),
    ]
    history = events(ref.id)
    retried = history.index("WORKFLOW_RETRIED")
    assert history[retried : retried + 3] == [
        "WORKFLOW_RETRIED",
        "COMMAND_REOFFERED",
        "SIGNAL_APPLIED",
    ]
    assert open_signals(ref.id) == 0


def test_a_failed_action_resumes_where_it_stood_and_parked_signals_follow():
    ref = wf.start("billing", {}, idempotency_key="k1")
    run_until_idle()
    Billing.non_retryable = True
    wf.signal(ref.id, "charge", None, dedup_key="c1")
    assert run_until_idle().outcomes == ["FAILED"]
    failed = wf.get(ref.id)
    assert (failed.status, failed.error_type, failed.current_step) == (
        "FAILED",
        "CARD_DECLINED",
        "charge",
    )
    assert "4111" not in failed.error_message
    # FAILED is retryable: a signal to it is parked, not refused and not applied
    wf.signal(ref.id, "note", None, dedup_key="n1")
    assert run_until_idle().outcomes == ["PARKED"]
    assert wf.get(ref.id).parked_commands == 1
    Billing.non_retryable = False
    wf.retry(ref.id)
    assert run_until_idle().outcomes == ["COMPLETED", "COMPLETED", "COMPLETED"]
    done = wf.get(ref.id)
    assert (done.status, done.state) == ("COMPLETED", {"opened": True, "charged": True})
    assert commands_of(ref.id) == [
        ("START", "COMPLETE", 1),
        ("SIGNAL", "COMPLETE", 1),
        ("SIGNAL", "COMPLETE", 1),
        ("RETRY", "COMPLETE", 1),
    ]
    assert open_signals(ref.id) == 0


def test_a_fail_step_is_driven_again():
    ref = wf.start("expense-approval", {"amount": 500}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "reject", None, dedup_key="r1")
    run_until_idle()
    assert wf.get(ref.id).error_type == "REJECTED"
    wf.retry(ref.id)
    run_until_idle()
    again = wf.get(ref.id)
    assert (again.status, again.error_type, again.current_step) == (
        "FAILED",
        "REJECTED",
        "rejected",
    )
    assert events(ref.id)[-3:] == ["WORKFLOW_RETRIED", "DECISION", "FAILED"]


def test_retry_of_a_healthy_or_ended_instance_is_refused_and_writes_nothing():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="nothing to retry"):
        wf.retry(ref.id)
    wf.cancel(ref.id, reason="done")
    before = table_counts()
    with pytest.raises(wf.WorkflowConflict, match="has ended"):
        wf.retry(ref.id)
    with pytest.raises(wf.WorkflowNotFound):
        wf.retry("00000000-0000-0000-0000-000000000000")
    with pytest.raises(wf.WorkflowValidationError):
        wf.retry(ref.id, reason="")
    assert table_counts() == before


def test_retry_is_safe_to_repeat():
    Gate.non_retryable = True
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    first = wf.retry(ref.id, idempotency_key="fix-1")
    assert wf.retry(ref.id, idempotency_key="fix-1") == wf.RetryReceipt(
        ref.id, first.command_id, duplicate=True
    )
    # without a key, an open retry is returned rather than recorded twice
    assert wf.retry(ref.id).command_id == first.command_id
    with pytest.raises(wf.WorkflowConflict):
        wf.retry(ref.id, idempotency_key="fix-1", reason="another reason")
    Gate.non_retryable = False
    run_until_idle()
    assert wf.retry(ref.id, idempotency_key="fix-1").command_id == first.command_id
    assert WorkflowCommand.objects.filter(workflow_id=ref.id, kind="RETRY").count() == 1


def test_a_retry_racing_another_finds_nothing_and_is_rejected():
    Gate.non_retryable = True
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    Gate.non_retryable = False
    first = wf.retry(ref.id)
    # a second RETRY recorded directly (as two nodes racing past the open-retry check)
    from vertique_workflow.store import commands

    commands.insert(ref.id, "RETRY")
    assert run_until_idle().outcomes == ["COMPLETED", "REJECTED"]
    second = WorkflowCommand.objects.filter(workflow_id=ref.id, kind="RETRY").exclude(
        pk=first.command_id
    )
    assert second.get().last_error == "NOTHING_TO_RETRY: the instance had nothing to retry"


def run_retry_command(*args: str) -> str:
    out = io.StringIO()
    call_command("workflow_retry", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_workflow_retry_command_dry_run_filters_and_ids():
    Gate.non_retryable = True
    failed = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    healthy = wf.start("order", {"amount": 5}, idempotency_key="k2")
    run_until_idle()
    before = table_counts()
    out = run_retry_command("--failed", "--dry-run")
    assert f"would retry {failed.id} (shipment v1, FAILED, 0 dead)" in out
    assert str(healthy.id) not in out
    assert "dry run: 1 instance(s) would be retried" in out
    assert table_counts() == before
    assert "0 retried" in run_retry_command("--failed", "--definition", "order")
    out = run_retry_command(str(healthy.id))
    assert "skipped" in out and "nothing to retry" in out and "0 retried, 1 skipped" in out
    Gate.non_retryable = False
    assert "1 retried, 0 skipped" in run_retry_command("--failed", "--reason", "fixed")
    run_until_idle()
    assert wf.get(failed.id).status == "WAITING"
    retry = WorkflowCommand.objects.get(workflow_id=failed.id, kind="RETRY")
    assert (retry.actor_kind, retry.actor_id, retry.actor_reason) == (
        "SYSTEM",
        "workflow_retry",
        "fixed",
    )
    for bad in ([], ["--definition", "x"], ["not-a-uuid"], [str(failed.id), "--failed"]):
        with pytest.raises(CommandError):
            run_retry_command(*bad)


@pytest.mark.slow
def test_a_dead_lettered_signal_fixed_by_a_deploy_through_executor_processes():
    fast = {"POLL_INTERVAL_MS": 200, "LEASE_SECONDS": 5}
    ref = wf.start("billing", {}, idempotency_key="k1")
    wf.signal(ref.id, "charge", None, dedup_key="c1")
    down = {"VERTIQUE_TEST_BILLING_DOWN": "1"}
    # not --until-idle: between attempts the signal backs off and the probe is idle
    with ExecutorProcess(settings=fast, env=down) as before_deploy:
        wait_until(
            lambda: wf.get(ref.id).dead_commands == 1,
            timeout=300,
            what="the signal to be dead-lettered",
            process=before_deploy,
        )
        assert before_deploy.stop() == 0, before_deploy.log
    wf.retry(ref.id, reason="gateway fixed")
    with ExecutorProcess("--until-idle", "-v", "2", settings=fast) as after_deploy:
        assert after_deploy.wait(120) == 0, after_deploy.log
        log = after_deploy.log
    assert wf.get(ref.id).current_step == "await_note"
    retry = WorkflowCommand.objects.get(workflow_id=ref.id, kind="RETRY")
    signal = WorkflowCommand.objects.get(workflow_id=ref.id, kind="SIGNAL")
    # -v 2: one line per command (instance, kind, outcome, step, milliseconds)
    assert f"command {retry.id} RETRY of {ref.id}: COMPLETED" in log
    assert f"command {signal.id} SIGNAL of {ref.id}: COMPLETED, step await_note, " in log
