"""Bad placement and unknown settings keys fail at startup with a useful message."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from tests.conftest import run_manage
from vertique_workflow import tables
from vertique_workflow.checks import check_settings
from vertique_workflow.conf import workflow_settings


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
    assert len(names) == 11
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
