"""Fork and join end to end through the command log: branches, policies, late callbacks."""

from __future__ import annotations

from typing import Any

import pytest

import vertique_workflow as wf
from tests.conftest import history_events
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowHistory,
    WorkflowJoinState,
    WorkflowTimer,
)
from vertique_workflow.testing import advance_time, run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def start(definition: str, payload: Any = None, key: str = "k1") -> Any:
    ref = wf.start(definition, payload or {}, idempotency_key=key)
    run_until_idle()
    return ref.id


def tokens(instance: Any) -> dict[str, str]:
    return {t.branch_id: t.status for t in WorkflowBranchToken.objects.filter(workflow_id=instance)}


def go(instance: Any, branch: str, fork: str = "split", key: str | None = None) -> None:
    wf.signal(instance, "go", None, dedup_key=key or f"go-{branch}", branch=(fork, branch))


def test_a_fork_runs_its_branches_and_the_join_waits_for_all():
    instance = start("parallel")
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "split")
    assert tokens(instance) == {"a": "COMPLETED", "b": "WAITING", "c": "WAITING"}
    join = WorkflowJoinState.objects.get(workflow_id=instance)
    assert (join.expected, join.decided) == (3, False)
    assert [a["branchId"] for a in join.arrived_json] == ["a"]
    go(instance, "c")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert tokens(instance)["c"] == "COMPLETED"
    assert wf.get(instance).status == "WAITING"
    go(instance, "b")
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state["joined"]) == (
        "COMPLETED",
        {"a": "a:a", "b": "b:b", "c": "c:c"},
    )
    join.refresh_from_db()
    assert join.decided is True
    assert [a["branchId"] for a in join.arrived_json] == ["a", "c", "b"]
    assert "done" not in view.state, "a branch's state is its own"


def test_a_branch_signal_reaches_only_its_branch():
    instance = start("parallel")
    go(instance, "b")
    run_until_idle()
    assert tokens(instance) == {"a": "COMPLETED", "b": "COMPLETED", "c": "WAITING"}
    applied = WorkflowHistory.objects.get(workflow_id=instance, event_type="SIGNAL_APPLIED")
    assert applied.payload_json == {"signal": "go", "forkStepId": "split", "branchId": "b"}


def test_an_instance_level_signal_does_not_reach_a_branch_wait():
    instance = start("parallel")
    wf.signal(instance, "go", None, dedup_key="plain")
    assert run_until_idle().outcomes == ["PARKED"]
    assert tokens(instance) == {"a": "COMPLETED", "b": "WAITING", "c": "WAITING"}


def test_a_signal_recorded_before_its_branch_existed_applies_once_the_fork_made_it():
    ref = wf.start("parallel", {}, idempotency_key="k1")
    go(ref.id, "b")  # recorded before the START ran: no branch b exists yet
    assert run_until_idle().outcomes == ["COMPLETED", "COMPLETED"]
    assert tokens(ref.id)["b"] == "COMPLETED"


def test_an_any_join_decides_on_the_first_branch_and_supersedes_the_other():
    instance = start("race")
    assert tokens(instance) == {"slow": "WAITING", "fast": "WAITING"}
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    assert timer.branch_id == "slow" and timer.branch_token_id is not None
    go(instance, "fast", key="g1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "hold")
    assert tokens(instance) == {"slow": "SUPERSEDED", "fast": "COMPLETED"}
    timer.refresh_from_db()
    assert timer.status == "CANCELLED", "the superseded branch's timer went with it"


def test_a_late_callback_for_a_superseded_branch_is_ignored_and_logged():
    instance = start("race")
    slow = WorkflowBranchToken.objects.get(workflow_id=instance, branch_id="slow")
    go(instance, "fast", key="g1")
    run_until_idle()
    # a signal to the superseded branch
    wf.signal(instance, "go", None, dedup_key="late", branch=("split", "slow"))
    assert run_until_idle().outcomes == ["SETTLED"]
    late = WorkflowCommand.objects.get(workflow_id=instance, dedup_key="late")
    assert late.state == "STALE"
    assert late.last_error.startswith("BRANCH_LATE_CALLBACK_IGNORED: ")
    assert "BRANCH_LATE_CALLBACK_IGNORED" in history_events(instance)
    assert WorkflowBranchToken.objects.get(pk=slow.pk).status == "SUPERSEDED"


def test_a_fan_out_runs_one_branch_per_item_and_joins_once():
    instance = start("fan", {"items": list(range(200))})
    view = wf.get(instance)
    assert (view.status, view.state["doubled"]) == ("COMPLETED", [i * 2 for i in range(200)])
    assert set(tokens(instance).values()) == {"COMPLETED"}
    assert WorkflowBranchToken.objects.filter(workflow_id=instance).count() == 200
    assert history_events(instance).count("WORKFLOW_COMPLETED") == 1


def test_an_empty_fan_out_joins_at_once():
    instance = start("fan", {"items": []})
    view = wf.get(instance)
    assert (view.status, view.state["doubled"]) == ("COMPLETED", [])


def test_n_of_m_goes_on_when_enough_branches_completed_despite_a_failed_one():
    instance = start("partial")
    assert tokens(instance) == {"a": "COMPLETED", "b": "FAILED", "c": "WAITING"}
    go(instance, "c")
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.state["joined"]) == ("COMPLETED", {"a": "a", "c": "c"})


