"""The migrated schema, in both placements, as PostgreSQL itself reports it."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from tests.conftest import connect, run_manage
from tests.expected_schema import EXPECTED
from tests.schema_introspection import describe, workflow_objects_in
from vertique_workflow import tables
from vertique_workflow.models import WorkflowInstance

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("schema", [None, "workflow_data"], ids=["unqualified", "named-schema"])
def test_fresh_migration_gives_exactly_the_expected_schema(scratch_database, schema):
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database) as conn:
        described = describe(conn, schema or "public")
        leftovers = workflow_objects_in(conn, "public") if schema else []
        helper = conn.execute(
            "SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proname = '_pgtrigger_should_ignore'"
        ).fetchall()

    assert described["tables"].keys() == EXPECTED["tables"].keys()
    for table, expected in EXPECTED["tables"].items():
        assert described["tables"][table] == expected, table
    assert described["functions"] == EXPECTED["functions"]
    assert described["sequences"] == EXPECTED["sequences"]
    if schema:
        assert leftovers == [], "workflow objects left in public"
        assert helper == [(schema,)], "pgtrigger's helper function must follow the placement"


def test_makemigrations_reports_no_changes(scratch_database):
    result = run_manage(
        "makemigrations",
        "--check",
        "--dry-run",
        "vertique_workflow",
        dbname=scratch_database,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No changes detected" in result.stdout


def test_named_schema_makemigrations_reports_no_changes(scratch_database):
    result = run_manage(
        "makemigrations",
        "--check",
        "--dry-run",
        "vertique_workflow",
        dbname=scratch_database,
        schema="workflow_data",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("schema", [None, "workflow_data"], ids=["unqualified", "named-schema"])
def test_empty_database_migrates_down_to_zero_and_up_again(scratch_database, schema):
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    run_manage(
        "migrate", "vertique_workflow", "zero", "-v", "0", dbname=scratch_database, schema=schema
    )
    with connect(scratch_database) as conn:
        assert workflow_objects_in(conn, schema or "public") == []
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database) as conn:
        assert describe(conn, schema or "public")["tables"] == EXPECTED["tables"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "timer_kind"),
    [("TIMER", None), ("SIGNAL", "FIRE"), ("TIMER", "SOON")],
    ids=["timer-without-timer-kind", "signal-with-timer-kind", "timer-with-unknown-kind"],
)
def test_timer_kind_is_set_exactly_when_the_kind_is_timer(kind, timer_kind):
    """The database itself refuses a command whose timer_kind contradicts its kind."""
    commands = tables.sql_names()["commands"]
    instance = WorkflowInstance.objects.create(
        id=uuid.uuid4(), definition_id="d", definition_version=1, plan_hash="h", status="PENDING"
    )
    insert = (
        f"INSERT INTO {commands} (workflow_id, seq, kind, state, timer_kind) "
        "VALUES (%s, %s, %s, 'PENDING', %s)"
    )
    with connection.cursor() as cursor:
        # the consistent rows are admitted: the check refuses only the contradiction
        cursor.execute(insert, [instance.id, 1, "TIMER", "FIRE"])
        cursor.execute(insert, [instance.id, 2, "SIGNAL", None])
        with pytest.raises(IntegrityError) as refused, transaction.atomic():
            cursor.execute(insert, [instance.id, 3, kind, timer_kind])
    cause = refused.value.__cause__
    assert isinstance(cause, psycopg.errors.CheckViolation)
    assert cause.sqlstate == "23514"
    assert cause.diag.constraint_name == "workflow_commands_timer_kind_check"
