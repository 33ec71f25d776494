"""The migrated schema, in both placements, as PostgreSQL itself reports it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from tests.conftest import connect, run_manage
from tests.expected_schema import EXPECTED
from tests.schema_introspection import describe, workflow_objects_in
from vertique_workflow import tables
from vertique_workflow.models import CommandKind, CommandState, TimerKind, WorkflowInstance

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
    assert described["domains"] == EXPECTED["domains"]
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


# What the three checks of workflow_commands judge: each admitted value, a wrong
# case, an empty string, an unknown word, and NULL where the column admits it.
STATE_VALUES = [*CommandState.values, "pending", "", "PAUSED"]
KIND_VALUES = [*CommandKind.values, "timer", "", "JOB"]
TIMER_KIND_VALUES = [*TimerKind.values, None, "fire", "", "SOON"]
# the state check is independent of the other two: every state with a consistent
# kind, then every kind with every timer kind under an admitted state
JUDGED = [(state, "START", None) for state in STATE_VALUES] + [
    ("PENDING", kind, timer_kind) for kind in KIND_VALUES for timer_kind in TIMER_KIND_VALUES
]


def insert_instance(conn: psycopg.Connection, schema: str | None) -> uuid.UUID:
    """A PENDING instance to hang commands on (deleting it deletes them)."""
    instance = uuid.uuid4()
    conn.execute(
        f"INSERT INTO {tables.sql_names(schema)['instances']} (id, definition_id, "
        "definition_version, plan_hash, status) VALUES (%s, 'd', 1, 'h', 'PENDING')",
        [instance],
    )
    return instance


def command_check_verdicts(conn: psycopg.Connection, schema: str | None) -> dict[tuple, str]:
    """Each (state, kind, timer_kind): "ok" or the name of the check that refused it."""
    names = tables.sql_names(schema)
    instance = insert_instance(conn, schema)
    verdicts = {}
    for seq, (state, kind, timer_kind) in enumerate(JUDGED, start=1):
        try:
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {names['commands']} (workflow_id, seq, kind, state, "
                    "timer_kind) VALUES (%s, %s, %s, %s, %s)",
                    [instance, seq, kind, state, timer_kind],
                )
            verdicts[(state, kind, timer_kind)] = "ok"
        except psycopg.errors.CheckViolation as refused:
            verdicts[(state, kind, timer_kind)] = refused.diag.constraint_name
    conn.execute(f"DELETE FROM {names['instances']} WHERE id = %s", [instance])
    return verdicts


@pytest.mark.parametrize("schema", [None, "workflow_data"], ids=["unqualified", "named-schema"])
def test_0006_to_0010_tune_the_command_log_and_reverse(scratch_database, schema):
    """0006 respells the checks of workflow_commands as constants, 0009 the timer check
    as one comparison and 0010 each check as a call of a function that holds the admitted
    values: same verdicts, same names; reversing them restores Django's rendering of the
    model's conditions exactly and drops 0010's functions. 0007 sets the command log's
    analyze threshold and reverses to the server's defaults. 0008 removes the statistics of
    the command's state, collected before it, keeps ANALYZE from collecting them again, and
    reverses to the default statistics target. 0009 turns off deduplication in the
    availability index and reverses to PostgreSQL's default."""
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database) as conn:
        as_migrated = command_check_verdicts(conn, schema)
        assert availability_index_options(conn, schema) == {"deduplicate_items=off"}
        # 0007: the command log is analyzed after 200 changed rows (docs/performance.md)
        assert command_log_options(conn, schema) == {
            "autovacuum_analyze_scale_factor=0",
            "autovacuum_analyze_threshold=200",
        }
        assert state_statistics_target(conn, schema) == 0
        fresh_trigger_comments = trigger_comments(conn, schema)
        assert len(fresh_trigger_comments) == 1  # django-pgtrigger's hash of the notify trigger
    run_manage(
        "migrate", "vertique_workflow", "0005", "-v", "0", dbname=scratch_database, schema=schema
    )
    with connect(scratch_database) as conn:
        as_django_renders = command_check_verdicts(conn, schema)
        assert command_log_options(conn, schema) == set()  # 0007 reversed
        assert state_statistics_target(conn, schema) in (-1, None)  # 0008 reversed (17+: NULL)
        assert availability_index_options(conn, schema) == set()  # 0009 reversed
        reversed_functions = describe(conn, schema or "public")["functions"]
        reversed_checks = {
            name: definition
            for name, definition in describe(conn, schema or "public")["tables"][
                "workflow_commands"
            ]["constraints"].items()
            if name.endswith("_check")
        }
    assert as_migrated == as_django_renders
    assert set(as_migrated.values()) == {
        "ok",
        "workflow_commands_state_check",
        "workflow_commands_kind_check",
        "workflow_commands_timer_kind_check",
    }
    admitted = {row for row, verdict in as_migrated.items() if verdict == "ok"}
    assert admitted == {
        (state, kind, timer_kind)
        for state, kind, timer_kind in JUDGED
        if state in CommandState.values
        and kind in CommandKind.values
        and (timer_kind in TimerKind.values if kind == "TIMER" else timer_kind is None)
    }
    assert reversed_checks == DJANGO_RENDERED_CHECKS
    assert reversed_functions == ["pgtrigger_workflow_commands_notify_fa6db"]  # 0010 reversed
    with connect(scratch_database) as conn:
        # an installation whose command log was analyzed before 0008
        assert len(analyzed_state_statistics(conn, schema)) == 1
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database) as conn:
        assert state_statistics(conn, schema) == []
        assert state_statistics_target(conn, schema) == 0
        assert analyzed_state_statistics(conn, schema) == []  # ANALYZE collects none again
        # the notify trigger was installed again exactly (definition, comment)
        assert describe(conn, schema or "public")["tables"] == EXPECTED["tables"]
        assert trigger_comments(conn, schema) == fresh_trigger_comments


