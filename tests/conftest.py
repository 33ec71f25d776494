"""Shared fixtures: every test runs against the real PostgreSQL of the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from vertique_workflow.tables import NOTIFY_CHANNEL

ROOT = Path(__file__).resolve().parent.parent


def server_params(dbname: str) -> dict[str, Any]:
    db = settings.DATABASES["default"]
    params = {
        "host": db["HOST"],
        "port": db["PORT"],
        "user": db["USER"],
        "password": db["PASSWORD"],
        "dbname": dbname,
    }
    return {k: v for k, v in params.items() if v not in ("", None)}


def connect(dbname: str, **kwargs: Any) -> psycopg.Connection:
    return psycopg.connect(**server_params(dbname), **kwargs)


def database_url(dbname: str) -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{dbname}"


def run_manage(
    *args: str,
    dbname: str,
    schema: str | None = None,
    check: bool = True,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``django-admin <args>`` with the test settings against another database.

    ``cwd`` (default: the repository root) is where the process runs; elsewhere,
    put the root on ``PYTHONPATH`` through ``extra_env``.
    """
    env = dict(
        os.environ,
        DATABASE_URL=database_url(dbname),
        DJANGO_SETTINGS_MODULE="tests.settings",
        VERTIQUE_TEST_SCHEMA=schema or "",
    )
    env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"django-admin {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture
def scratch_database(django_db_blocker: Any) -> Iterator[str]:
    """A new, empty database on the test server, dropped afterwards."""
    name = f"vw_scratch_{uuid.uuid4().hex[:10]}"
    with django_db_blocker.unblock(), connect("postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with django_db_blocker.unblock(), connect("postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def table_counts() -> dict[str, int]:
    """Row count of every workflow table (to prove a refusal wrote nothing)."""
    from django.db import connection

    from vertique_workflow import tables

    counts = {}
    with connection.cursor() as cursor:
        for key, name in tables.sql_names().items():
            cursor.execute(f"SELECT count(*) FROM {name}")
            counts[key] = cursor.fetchone()[0]
    return counts


def history_events(instance_id: Any) -> list[str]:
    """The event types of an instance's history, in sequence order."""
    from vertique_workflow.models import WorkflowHistory

    return list(
        WorkflowHistory.objects.filter(workflow_id=instance_id)
        .order_by("sequence")
        .values_list("event_type", flat=True)
    )


@pytest.fixture
def holder(django_db_blocker: Any) -> Iterator[psycopg.Connection]:
    """Another session with a transaction of its own, to hold locks (execution, definition id)
    while the test acts; rolled back and closed when the test ends."""
    from django.db import connection

    with django_db_blocker.unblock():
        conn = connect(connection.settings_dict["NAME"])
    yield conn
    conn.rollback()
    conn.close()


@pytest.fixture
def reset_gates() -> Iterator[None]:
    from tests.flows.workflows import Billing, Blocking, Gate, Gifts, Probes

    def reset() -> None:
        Gifts.mode, Gifts.calls = "ok", 0
        Gate.fail_times, Gate.non_retryable, Gate.calls = 0, False, 0
        Billing.fail_times, Billing.non_retryable, Billing.calls = 0, False, 0
        Probes.lock_timeouts, Probes.iterations, Probes.slow = [], 0, ""

    reset()
    Blocking.entered.clear()
    Blocking.release.clear()
    yield
    reset()
    Blocking.release.set()


@pytest.fixture(autouse=True)
def _forget_remembered_selections() -> Iterator[None]:
    """Each test's first start of an id reads its selection (store.pipelined_start).

    A selection remembered by an earlier test is only ever a digest the
    guarded record compares (never trusted), but a test that counts a
    start's round trips or traces its statements needs to know which path
    it takes.
    """
    from vertique_workflow.store import pipelined_start

    pipelined_start.forget_all()
    yield


@pytest.fixture(autouse=True)
def _flush_placed_workflow_tables(
    request: pytest.FixtureRequest, django_db_blocker: Any
) -> Iterator[None]:
    """Django's flush misses tables outside the search_path (a SCHEMA placement)."""
    yield
    from vertique_workflow import tables

    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or bool(
        marker and marker.kwargs.get("transaction")
    )
    if tables.SCHEMA and transactional:
        from vertique_workflow.testing import flush_workflow_tables

        with django_db_blocker.unblock():
            flush_workflow_tables()


SENTINEL = "sentinel"


@pytest.fixture
def listener(transactional_db: Any) -> Iterator[psycopg.Connection]:
    """A LISTEN connection on the commands channel (see :func:`received_until_sentinel`)."""
    from django.db import connection

    conn = connect(connection.settings_dict["NAME"], autocommit=True)
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    yield conn
    conn.close()


def received_until_sentinel(listener: psycopg.Connection) -> list[str]:
    """Every payload delivered before a sentinel notify committed now.

    Notifications arrive in commit order, so whatever was committed before the
    sentinel has arrived once the sentinel has: no waiting on a clock.
    """
    from django.db import connection

    with connect(connection.settings_dict["NAME"], autocommit=True) as other:
        other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, SENTINEL))
    payloads = []
    for notify in listener.notifies(timeout=30):
        if notify.payload == SENTINEL:
            return payloads
        payloads.append(notify.payload)
    raise AssertionError("the sentinel notification never arrived")


def in_threads(*targets: Callable[[], Any], raise_errors: bool = True) -> list[Any]:
    """Run each target on a thread of its own (its own Django connection); their results.

    With ``raise_errors`` the first exception a target raised is raised
    again; otherwise exceptions are returned in the target's place.
    """
    import threading

    from django.db import connections

    results: list[Any] = [None] * len(targets)

    def runner(index: int, target: Callable[[], Any]) -> None:
        try:
            results[index] = target()
        except BaseException as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=runner, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if raise_errors:
        for result in results:
            if isinstance(result, BaseException):
                raise result
    return results


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``VERTIQUE_TEST_BROWSER=0`` skips the browser tests, with that reason.

    ``./scripts/test`` sets it for its PostgreSQL 15 stage: the browser tests
    look at pages, which do not change with the server, and already ran
    against PostgreSQL 18.
    """
    if os.environ.get("VERTIQUE_TEST_BROWSER", "") != "0":
        return
    skip = pytest.mark.skip(
        reason="VERTIQUE_TEST_BROWSER=0: the browser tests run in another stage"
    )
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(skip)
