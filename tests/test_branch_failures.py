"""A branch step failing terminally fails only its branch; its join decides; branch retries."""

from __future__ import annotations

from typing import Any

import pytest

import vertique_workflow as wf
from tests.conftest import history_events
from tests.flows.workflows import Gifts
from vertique_workflow.models import (
    WorkflowBranchToken,
    WorkflowCommand,
    WorkflowHistory,
    WorkflowJoinState,
)
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]


def tokens(instance: Any) -> dict[str, tuple[str, str]]:
    return {
        t.branch_id: (t.status, t.current_step_id)
        for t in WorkflowBranchToken.objects.filter(workflow_id=instance)
    }


def arrivals(instance: Any) -> list[dict[str, Any]]:
    return WorkflowJoinState.objects.get(workflow_id=instance).arrived_json


def go(instance: Any, branch: str, key: str = "g1") -> None:
    wf.signal(instance, "go", None, dedup_key=key, branch=("split", branch))


def started(definition: str = "broken-branches") -> Any:
    return wf.start(definition, {}, idempotency_key="k1").id


@pytest.mark.parametrize(
    ("mode", "outcomes", "error"),
    [
        (
            "refuse",
            ["COMPLETED"],
            "GIFT_REFUSED: step 'gift' failed and is not retried (attempt 1)",
        ),
        (
            "never",  # KeyError: never retried by the step's policy
            ["COMPLETED"],
            "NON_RETRYABLE: step 'gift' failed and is not retried (attempt 1)",
        ),
        (
            "flaky",  # the first attempt rolls back; the second, the last, fails the branch
            ["RETRIED", "COMPLETED"],
            "ATTEMPTS_EXHAUSTED: step 'gift' failed 2 of 2 attempts; last reason STEP_FAILED",
        ),
    ],
)
def test_a_terminal_branch_failure_fails_only_the_branch_and_the_join_goes_on(
    mode, outcomes, error
):
    Gifts.mode = mode
    instance = started()
    assert run_until_idle().outcomes == outcomes
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "split"), "the instance did not fail"
    assert tokens(instance) == {
        "charge": ("COMPLETED", "joined"),
        "gift": ("FAILED", "gift"),
        "note": ("WAITING", "wait_note"),
    }
    start = WorkflowCommand.objects.get(workflow_id=instance, kind="START")
    assert start.state == "COMPLETE"
    failed = [a for a in arrivals(instance) if a["status"] == "FAILED"]
    assert [(a["branchId"], a["error"]) for a in failed] == [("gift", error)]
    assert "no gifts" not in str(arrivals(instance)), "never the exception's text"
    go(instance, "note")
    run_until_idle()
    view = wf.get(instance)
    assert (view.status, view.current_step) == ("WAITING", "hold"), "joined: two of three"
    assert view.state["joined"] == {"charge": "charged", "note": None}


def test_the_branch_failure_is_in_the_decision_log_and_the_token_keeps_its_metadata():
    Gifts.mode = "refuse"
    instance = started()
    run_until_idle()
    gift = WorkflowBranchToken.objects.get(workflow_id=instance, branch_id="gift")
    charge = WorkflowBranchToken.objects.get(workflow_id=instance, branch_id="charge")
    assert gift.metadata == charge.metadata, "captured at the fork, not overwritten by the failure"
    logged = [
        (e.step_id, e.outcome, e.payload_json.get("branchId"), e.payload_json.get("reason"))
        for e in WorkflowHistory.objects.filter(workflow_id=instance, event_type="BRANCH_DECISION")
    ]
    assert ("gift", "STEP_FAILED", "gift", "GIFT_REFUSED") in logged
    assert ("joined", "BRANCH_FAILED", "gift", None) in logged
    assert "FAILED" not in history_events(instance), "the instance did not fail"


def test_a_retried_branch_that_fails_again_fails_again_and_the_join_still_waits():
    Gifts.mode = "refuse"
    instance = started()
    run_until_idle()
    receipt = wf.retry(instance, branch=("split", "gift"))
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert WorkflowCommand.objects.get(pk=receipt.command_id).state == "COMPLETE"
    assert tokens(instance)["gift"] == ("FAILED", "gift")
    assert [a["status"] for a in arrivals(instance) if a["branchId"] == "gift"] == ["FAILED"]
    assert wf.get(instance).status == "WAITING", "2 of 3 can still be met"
    assert Gifts.calls == 2


def test_an_all_join_fails_the_instance_when_a_branch_fails_terminally():
    Gifts.mode = "refuse"
    instance = started("all-or-nothing")
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.error_type) == ("FAILED", "JOIN_FAILED")
    assert tokens(instance) == {"gift": ("FAILED", "gift"), "note": ("SUPERSEDED", "wait_note")}


def test_retrying_an_instance_failed_at_its_join_runs_its_branches_again_from_the_fork():
    Gifts.mode = "refuse"
    instance = started("all-or-nothing")
    run_until_idle()
    Gifts.mode = "ok"  # the cause fixed
    wf.retry(instance)
    run_until_idle()
    assert wf.get(instance).status == "WAITING"
    live = WorkflowBranchToken.objects.filter(workflow_id=instance, status="WAITING")
    assert [t.branch_id for t in live] == ["note"], "a new note branch waits"
    wf.signal(instance, "go", None, dedup_key="g1", branch=("split", "note"))
    run_until_idle()
    view = wf.get(instance)
    assert view.status == "COMPLETED"
    assert view.state["joined"] == {"gift": "gifted", "note": None}


def test_wf_retry_of_a_failed_branch_re_drives_it_and_the_join_counts_it_once():
    Gifts.mode = "refuse"
    instance = started()
    run_until_idle()
    Gifts.mode = "ok"
    receipt = wf.retry(instance, branch=("split", "gift"), reason="gift shop fixed")
    assert run_until_idle().outcomes == ["COMPLETED"]
    assert WorkflowCommand.objects.get(pk=receipt.command_id).state == "COMPLETE"
    view = wf.get(instance)
    assert view.current_step == "hold", "charge and gift: two of three"
    assert view.state["joined"] == {"charge": "charged", "gift": "gifted"}
    assert tokens(instance)["note"] == ("SUPERSEDED", "wait_note")
    assert [a["branchId"] for a in arrivals(instance)] == ["charge", "gift"], "counted once"
    assert "BRANCH_RETRIED" in history_events(instance)


def test_wf_retry_of_a_branch_whose_join_decided_settles_stale():
    Gifts.mode = "refuse"
    instance = started()
    run_until_idle()
    go(instance, "note")
    run_until_idle()  # charge and note: the join decided
    receipt = wf.retry(instance, branch=("split", "gift"))
    assert run_until_idle().outcomes == ["SETTLED"]
    command = WorkflowCommand.objects.get(pk=receipt.command_id)
    assert command.state == "STALE" and command.last_error.startswith("BRANCH_RETRY_STALE: ")


def test_wf_retry_of_a_branch_refuses_bad_input_and_ended_instances():
    instance = started()
    run_until_idle()
    with pytest.raises(wf.WorkflowValidationError):
        wf.retry(instance, branch="split/gift")  # type: ignore[arg-type]
    wf.cancel(instance, reason="done with it")
    run_until_idle()
    with pytest.raises(wf.WorkflowConflict):
        wf.retry(instance, branch=("split", "gift"))
