"""Bad placement and unknown settings keys fail at startup with a useful message."""

from __future__ import annotations

import io
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from tests.conftest import run_manage
from vertique_workflow import tables
from vertique_workflow.checks import check_settings
from vertique_workflow.conf import DEFAULTS, INT4_MAX, workflow_settings


@pytest.mark.parametrize(
    "value",
    ['x"; DROP TABLE y; --', "two words", "1starts_with_digit", "a.b", "", "x" * 64, 'q"uote'],
)
def test_invalid_schema_is_refused(value):
    with pytest.raises(ImproperlyConfigured, match="one plain PostgreSQL identifier"):
        tables.validate_schema(value)


@pytest.mark.parametrize("value", ["select", "USER", "table"])
def test_reserved_word_schema_is_refused(value):
    with pytest.raises(ImproperlyConfigured, match="reserved word"):
        tables.validate_schema(value)


def test_pg_prefixed_schema_is_refused():
    with pytest.raises(ImproperlyConfigured, match="pg_"):
        tables.validate_schema("pg_workflows")


def test_non_string_schema_is_refused():
    with pytest.raises(ImproperlyConfigured, match="must be a string"):
        tables.validate_schema(42)


def test_valid_schema_qualifies_every_table():
    names = tables.sql_names("workflow_data")
    assert len(tables.ALL_TABLES) == 11, "the eleven reference tables"
    assert len(names) == 11 + len(tables.SIDE_EFFECT_TABLES)
    assert names["service_outbox"] == '"workflow_data"."workflow_service_outbox"'
    assert names["commands"] == '"workflow_data"."workflow_commands"'
    assert tables.sql_names(None)["instances"] == "workflow_instances"