# Django's rendering of the model's conditions, as 0003 created them.
DJANGO_RENDERED_CHECKS = {
    "workflow_commands_kind_check": (
        "CHECK (((kind)::text = ANY ((ARRAY['START'::character varying, "
        "'SIGNAL'::character varying, 'COMPLETION'::character varying, "
        "'RETRY'::character varying, 'MIGRATION'::character varying, "
        "'TIMER'::character varying])::text[])))"
    ),
    "workflow_commands_state_check": (
        "CHECK (((state)::text = ANY ((ARRAY['PENDING'::character varying, "
        "'DEFERRED'::character varying, 'CLAIMED'::character varying, "
        "'PARKED'::character varying, 'DEAD'::character varying, "
        "'COMPLETE'::character varying, 'REJECTED'::character varying, "
        "'STALE'::character varying, 'FAILED'::character varying, "
        "'SUPERSEDED'::character varying, 'CANCELLED'::character varying])::text[])))"
    ),
    "workflow_commands_timer_kind_check": (
        "CHECK (((((kind)::text = 'TIMER'::text) AND (timer_kind IS NOT NULL) AND "
        "((timer_kind)::text = ANY ((ARRAY['FIRE'::character varying, "
        "'TIMEOUT'::character varying, 'DUE'::character varying, "
        "'REMINDER'::character varying])::text[]))) OR "
        "((NOT ((kind)::text = 'TIMER'::text)) AND (timer_kind IS NULL))))"
    ),
}