def test_nested_forks_join_inside_out():
    instance = start("nested")
    branches = {
        (b.fork_step_id.split("@")[0], b.branch_id): b.status for b in wf.branches(instance)
    }
    assert branches == {
        ("outer", "x"): "WAITING",
        ("outer", "y"): "WAITING",
        ("inner", "p"): "COMPLETED",
        ("inner", "q"): "WAITING",
    }
    go(instance, "q", fork="inner")
    run_until_idle()
    assert tokens(instance)["x"] == "COMPLETED"
    assert wf.get(instance).status == "WAITING"
    go(instance, "y", fork="outer")
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"


def test_branch_timers_fire_in_their_branch():
    instance = start("race")
    advance_time("1h")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(instance).current_step == "hold"
    assert tokens(instance) == {"slow": "COMPLETED", "fast": "SUPERSEDED"}
    go(instance, "fast", key="late")  # the losing branch's signal comes too late
    assert run_until_idle().outcomes == ["SETTLED"]
    wf.signal(instance, "finish", None, dedup_key="f")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert wf.get(instance).status == "COMPLETED"


def test_branch_decisions_are_logged_apart_from_the_instance_state():
    instance = start("parallel")
    entries = WorkflowHistory.objects.filter(workflow_id=instance, event_type="BRANCH_DECISION")
    assert {e.payload_json["branchId"] for e in entries} == {"a", "b", "c"}
    assert all(e.state_version_after is None for e in entries)
    assert wf.state_at(instance, WorkflowHistory.objects.filter(workflow_id=instance).count()) == {}


def test_cancel_supersedes_live_branches_and_cancels_their_timers():
    instance = start("race")
    assert wf.cancel(instance, reason="withdrawn")
    assert tokens(instance) == {"slow": "SUPERSEDED", "fast": "SUPERSEDED"}
    assert WorkflowTimer.objects.get(workflow_id=instance).status == "CANCELLED"


def test_a_fan_out_costs_a_bounded_number_of_statements_whatever_its_width():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def statements(width: int, key: str) -> int:
        wf.start("fan", {"items": list(range(width))}, idempotency_key=key)
        with CaptureQueriesContext(connection) as captured:
            run_until_idle()
        return len(captured.captured_queries)

    assert statements(200, "wide") == statements(2, "narrow"), "one insert for every branch"


@pytest.mark.usefixtures("reset_gates")
def test_a_failing_branch_step_rolls_the_segment_back_and_succeeds_on_a_later_attempt():
    from tests.flows.workflows import Billing

    Billing.fail_times = 2
    ref = wf.start("flaky-branches", {}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["RETRIED", "RETRIED", "COMPLETED"]
    view = wf.get(ref.id)
    assert (view.status, view.state["joined"]) == (
        "COMPLETED",
        {"charge": "charged", "note": "noted"},
    )
    assert WorkflowBranchToken.objects.filter(workflow_id=ref.id).count() == 2, "none twice"
    assert Billing.calls == 3


def record_branch_retry(instance: Any, branch: str) -> int:
    from django.db import transaction

    from vertique_workflow.store import commands

    with transaction.atomic():
        command_id, _ = commands.insert(
            instance, "RETRY", payload=None, target={"forkStepId": "split", "branchId": branch}
        )
    return command_id


def test_a_branch_addressed_retry_re_drives_its_branch_once():
    instance = start("parallel")
    command_id = record_branch_retry(instance, "b")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert WorkflowCommand.objects.get(pk=command_id).state == "COMPLETE"
    assert tokens(instance)["b"] == "WAITING", "its wait entered again"
    assert "BRANCH_RETRIED" in history_events(instance)
    go(instance, "b")
    go(instance, "c")
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"


def test_a_branch_retry_for_an_ended_branch_or_a_decided_join_settles_stale():
    instance = start("race")
    go(instance, "fast", key="g1")
    run_until_idle()  # the join decided: slow superseded, fast completed
    stale = [record_branch_retry(instance, b) for b in ("slow", "fast")]
    assert run_until_idle().outcomes == ["SETTLED", "SETTLED"]
    for command_id in stale:
        command = WorkflowCommand.objects.get(pk=command_id)
        assert command.state == "STALE"
        assert command.last_error.startswith("BRANCH_RETRY_STALE: ")


def test_a_late_task_completion_of_a_superseded_branch_is_ignored_and_logged():
    from vertique_workflow.models import WorkflowTask

    instance = start("review-race")
    task = WorkflowTask.objects.get(workflow_id=instance)
    assert task.branch_id == "review" and task.branch_token_id is not None
    go(instance, "auto", key="g1")  # recorded first: it decides the join
    wf.complete_task(task.id, "approve", idempotency_key="c1")  # reserved, on its way
    assert run_until_idle().outcomes == ["COMPLETED", "SETTLED"]
    task.refresh_from_db()
    assert task.status == "CANCELLED"
    completion = WorkflowCommand.objects.get(workflow_id=instance, kind="COMPLETION")
    assert completion.state == "STALE"
    assert completion.last_error.startswith("BRANCH_LATE_CALLBACK_IGNORED: ")
    assert tokens(instance) == {"review": "SUPERSEDED", "auto": "COMPLETED"}
    assert {t.status for t in WorkflowTimer.objects.filter(workflow_id=instance)} == {"CANCELLED"}
    assert wf.get(instance).current_step == "hold"


@pytest.mark.parametrize("order", [("b", "c"), ("c", "b")])
def test_an_all_join_decides_once_whatever_order_the_branches_finish_in(order):
    instance = start("parallel")
    first, second = order
    go(instance, first)
    run_until_idle()
    assert wf.get(instance).status == "WAITING"
    go(instance, second)
    run_until_idle()
    assert wf.get(instance).status == "COMPLETED"
    joined = WorkflowHistory.objects.filter(workflow_id=instance, outcome="JOINED")
    assert joined.count() == 1
