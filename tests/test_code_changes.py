"""Code changes under running instances (issue 7, defect 9).

A pin resolves by (scope, id, version): a version rehashed in place still runs
its instances; an instance standing at a step its version's code lost fails
with STEP_NOT_IN_PLAN at the first attempt (never deferred forever), and is
reported by a system check, by one ERROR line at executor start and by the
instance counts of ``workflow_definitions list``. The name binding recorded
with the plan hash stops startup when a class bound by name has moved.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

import vertique_workflow as wf
from tests.conftest import history_events as events
from tests.conftest import run_manage, table_counts
from vertique_workflow import registry
from vertique_workflow.checks import check_stranded_instances
from vertique_workflow.definitions import Plan, catalog
from vertique_workflow.exceptions import WorkflowDefinitionError
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowDefinition,
    WorkflowInstance,
)
from vertique_workflow.pins import resident_plan
from vertique_workflow.store import db
from vertique_workflow.store import definitions as store
from vertique_workflow.testing import run_until_idle

EXPENSE = "tests.flows.workflows.Expense"


@pytest.fixture
def swap_plan() -> Iterator[Callable[[Plan], None]]:
    """Replace the catalog's plan of an (id, version), as a deploy of changed code would."""
    originals: list[Plan] = []

    def swap(plan: Plan) -> None:
        old = catalog.remove(plan.id, plan.version)
        assert old is not None
        originals.append(old)
        catalog.register(plan)

    yield swap
    for old in reversed(originals):
        catalog.remove(old.id, old.version)
        catalog.register(old)
    registry._reset_sync_state()


def two_waits() -> Plan:
    plan = catalog.get("two-waits", 1)
    assert plan is not None
    return plan


def changed(plan: Plan, steps: list[Any], **fields: Any) -> Plan:
    values = {
        "id": plan.id,
        "version": plan.version,
        "contract": plan.contract,
        "start": plan.start,
        "state_type": plan.state_type,
        "signals": dict(plan.signals),
        "start_schema": plan.start_schema,
        **fields,
    }
    return Plan.from_steps(steps, **values)


def rehashed_two_waits() -> Plan:
    """Same steps, one more declared signal: a new hash for version 1."""
    old = two_waits()
    return changed(old, list(old.steps.values()), signals={**old.signals, "fourth": None})


def two_waits_without_first_wait() -> Plan:
    """Version 1 with 'wait_first' (and what followed it) renamed away."""
    old = two_waits()
    steps = old.steps
    begin = dataclasses.replace(steps["begin"], next="wait_second")
    return changed(old, [begin, steps["wait_second"], steps["done"]])


def waiting_at_first(count: int = 1) -> list[Any]:
    refs = [wf.start("two-waits", {}, idempotency_key=f"k{i}").id for i in range(count)]
    run_until_idle()
    assert {wf.get(ref).current_step for ref in refs} == {"wait_first"}
    return refs


# --------------------------------------------------------------------------
# resolution by (scope, id, version)
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_resident_plan_resolves_by_scope_id_and_version_not_by_hash():
    plan = catalog.get("order", 1)
    assert resident_plan("order", 1) is plan
    # code plans are default-scope; another scope's pin needs a DOCUMENT row (none here)
    assert resident_plan("order", 1, scope="tenant") is None
    assert resident_plan("order", 2) is None


@pytest.mark.django_db
def test_a_rehashed_version_still_runs_the_instances_started_before(swap_plan):
    (ref,) = waiting_at_first()
    pinned = WorkflowInstance.objects.get(id=ref).plan_hash
    new = rehashed_two_waits()
    assert new.plan_hash != pinned
    swap_plan(new)
    assert registry.sync_code_definitions([new]) == {("two-waits", 1): "REHASHED"}
    wf.signal(ref, "first", None, dedup_key="f1")
    assert run_until_idle().outcomes == ["COMPLETED"]
    command = WorkflowCommand.objects.get(workflow_id=ref, kind="SIGNAL")
    assert (command.state, command.deferral_count, command.attempts) == ("COMPLETE", 0, 1)
    instance = WorkflowInstance.objects.get(id=ref)
    assert (instance.status, instance.current_step_id) == ("WAITING", "wait_second")
    assert instance.plan_hash == pinned  # the pin keeps the hash recorded at start


