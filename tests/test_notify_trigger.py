"""The commands trigger notifies at commit, only for PENDING/DEFERRED, with epoch ms."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

from tests.conftest import received_until_sentinel
from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand, WorkflowInstance


def make_instance() -> WorkflowInstance:
    return WorkflowInstance.objects.create(
        id=uuid.uuid4(), definition_id="d", definition_version=1, plan_hash="h", status="PENDING"
    )


def epoch_ms(command: WorkflowCommand) -> str:
    command.refresh_from_db()
    return str(int(command.available_at.timestamp() * 1000))


def test_insert_notifies_at_commit_with_epoch_milliseconds(listener):
    instance = make_instance()
    with transaction.atomic():
        command = WorkflowCommand.objects.create(
            workflow=instance, seq=1, kind="START", state="PENDING"
        )
        # nothing is delivered before the commit
        assert received_until_sentinel(listener) == []
    assert received_until_sentinel(listener) == [epoch_ms(command)]


def test_rollback_delivers_nothing(listener):
    instance = make_instance()
    with pytest.raises(RuntimeError), transaction.atomic():
        WorkflowCommand.objects.create(workflow=instance, seq=1, kind="START", state="PENDING")
        raise RuntimeError("roll back")
    assert received_until_sentinel(listener) == []


def test_only_pending_and_deferred_notify(listener):
    instance = make_instance()
    command = WorkflowCommand.objects.create(
        workflow=instance, seq=1, kind="START", state="CLAIMED"
    )
    assert received_until_sentinel(listener) == []
    for state, notifies in [
        ("COMPLETE", False),
        ("DEFERRED", True),
        ("PARKED", False),
        ("PENDING", True),
    ]:
        WorkflowCommand.objects.filter(pk=command.pk).update(state=state)
        expected = [epoch_ms(command)] if notifies else []
        assert received_until_sentinel(listener) == expected, state


def test_available_at_change_notifies_and_other_columns_do_not(listener):
    instance = make_instance()
    command = WorkflowCommand.objects.create(
        workflow=instance, seq=1, kind="START", state="PENDING"
    )
    received_until_sentinel(listener)
    WorkflowCommand.objects.filter(pk=command.pk).update(last_error="X: y", attempts=2)
    assert received_until_sentinel(listener) == []
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {tables.qualified(tables.COMMANDS)} "
            "SET available_at = available_at + interval '1 minute' WHERE id = %s",
            [command.pk],
        )
    assert received_until_sentinel(listener) == [epoch_ms(command)]