def test_injection_attempt_stops_django_at_startup_before_any_query(scratch_database):
    result = run_manage(
        "migrate",
        dbname=scratch_database,
        check=False,
        extra_env={"VERTIQUE_TEST_SCHEMA": 'x"; DROP TABLE y; --'},
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "VERTIQUE_WORKFLOW['SCHEMA'] must be one plain PostgreSQL identifier" in result.stderr
    assert "Applying" not in result.stdout


def test_unknown_key_is_a_system_check_error():
    with override_settings(VERTIQUE_WORKFLOW={"LOCK_TIMOUT_MS": 10, "POLL_INTERVAL_MS": 5}):
        errors = check_settings()
        assert workflow_settings.POLL_INTERVAL_MS == 5
    assert [e.id for e in errors] == ["vertique_workflow.E002"]
    assert "'LOCK_TIMOUT_MS'" in errors[0].msg
    assert "LOCK_TIMEOUT_MS" in errors[0].hint


def test_settings_must_be_a_dict():
    with override_settings(VERTIQUE_WORKFLOW=["SCHEMA"]):
        errors = check_settings()
    assert [e.id for e in errors] == ["vertique_workflow.E001"]


def test_unknown_key_stops_manage_commands(scratch_database):
    result = run_manage(
        "check",
        dbname=scratch_database,
        check=False,
        extra_env={"VERTIQUE_TEST_SETTINGS_JSON": json.dumps({"MAX_ATTEMPT": 3})},
    )
    assert result.returncode != 0
    assert "vertique_workflow.E002" in result.stderr
    assert "unknown key 'MAX_ATTEMPT'" in result.stderr
    assert "Did you mean 'MAX_ATTEMPTS'?" in result.stderr


def test_defaults_are_documented_values():
    assert workflow_settings.LOCK_TIMEOUT_MS == 5000
    assert workflow_settings.DATABASE == "default"
    with pytest.raises(AttributeError):
        workflow_settings.NOT_A_SETTING  # noqa: B018


# Every integer setting with values it must refuse: below its minimum, past
# PostgreSQL's integer limit, and of the wrong type (a bool is not an int).
BAD_INTEGERS = [
    ("LOCK_TIMEOUT_MS", 0, "is 0", "from 1 to 2147483647"),
    ("LOCK_TIMEOUT_MS", True, "is a bool, not an int", "from 1 to 2147483647"),
    ("LOCK_TIMEOUT_MS", "5000", "is a str, not an int", "from 1 to 2147483647"),
    ("LOCK_TIMEOUT_MS", 5000.0, "is a float, not an int", "from 1 to 2147483647"),
    ("LOCK_TIMEOUT_MS", None, "is None, not an int", "from 1 to 2147483647"),
    ("LOCK_TIMEOUT_MS", 2**31, "is 2147483648", "from 1 to 2147483647"),
    ("DEFINITION_LOCK_TIMEOUT_MS", 0, "is 0", "from 1 to 2147483647"),
    ("SEGMENT_DEADLINE_MS", 0, "is 0", "from 1 to 2147483647"),
    ("SEGMENT_DEADLINE_MS", 2**31, "is 2147483648", "from 1 to 2147483647"),
    ("POLL_INTERVAL_MS", 0, "is 0", "from 1 to 2147483647"),
    ("LEASE_SECONDS", -1, "is -1", "from 1 to 2147483647"),
    ("MAX_ATTEMPTS", 0, "is 0", "from 1 to 2147483647"),
    ("BACKOFF_BASE_MS", 0, "is 0", "from 1 to 2147483647"),
    ("BACKOFF_MAX_MS", False, "is a bool, not an int", "from 1 to 2147483647"),
    ("STUCK_AFTER_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("OPEN_SIGNALS_CAP", 0, "is 0", "from 1 to 2147483647"),
    ("MAX_PAYLOAD_BYTES", 0, "is 0", "from 1 to 2147483647"),
    ("HISTORY_PATCH_MAX_BYTES", 1, "is 1", "from 2 to 2147483647"),
    ("EXECUTOR_CONCURRENCY", 0, "is 0", "from 1 to 2147483647"),
    ("SHUTDOWN_GRACE_SECONDS", -1, "is -1", "from 0 to 2147483647"),
    ("SHUTDOWN_GRACE_SECONDS", 2.5, "is a float, not an int", "from 0 to 2147483647"),
    ("PUBLICATION_CLAIM_TIMEOUT_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("DOCUMENT_INPUT_LIMIT", 0, "is 0", "from 1 to 2147483647"),
    ("RELAY_BATCH", 0, "is 0", "from 1 to 2147483647"),
    ("RELAY_CONCURRENCY", "2", "is a str, not an int", "from 1 to 2147483647"),
    ("RELAY_LEASE_MARGIN_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("RETENTION_BATCH", 0, "is 0", "from 1 to 2147483647"),
    ("DOCTOR_PARKED_AFTER_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("DOCTOR_DEFERRALS", 0, "is 0", "from 1 to 2147483647"),
    ("DOCTOR_SERVICE_STUCK_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("DOCTOR_NOTIFY_QUEUE_PERCENT", 101, "is 101", "from 1 to 100"),
    ("DOCTOR_STALE_STATS_SECONDS", 0, "is 0", "from 1 to 2147483647"),
    ("RETENTION_PURGE_ARCHIVED_SECONDS", 0, "is 0", "from 1 to 2147483647"),
]


def check_errors(user: dict[str, object]) -> list[str]:
    """What ``manage.py check`` (in-process) reports for these settings."""
    with override_settings(VERTIQUE_WORKFLOW=user):
        try:
            call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
        except SystemCheckError as exc:
            return [line for line in str(exc).splitlines() if "vertique_workflow.E" in line]
    return []


@pytest.mark.parametrize(
    ("key", "value", "problem", "allowed"),
    BAD_INTEGERS,
    ids=[f"{key}={value!r}" for key, value, *_ in BAD_INTEGERS],
)
def test_a_bad_integer_setting_is_a_system_check_error(key, value, problem, allowed):
    errors = check_errors({key: value})
    assert errors == [
        f"?: (vertique_workflow.E004) VERTIQUE_WORKFLOW[{key!r}] {problem}; "
        f"it must be an integer {allowed}."
    ]


def test_every_integer_setting_is_validated_and_tested():
    """A new integer key needs a declared minimum and a refused value above."""
    integer_keys = {key for key, default in DEFAULTS.items() if default.is_integer}
    assert integer_keys == {key for key, *_ in BAD_INTEGERS}
    for key in integer_keys:
        assert DEFAULTS[key].minimum is not None, f"{key} declares no minimum"
        assert DEFAULTS[key].maximum <= INT4_MAX, key


def test_a_zero_lock_timeout_is_explained_as_waiting_forever():
    with override_settings(VERTIQUE_WORKFLOW={"LOCK_TIMEOUT_MS": 0}):
        (error,) = check_settings()
    assert error.id == "vertique_workflow.E004"
    assert "wait forever" in error.hint
    assert "The default is 5000." in error.hint


def test_every_bad_integer_is_reported_at_once():
    errors = check_errors({"LOCK_TIMEOUT_MS": 0, "MAX_ATTEMPTS": "5", "LEASE_SECONDS": True})
    named = {e.split("VERTIQUE_WORKFLOW['")[1].split("'")[0] for e in errors}
    assert len(errors) == 3
    assert named == {"LOCK_TIMEOUT_MS", "LEASE_SECONDS", "MAX_ATTEMPTS"}


def test_the_defaults_and_the_bounds_themselves_pass():
    assert check_errors({}) == []
    assert check_errors({key: default.value for key, default in DEFAULTS.items()}) == []
    edges = {key: default.minimum for key, default in DEFAULTS.items() if default.is_integer}
    assert check_errors(edges) == []
    assert check_errors({key: DEFAULTS[key].maximum for key in edges}) == []


def test_non_integer_settings_keep_their_own_checks():
    assert (
        check_errors(
            {
                "DATABASE": "default",
                "NODE_ID": "node-1",
                "REDACTED_FIELDS": ["card"],
                "DURABLE_CONTEXT": (),
                "RECORDERS": [],
                "EXECUTOR_ENABLED": False,
            }
        )
        == []
    )
    with override_settings(VERTIQUE_WORKFLOW={"SCHEMA": "two words"}):
        assert [e.id for e in check_settings()] == ["vertique_workflow.E003"]
    with override_settings(VERTIQUE_WORKFLOW={"LOCK_TIMOUT_MS": 0}):
        assert [e.id for e in check_settings()] == ["vertique_workflow.E002"]


def test_a_zero_lock_timeout_stops_manage_commands(scratch_database):
    result = run_manage(
        "check",
        dbname=scratch_database,
        check=False,
        extra_env={"VERTIQUE_TEST_SETTINGS_JSON": json.dumps({"LOCK_TIMEOUT_MS": 0})},
    )
    assert result.returncode != 0
    assert "vertique_workflow.E004" in result.stderr
    assert (
        "VERTIQUE_WORKFLOW['LOCK_TIMEOUT_MS'] is 0; it must be an integer from 1" in result.stderr
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([("COMPLETED", 1)], "is a list, not a dict"),
        ({"DONE": 1}, "names an unknown status 'DONE'"),
        ({"COMPLETED": "30d"}, "gives COMPLETED an age that is not a non-negative number"),
        ({"COMPLETED": -1}, "gives COMPLETED an age that is not a non-negative number"),
    ],
)
def test_a_bad_retention_archive_setting_is_a_system_check_error(value, problem):
    errors = check_errors({"RETENTION_ARCHIVE": value})
    assert len(errors) == 1 and "vertique_workflow.E023" in errors[0] and problem in errors[0]


def test_a_good_retention_archive_setting_passes():
    assert check_errors({"RETENTION_ARCHIVE": {"COMPLETED": 2592000, "FAILED": 86400.5}}) == []