# --------------------------------------------------------------------------
# a step the code of the version lost
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_instance_at_a_step_the_code_lost_fails_at_the_first_attempt(swap_plan):
    (ref,) = waiting_at_first()
    original = two_waits()
    swap_plan(two_waits_without_first_wait())
    wf.signal(ref, "first", None, dedup_key="f1")
    assert run_until_idle().outcomes == ["FAILED"]
    command = WorkflowCommand.objects.get(workflow_id=ref, kind="SIGNAL")
    assert (command.state, command.attempts, command.deferral_count) == ("FAILED", 1, 0)
    assert command.last_error == (
        "STEP_NOT_IN_PLAN: step 'wait_first' failed and is not retried (attempt 1)"
    )
    instance = WorkflowInstance.objects.get(id=ref)
    assert (instance.status, instance.current_step_id) == ("FAILED", "wait_first")
    assert (instance.error_type, instance.error_message) == ("STEP_NOT_IN_PLAN", command.last_error)
    assert "COMMAND_DEFERRED" not in events(ref)
    assert events(ref)[-1] == "FAILED"
    # repairable: restore the step in that version's code, then retry
    swap_plan(original)
    wf.retry(ref)
    assert run_until_idle().outcomes == ["COMPLETED", "COMPLETED"]
    repaired = wf.get(ref)
    assert (repaired.status, repaired.current_step) == ("WAITING", "wait_second")
    assert WorkflowCommand.objects.get(workflow_id=ref, kind="SIGNAL").state == "COMPLETE"


@pytest.mark.django_db
def test_the_check_warns_with_count_version_missing_steps_and_the_fix(swap_plan):
    waiting_at_first(2)
    assert check_stranded_instances(databases=[db.alias()]) == []
    swap_plan(two_waits_without_first_wait())
    assert check_stranded_instances(databases=None) == []  # a database check only
    (warning,) = check_stranded_instances(databases=[db.alias()])
    assert warning.id == "vertique_workflow.W001"
    assert warning.msg == (
        "2 unfinished instance(s) of workflow 'two-waits' version 1 stand at step(s) the "
        "code of version 1 no longer has: 'wait_first' (2)"
    )
    assert warning.hint.startswith(
        "keep the old class as version 1 (with those steps) and add version 2 with the new "
        "steps; until then their commands fail with STEP_NOT_IN_PLAN"
    )
    out = io.StringIO()
    call_command("check", "--database", db.alias(), stdout=out, stderr=out)
    assert "vertique_workflow.W001" in out.getvalue()


@pytest.mark.django_db
def test_failed_instances_at_a_lost_step_are_reported_too(swap_plan):
    definition = two_waits()
    for status in ("FAILED", "WAITING", "COMPLETED"):
        WorkflowInstance.objects.create(
            id=uuid.uuid4(),
            definition_id="two-waits",
            definition_version=1,
            plan_hash=definition.plan_hash,
            status=status,
            current_step_id="gone",
        )
    WorkflowInstance.objects.create(
        id=uuid.uuid4(),
        definition_id="two-waits",
        definition_version=1,
        plan_hash=definition.plan_hash,
        status="FAILED",
        current_step_id="gone",
        archived_at=timezone.now(),
    )
    (group,) = registry.stranded_instances()
    assert (group.definition_id, group.version, group.steps) == ("two-waits", 1, (("gone", 2),))


def test_the_check_skips_an_unmigrated_database(scratch_database):
    result = run_manage("check", "--database", "default", dbname=scratch_database, check=False)
    assert result.returncode == 0, result.stderr
    assert "W001" not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_executor_logs_one_error_line_at_start(swap_plan, caplog):
    waiting_at_first(3)
    with caplog.at_level(logging.INFO, logger="vertique_workflow"):
        call_command("workflow_executor", "--until-idle", "--concurrency", "1")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    caplog.clear()
    swap_plan(two_waits_without_first_wait())
    with caplog.at_level(logging.INFO, logger="vertique_workflow"):
        call_command("workflow_executor", "--until-idle", "--concurrency", "1")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(
        "stranded instances: 3 unfinished instance(s) of workflow 'two-waits' version 1 "
        "stand at step(s) the code of version 1 no longer has: 'wait_first' (3): keep the "
        "old class as version 1 (with those steps) and add version 2 with the new steps"
    )
    assert "docs/changing-workflows.md" in line


