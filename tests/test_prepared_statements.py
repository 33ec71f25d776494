"""The executor's hot statements are prepared once per connection (PREPARED_STATEMENTS)."""

from __future__ import annotations

import datetime
import zoneinfo

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


# -- timestamps: psycopg's C loader where it loads what Django's loads --------------------

TIMESTAMPS = (
    "2026-12-03 13:45:12.123456+00",
    "1999-12-31 23:59:59.5-05:30",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
)
READ_TIMESTAMPS = "SELECT " + ", ".join(f"%s::timestamptz AS t{i}" for i in range(5))


def test_the_prepared_helpers_read_timestamps_as_djangos_cursor_does():
    from vertique_workflow.store import db

    values = [*TIMESTAMPS, None]
    fast = db.fetchone_prepared(READ_TIMESTAMPS, values)
    with connection.cursor() as cursor:
        cursor.execute(READ_TIMESTAMPS, values)
        django_row = cursor.fetchone()
    assert fast == django_row
    assert fast[-1] is None
    assert all(value.tzinfo is datetime.UTC for value in fast[:-1])
    # and the reused cursor loads them with psycopg's own loader, not Django's Python one
    raw = connection.connection
    text = psycopg.pq.Format.TEXT
    assert raw._vertique_cursor.adapters.get_loader(db.TIMESTAMPTZ_OID, text) is (
        psycopg.adapters.get_loader(db.TIMESTAMPTZ_OID, text)
    )
    assert raw.adapters.get_loader(db.TIMESTAMPTZ_OID, text) is not (
        psycopg.adapters.get_loader(db.TIMESTAMPTZ_OID, text)
    )  # Django's connection keeps its own


@pytest.mark.parametrize("case", ["django timezone", "session timezone"])
def test_a_timezone_other_than_utc_keeps_djangos_loader(case):
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    from vertique_workflow.store import db

    text = psycopg.pq.Format.TEXT
    with psycopg.connect(**db.connect_kwargs(connection.settings_dict)) as raw:
        register_tzloader(
            zoneinfo.ZoneInfo("Europe/Paris") if case == "django timezone" else datetime.UTC, raw
        )
        if case == "session timezone":
            raw.execute("SET TIME ZONE 'Europe/Paris'")
        django_loader = raw.adapters.get_loader(db.TIMESTAMPTZ_OID, text)
        cursor = raw.cursor()
        db._load_timestamps_in_c(cursor, raw)
        assert cursor.adapters.get_loader(db.TIMESTAMPTZ_OID, text) is django_loader