@pytest.mark.parametrize("schema", [None, "workflow_data"], ids=["unqualified", "named-schema"])
def test_0014_gives_state_and_kind_their_checks_as_domains_and_reverses(scratch_database, schema):
    """0014 makes the command's state and kind domains that hold their checks: the same
    verdicts under the same names, on an insert and on an update (what a claim and a
    settlement run), commands written before it kept, 0008's and 0009's settings kept;
    reversing it restores 0010's checks and functions and drops the domains."""
    names = tables.sql_names(schema)
    run_manage(
        "migrate", "vertique_workflow", "0013", "-v", "0", dbname=scratch_database, schema=schema
    )
    with connect(scratch_database, autocommit=True) as conn:
        verdicts_at_0013 = command_check_verdicts(conn, schema)
        at_0013 = describe(conn, schema or "public")
        instance = insert_instance(conn, schema)
        conn.execute(
            f"INSERT INTO {names['commands']} (workflow_id, seq, kind, state) "
            "VALUES (%s, 1, 'SIGNAL', 'PENDING')",
            [instance],
        )
    assert at_0013["domains"] == {}
    assert (
        at_0013["tables"]["workflow_commands"]["constraints"]["workflow_commands_state_check"]
        == "CHECK (workflow_command_state_admitted((state)::text))"
    )

    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database, autocommit=True) as conn:
        assert command_check_verdicts(conn, schema) == verdicts_at_0013
        kept = f"SELECT kind, state FROM {names['commands']} WHERE workflow_id = %s"
        assert conn.execute(kept, [instance]).fetchall() == [("SIGNAL", "PENDING")]
        update = f"UPDATE {names['commands']} SET state = %s WHERE workflow_id = %s"
        with pytest.raises(psycopg.errors.CheckViolation) as refused, conn.transaction():
            conn.execute(update, ["SETTLED", instance])
        assert refused.value.diag.constraint_name == "workflow_commands_state_check"
        conn.execute(update, ["COMPLETE", instance])
        assert conn.execute(kept, [instance]).fetchall() == [("SIGNAL", "COMPLETE")]
        assert state_statistics_target(conn, schema) == 0  # 0008's setting survives the type
        assert availability_index_options(conn, schema) == {"deduplicate_items=off"}  # 0009's
        migrated = describe(conn, schema or "public")
    assert migrated["domains"] == EXPECTED["domains"]
    assert migrated["tables"] == EXPECTED["tables"]

    verdicts, reversed_ = migrate_and_judge(scratch_database, schema, "0013")
    assert verdicts == verdicts_at_0013
    with connect(scratch_database) as conn:
        assert conn.execute(kept, [instance]).fetchall() == [("SIGNAL", "COMPLETE")]
    assert reversed_["domains"] == {}
    assert reversed_["functions"] == at_0013["functions"]
    for part in ("columns", "constraints", "triggers"):
        assert (
            reversed_["tables"]["workflow_commands"][part]
            == at_0013["tables"]["workflow_commands"][part]
        ), part
    # the partial indexes keep their names, columns and options; PostgreSQL prints
    # their predicates as it parsed them again when the column's type changed
    assert (
        reversed_["tables"]["workflow_commands"]["indexes"].keys()
        == at_0013["tables"]["workflow_commands"]["indexes"].keys()
    )


@pytest.mark.parametrize("schema", [None, "workflow_data"], ids=["unqualified", "named-schema"])
def test_0015_checks_the_timer_kind_only_when_a_write_names_its_columns(scratch_database, schema):
    """0015 turns the timer-kind check into a BEFORE trigger of the same name: the same
    verdicts and error, also for an update that sets kind or timer_kind; an update that
    names neither (a claim, a settlement) does not run it; reversing restores the check."""
    names = tables.sql_names(schema)
    guard = tables.qualified_object("workflow_commands_timer_kind_check", schema)
    run_manage(
        "migrate", "vertique_workflow", "0014", "-v", "0", dbname=scratch_database, schema=schema
    )
    with connect(scratch_database, autocommit=True) as conn:
        verdicts_at_0014 = command_check_verdicts(conn, schema)
    run_manage("migrate", "-v", "0", dbname=scratch_database, schema=schema)
    with connect(scratch_database, autocommit=True) as conn:
        assert command_check_verdicts(conn, schema) == verdicts_at_0014
        instance = insert_instance(conn, schema)
        conn.execute(
            f"INSERT INTO {names['commands']} (workflow_id, seq, kind, state, timer_kind) "
            "VALUES (%s, 1, 'TIMER', 'PENDING', 'FIRE')",
            [instance],
        )
        set_timer_kind = f"UPDATE {names['commands']} SET timer_kind = %s WHERE workflow_id = %s"
        with pytest.raises(psycopg.errors.CheckViolation) as refused, conn.transaction():
            conn.execute(set_timer_kind, [None, instance])
        assert refused.value.diag.constraint_name == "workflow_commands_timer_kind_check"
        assert refused.value.diag.table_name == tables.COMMANDS
        assert refused.value.diag.schema_name == (schema or "public")
        assert str(refused.value).startswith(
            f'new row for relation "{tables.COMMANDS}" violates check constraint '
            '"workflow_commands_timer_kind_check"'
        )
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            conn.execute(
                f"UPDATE {names['commands']} SET kind = 'SIGNAL' WHERE workflow_id = %s",
                [instance],
            )
        # which writes run the guard: counted by PostgreSQL in this transaction
        with conn.transaction():
            conn.execute("SET LOCAL track_functions = 'pl'")
            conn.execute(
                f"UPDATE {names['commands']} SET state = 'CLAIMED' WHERE workflow_id = %s",
                [instance],
            )
            after_state = guard_calls(conn, guard)
            conn.execute(set_timer_kind, ["TIMEOUT", instance])
            after_timer_kind = guard_calls(conn, guard)
        assert (after_state, after_timer_kind) == (0, 1)
        rules = describe(conn, schema or "public")
    assert (
        "workflow_commands_timer_kind_check"
        not in rules["tables"]["workflow_commands"]["constraints"]
    )
    assert rules["tables"] == EXPECTED["tables"]
    assert rules["functions"] == EXPECTED["functions"]

    verdicts, reversed_ = migrate_and_judge(scratch_database, schema, "0014")
    assert verdicts == verdicts_at_0014
    commands = reversed_["tables"]["workflow_commands"]
    assert commands["constraints"]["workflow_commands_timer_kind_check"] == (
        "CHECK (workflow_command_timer_kind_admitted((kind)::text, (timer_kind)::text))"
    )
    assert list(commands["triggers"]) == ["pgtrigger_workflow_commands_notify_fa6db"]
    assert "workflow_commands_timer_kind_check" not in reversed_["functions"]


