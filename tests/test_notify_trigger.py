"""The commands trigger notifies at commit, only for PENDING/DEFERRED, with epoch ms."""

from __future__ import annotations

import uuid

import pgtrigger
import pytest
from django.db import connection, transaction

from tests.conftest import received_until_sentinel
from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.triggers import NOTIFY_TRIGGER_NAME


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


def test_pgtrigger_ignore_silences_the_trigger_and_an_empty_setting_does_not(listener):
    """django-pgtrigger's ``ignore()`` still skips the trigger (its test is inline, 0013)."""
    instance = make_instance()
    with pgtrigger.ignore(f"vertique_workflow.WorkflowCommand:{NOTIFY_TRIGGER_NAME}"):
        WorkflowCommand.objects.create(workflow=instance, seq=1, kind="START", state="PENDING")
    assert received_until_sentinel(listener) == []
    # after ignore() the session's setting is empty, not unset: the trigger fires again
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('pgtrigger.ignore', true)")
        assert cursor.fetchone()[0] in ("", None)
    command = WorkflowCommand.objects.create(
        workflow=instance, seq=2, kind="SIGNAL", state="PENDING"
    )
    assert received_until_sentinel(listener) == [epoch_ms(command)]


def notify_trigger() -> tuple[str | None, str, str]:
    """(the trigger's WHEN as PostgreSQL prints it or None, its function's name and source)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_triggerdef(t.oid), t.tgqual IS NULL, t.tgfoid::regproc::text, "
            "p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = %s::regclass AND t.tgname LIKE %s",
            [tables.qualified(tables.COMMANDS), f"pgtrigger_{NOTIFY_TRIGGER_NAME}_%"],
        )
        rows = cursor.fetchall()
    assert len(rows) == 1, rows
    definition, no_when, function, source = rows[0]
    return (None if no_when else definition), function, source


@pytest.mark.django_db
def test_the_trigger_function_starts_no_subtransaction():
    """The installed function makes the ignore test inline, without pgtrigger's helper."""
    _, _, source = notify_trigger()
    assert "_pgtrigger_should_ignore" not in source
    assert "current_setting('pgtrigger.ignore', true)" in source


def test_the_condition_is_tested_in_the_function_not_in_a_when_clause(listener):
    """0016: no WHEN (PostgreSQL re-read it from text for every statement writing a
    command); the function tests the state, so an update to a state that does not
    notify calls it once and notifies nothing, and one to PENDING notifies."""
    when, function, source = notify_trigger()
    assert when is None
    assert "'{PENDING,DEFERRED}'::text[]" in source
    instance = make_instance()
    command = WorkflowCommand.objects.create(
        workflow=instance, seq=1, kind="START", state="PENDING"
    )
    assert received_until_sentinel(listener) == [epoch_ms(command)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL track_functions = 'pl'")
        WorkflowCommand.objects.filter(pk=command.pk).update(state="CLAIMED")
        cursor.execute(
            "SELECT calls FROM pg_stat_xact_user_functions WHERE funcid = %s::regproc",
            [function],
        )
        assert cursor.fetchone() == (1,)
    assert received_until_sentinel(listener) == []
    WorkflowCommand.objects.filter(pk=command.pk).update(state="PENDING")
    assert received_until_sentinel(listener) == [epoch_ms(command)]