# --------------------------------------------------------------------------
# name binding
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_code_rows_record_the_name_binding_with_the_hash():
    registry.sync_code_definitions()
    expense = WorkflowDefinition.objects.get(definition_id="expense-approval")
    assert expense.name_binding == {EXPENSE: EXPENSE}
    assert WorkflowDefinition.objects.get(definition_id="order").name_binding == {}
    # a rehash writes the binding in the same statement as the new hash
    old = catalog.get("expense-approval", 1)
    assert old is not None
    logical = changed(old, list(old.steps.values()), state_type_name="expense.state")
    assert store.upsert_code(logical) == "REHASHED"
    expense.refresh_from_db()
    assert (expense.plan_hash, expense.name_binding) == (
        logical.plan_hash,
        {EXPENSE: "expense.state"},
    )


def bound_row(name: str, status: str = "AVAILABLE", hashed: str | None = None) -> str:
    definition_id = f"bound-{uuid.uuid4().hex[:8]}"
    WorkflowDefinition.objects.create(
        scope_key="default",
        definition_id=definition_id,
        definition_version=3,
        kind="CODE",
        status=status,
        contract_name="bound.v1",
        state_type_name=hashed or name,
        plan_hash="h",
        name_binding={name: hashed or name},
    )
    return definition_id


@pytest.mark.django_db
def test_sync_refuses_a_moved_class_that_a_live_version_binds_by_name():
    moved = "tests.flows.workflows.ExpenseMovedAway"
    definition_id = bound_row(moved)
    before = table_counts()
    expected = re.escape(
        f"default/{definition_id} v3 (AVAILABLE) is bound by name to the class '{moved}'"
    )
    with pytest.raises(WorkflowDefinitionError, match=expected):
        registry.sync_code_definitions()
    assert table_counts() == before  # refused before any write
    with pytest.raises(CommandError, match=expected):
        call_command("workflow_definitions", "sync", stdout=io.StringIO())
    registry._reset_sync_state()
    try:
        with pytest.raises(CommandError, match=expected):
            call_command("workflow_executor", "--until-idle")
    finally:
        registry._reset_sync_state()
    WorkflowDefinition.objects.filter(definition_id=definition_id).update(status="RETIRED")
    assert registry.sync_code_definitions()[("order", 1)] in ("INSERTED", "UNCHANGED")


@pytest.mark.django_db
def test_a_class_bound_to_a_logical_name_or_still_importable_may_stay_or_move():
    bound_row("tests.flows.workflows.GoneButLogical", hashed="expense.state")
    bound_row(EXPENSE)
    bound_row("tests.flows.workflows.OrderFlow.reserve")  # not a class: moved
    with pytest.raises(WorkflowDefinitionError, match=re.escape("OrderFlow.reserve")):
        registry.check_name_bindings()
    WorkflowDefinition.objects.filter(
        name_binding__has_key="tests.flows.workflows.OrderFlow.reserve"
    ).delete()
    registry.check_name_bindings()


# --------------------------------------------------------------------------
# workflow_definitions list
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_list_shows_live_and_failed_instances_per_version():
    registry.sync_code_definitions()
    for status in ("WAITING", "WAITING", "PENDING", "FAILED", "COMPLETED", "CANCELLED"):
        WorkflowInstance.objects.create(
            id=uuid.uuid4(),
            definition_id="order",
            definition_version=1,
            plan_hash="h",
            status=status,
        )
    out = io.StringIO()
    call_command("workflow_definitions", "list", stdout=out)
    lines = [line.split() for line in out.getvalue().splitlines()]
    header = lines[0]
    assert header[6:8] == ["LIVE", "FAILED"]
    by_id = {line[1]: line for line in lines[1:]}
    assert by_id["order"][6:8] == ["3", "1"]
    assert by_id["two-waits"][6:8] == ["0", "0"]