def migrate_and_judge(
    dbname: str, schema: str | None, target: str
) -> tuple[dict[tuple, str], dict[str, Any]]:
    """Migrate the app to ``target``; the command checks' verdicts and the schema there."""
    run_manage("migrate", "vertique_workflow", target, "-v", "0", dbname=dbname, schema=schema)
    with connect(dbname, autocommit=True) as conn:
        return command_check_verdicts(conn, schema), describe(conn, schema or "public")


def guard_calls(conn: psycopg.Connection, guard: str) -> int:
    """Calls of the timer-kind guard in the current transaction (track_functions = 'pl')."""
    row = conn.execute(
        "SELECT calls FROM pg_stat_xact_user_functions WHERE funcid = %s::regproc", [guard]
    ).fetchone()
    return row[0] if row else 0


def state_statistics_target(conn: psycopg.Connection, schema: str | None) -> int | None:
    return conn.execute(
        "SELECT attstattarget FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attname = 'state'",
        [tables.sql_names(schema)["commands"]],
    ).fetchone()[0]


def state_statistics(conn: psycopg.Connection, schema: str | None) -> list[tuple]:
    return conn.execute(
        "SELECT most_common_vals::text FROM pg_stats WHERE schemaname = %s "
        "AND tablename = %s AND attname = 'state'",
        [schema or "public", tables.COMMANDS],
    ).fetchall()


def analyzed_state_statistics(conn: psycopg.Connection, schema: str | None) -> list[tuple]:
    """The state's statistics (its most common values) after ANALYZE of three commands."""
    names = tables.sql_names(schema)
    instance = insert_instance(conn, schema)
    conn.execute(
        f"INSERT INTO {names['commands']} (workflow_id, seq, kind, state) VALUES "
        "(%(wf)s, 1, 'START', 'COMPLETE'), (%(wf)s, 2, 'SIGNAL', 'COMPLETE'), "
        "(%(wf)s, 3, 'SIGNAL', 'PENDING')",
        {"wf": instance},
    )
    conn.execute(f"ANALYZE {names['commands']}")
    statistics = state_statistics(conn, schema)
    conn.execute(f"DELETE FROM {names['instances']} WHERE id = %s", [instance])
    return statistics


def trigger_comments(conn: psycopg.Connection, schema: str | None) -> list[tuple]:
    return conn.execute(
        "SELECT tgname, obj_description(oid, 'pg_trigger') FROM pg_trigger "
        "WHERE tgrelid = %s::regclass AND NOT tgisinternal AND tgname LIKE 'pgtrigger%%'",
        [tables.sql_names(schema)["commands"]],
    ).fetchall()


def availability_index_options(conn: psycopg.Connection, schema: str | None) -> set[str]:
    return relation_options(conn, schema, "wf_cmd_active_avail_idx")


def command_log_options(conn: psycopg.Connection, schema: str | None) -> set[str]:
    return relation_options(conn, schema, tables.COMMANDS)


def relation_options(conn: psycopg.Connection, schema: str | None, name: str) -> set[str]:
    row = conn.execute(
        "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = %s",
        [name, schema or "public"],
    ).fetchone()
    return set(row[0] or [])
