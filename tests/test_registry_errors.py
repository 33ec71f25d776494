"""Registry errors (issue 15, item 12): lock timeouts, failure marks, refusals shown to users.

A lock timeout carries the exact definition id as an attribute; an admission
timeout inside the caller's transaction is the data-access error (Django's
``OperationalError``, SQLSTATE 55P03) and leaves that transaction unusable,
while a start that owns its transaction raises the retryable
``WorkflowPersistenceError`` naming the id. ``failure_reason`` is read with
its rule's fixed description. Registry refusals reach end users only as a
fixed sentence (``wf.user_message``, the example project's views).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.conftest import ROOT, database_url, table_counts
from vertique_workflow import tables
from vertique_workflow.exceptions import (
    DefinitionNotFound,
    DefinitionUnavailable,
    RegistryRefusal,
    WorkflowConflict,
    WorkflowNotFound,
    WorkflowPersistenceError,
)
from vertique_workflow.models import WorkflowDefinition
from vertique_workflow.store import db
from vertique_workflow.store import definitions as store

T = tables.sql_names()
LOCK_KEY = (
    "SELECT pg_advisory_xact_lock(hashtextextended('vertique_workflow.definition:' || %s, 0))"
)


class Plan:
    """The attributes the registry reads of a plan, without the DSL."""

    def __init__(self, definition_id: str, version: int = 1) -> None:
        self.id, self.version = definition_id, version
        self.contract, self.state_type_name = "thing.v1", "dict"
        self.plan_hash = f"hash-{definition_id}-{version}"
        self.signals: dict[str, Any] = {}
        self.start_schema: dict[str, Any] | None = None


def new_id() -> str:
    return f"flow-{uuid.uuid4().hex[:8]}"


def short_lock_timeout() -> override_settings:
    return override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "DEFINITION_LOCK_TIMEOUT_MS": 100}
    )


# --------------------------------------------------------------------------
# lock timeouts
# --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_registry_lock_timeout_carries_the_exact_definition_id(holder):
    plan = Plan(new_id())
    store.upsert_code(plan)
    holder.execute(LOCK_KEY, [plan.id])
    with short_lock_timeout(), pytest.raises(WorkflowPersistenceError) as failed:
        store.transition("default", plan.id, 1, "AVAILABLE", "DEPRECATED")
    assert failed.value.retryable is True
    assert failed.value.definition_id == plan.id
    assert db.sqlstate(failed.value.__cause__) == "55P03"  # the database failure kept


@pytest.mark.django_db(transaction=True)
def test_an_admission_timeout_in_the_callers_transaction_is_the_data_access_error(holder):
    holder.execute(LOCK_KEY, ["order"])
    before = table_counts()
    with short_lock_timeout(), transaction.atomic():
        with pytest.raises(OperationalError) as failed:
            wf.start("order", {"amount": 5}, idempotency_key="k-admission")
        assert db.sqlstate(failed.value) == "55P03"
        # the caller's transaction is lost: run it again as a whole
        with pytest.raises(transaction.TransactionManagementError):
            table_counts()
    assert table_counts() == before


@pytest.mark.django_db(transaction=True)
def test_an_admission_timeout_of_a_start_owning_its_transaction_names_the_id(holder):
    holder.execute(LOCK_KEY, ["order"])
    before = table_counts()
    with short_lock_timeout(), pytest.raises(WorkflowPersistenceError) as failed:
        wf.start("order", {"amount": 5}, idempotency_key="k-own")
    assert (failed.value.retryable, failed.value.definition_id) == (True, "order")
    assert db.sqlstate(failed.value.__cause__) == "55P03"
    assert table_counts() == before


@pytest.mark.django_db(transaction=True)
def test_admit_pin_called_directly_leaves_the_data_access_error_and_a_lost_block(holder):
    plan = Plan(new_id())
    store.upsert_code(plan)
    holder.execute(LOCK_KEY, [plan.id])
    with short_lock_timeout(), transaction.atomic():
        with pytest.raises(OperationalError) as failed:
            store.admit_pin("default", plan.id, 1, plan.plan_hash)
        assert db.sqlstate(failed.value) == "55P03"
        assert connection.needs_rollback


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("reset_gates")
def test_an_admission_timeout_in_a_retry_segment_is_a_transient_failure(holder):
    from tests.flows.workflows import Gate
    from vertique_workflow.executor.segment import run_head
    from vertique_workflow.models import WorkflowCommand
    from vertique_workflow.store import commands
    from vertique_workflow.testing import run_until_idle

    Gate.non_retryable = True
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1")
    run_until_idle()
    assert wf.get(ref.id).status == "FAILED"
    Gate.non_retryable = False
    wf.retry(ref.id)
    holder.execute(LOCK_KEY, ["shipment"])  # a lifecycle change of the id in progress
    with short_lock_timeout():
        outcome = run_head(commands.peek(1)[0], "n")
    assert outcome.result == "RETRIED"
    retry = WorkflowCommand.objects.get(workflow_id=ref.id, kind="RETRY")
    assert (retry.state, retry.attempts, retry.transient_count) == ("PENDING", 0, 1)
    assert retry.last_error.startswith("TRANSIENT_FAILURE: ")
    assert wf.get(ref.id).status == "FAILED"  # the segment rolled back


# --------------------------------------------------------------------------
# failure_reason
# --------------------------------------------------------------------------


def failing_row(definition_id: str, version: int, reason: str | None) -> None:
    WorkflowDefinition.objects.create(
        scope_key="tenant",
        definition_id=definition_id,
        definition_version=version,
        kind="DOCUMENT",
        status="AVAILABLE",
        contract_name="thing.v1",
        state_type_name="dict",
        plan_hash=f"doc-{version}",
        document_text="id: x\n",
        document_digest="d",
        document_format="yaml",
        failure_reason=reason,
    )


@pytest.mark.django_db
def test_listed_and_found_records_carry_the_failure_with_its_fixed_description():
    definition_id = new_id()
    failing_row(definition_id, 1, "STATE_TYPE_NOT_EXTENDED")
    failing_row(definition_id, 2, "NAME_BINDING_UNRESOLVED")
    failing_row(definition_id, 3, "MADE_UP")
    failing_row(definition_id, 4, None)
    listed = store.list_definitions(definition_id=definition_id)
    found = [store.find_definition("tenant", definition_id, v) for v in (1, 2, 3, 4)]
    assert listed == found
    failures = [(r.failure_reason, r.failure) for r in listed]
    assert failures == [
        (
            "STATE_TYPE_NOT_EXTENDED",
            store.DefinitionFailure(
                "STATE_TYPE_NOT_EXTENDED", store.FAILURE_DESCRIPTIONS["STATE_TYPE_NOT_EXTENDED"]
            ),
        ),
        (
            "NAME_BINDING_UNRESOLVED",
            store.DefinitionFailure(
                "NAME_BINDING_UNRESOLVED", store.FAILURE_DESCRIPTIONS["NAME_BINDING_UNRESOLVED"]
            ),
        ),
        (None, None),  # a reason this release does not know reads as no failure
        (None, None),
    ]
    assert all(r.failure is None or r.failure.detail for r in listed)
    assert store.find_definition("tenant", definition_id, 5) is None


# --------------------------------------------------------------------------
# refusals are internal
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_start_refusals_are_registry_refusals_with_a_fixed_user_message():
    definition_id = new_id()
    store.upsert_code(Plan(definition_id, 1))
    store.upsert_code(Plan(definition_id, 2))
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    with pytest.raises(DefinitionUnavailable) as unavailable:
        wf.start(definition_id, {}, idempotency_key="k1", version=1)
    with pytest.raises(DefinitionNotFound) as missing:
        wf.start(definition_id, {}, idempotency_key="k2", version=9)
    for refusal, base in ((unavailable.value, WorkflowConflict), (missing.value, WorkflowNotFound)):
        assert isinstance(refusal, base)  # callers catching the old classes still do
        assert refusal.definition_id == definition_id
        assert wf.user_message(refusal) == RegistryRefusal.USER_MESSAGE
        assert definition_id not in wf.user_message(refusal)
    assert "default/" in str(unavailable.value)  # the full text is for logs
    # messages written for users pass; anything internal becomes a generic sentence
    assert wf.user_message(WorkflowConflict("dedup key already used")) == "dedup key already used"
    persistence = WorkflowPersistenceError("definition 'x': lock", retryable=True)
    assert "x" not in wf.user_message(persistence)


@pytest.mark.django_db
def test_pin_and_lifecycle_refusals_are_registry_refusals():
    definition_id = new_id()
    plan = Plan(definition_id)
    store.upsert_code(plan)
    with transaction.atomic(), pytest.raises(DefinitionUnavailable, match="drift") as drift:
        store.admit_pin("default", definition_id, 1, "other-hash")
    with pytest.raises(DefinitionUnavailable, match="INVALID_TRANSITION") as current:
        store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    assert drift.value.definition_id == current.value.definition_id == definition_id


EXAMPLE_VIEW_SCRIPT = """
import django.test.utils
from django.db import connection
from django.test import Client

