"""The executor's hot statements are prepared once per connection (PREPARED_STATEMENTS)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

import vertique_workflow as wf
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def drain(count: int, prefix: str) -> None:
    for i in range(count):
        wf.start("order", {"amount": 0}, idempotency_key=f"{prefix}-{i}")
    run_until_idle()


def test_the_segment_statements_are_prepared_once_and_reused():
    connection.close()  # a fresh session: nothing prepared yet
    drain(3, "a")
    first = prepared_statements()
    persist = [s for s in first if "WITH inst AS" in s]
    assert len(persist) == 1, first  # prepared once although three segments ran
    drain(3, "b")
    assert sorted(prepared_statements()) == sorted(first)  # reused, not prepared again
    assert all(wf.get(i.id).status == "COMPLETED" for i in wf.instances())


def test_other_server_side_statements_stay_unprepared():
    """Only the statements that ask are prepared: psycopg's own threshold is never reached."""
    connection.close()
    drain(1, "c")
    raw = connection.connection
    with psycopg.Cursor(raw) as cursor:  # server-side binding, as with server_side_binding=True
        for _ in range(10):  # far past psycopg's default threshold of 5
            cursor.execute("SELECT count(*) FROM django_migrations WHERE app = %s", ["x"])
    assert not [s for s in prepared_statements() if "django_migrations" in s]


@override_settings(VERTIQUE_WORKFLOW={"PREPARED_STATEMENTS": False})
def test_prepared_statements_can_be_turned_off():
    connection.close()
    drain(2, "d")
    assert prepared_statements() == []
    assert all(wf.get(i.id).status == "COMPLETED" for i in wf.instances())


def plan_cache_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return cursor.fetchone()[0]


def test_the_prepared_statements_keep_their_generic_plans():
    """With real statistics PostgreSQL would re-plan the claim on every call."""
    connection.close()
    drain(2, "e")
    assert plan_cache_mode() == "force_generic_plan"


@override_settings(VERTIQUE_WORKFLOW={"PREPARED_STATEMENTS": False})
def test_without_prepared_statements_the_session_keeps_its_plan_cache_mode():
    connection.close()
    drain(1, "f")
    assert plan_cache_mode() == "auto"