django.test.utils.setup_test_environment()
from vertique_workflow import registry, tables

registry.sync_code_definitions()
with connection.cursor() as cursor:
    cursor.execute(
        "UPDATE " + tables.sql_names()["definitions"] + " SET status = 'DEPRECATED', "
        "plan_hash = 'secret-plan-hash' WHERE definition_id = 'expense-approval'"
    )
page = Client().post(
    "/",
    {"amount": 500, "description": "laptop", "submitted_by": "ann",
     "idempotency_key": "6c0f7e5e-3a38-4b8e-9d0e-0d3e2c1f6a11"},
)
print(page.status_code)
print(page.content.decode())
"""


def example_manage(*args: str, dbname: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        DATABASE_URL=database_url(dbname),
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONPATH=f"{ROOT / 'example_project'}{os.pathsep}{ROOT}",
    )
    env.pop("VERTIQUE_TEST_SCHEMA", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_example_project_shows_a_fixed_message_for_a_registry_refusal(scratch_database):
    migrated = example_manage("migrate", "--no-input", "-v", "0", dbname=scratch_database)
    assert migrated.returncode == 0, migrated.stderr
    run = example_manage("shell", "-v", "0", "-c", EXAMPLE_VIEW_SCRIPT, dbname=scratch_database)
    assert run.returncode == 0, run.stderr
    status, _, page = run.stdout.partition("\n")
    assert status == "200"  # the form again, with the refusal on it
    assert "Refused: " + RegistryRefusal.USER_MESSAGE.replace("'", "&#x27;") in page
    assert "DEPRECATED" not in page and "default/expense-approval" not in page
    assert "secret-plan-hash" not in page
