"""A pipeline's Sync is sent by libpq's function without the interpreter lock (pipeline_sync.py)."""

from __future__ import annotations

import ctypes
import sys

import psycopg
import pytest
from django.db import connection
from psycopg import pq

from vertique_workflow.store import db, pipeline_sync

pytestmark = pytest.mark.django_db(transaction=True)


def other_connection() -> psycopg.Connection:
    return psycopg.connect(autocommit=True, **db.connect_kwargs(connection.settings_dict))


def test_the_sync_is_libpqs_function_called_without_the_interpreter_lock():
    compiled = pq.__impl__ in ("c", "binary") and sys.platform != "win32"
    assert pipeline_sync.releases_gil() is compiled
    if compiled:
        function = pipeline_sync._LIBPQ_SYNC
        # a CDLL function, not a PyDLL one: ctypes releases the lock around the call
        assert not function._flags_ & ctypes._FUNCFLAG_PYTHONAPI
        assert function.__name__ == "PQpipelineSync"


@pytest.mark.parametrize("libpq_call", [True, False], ids=["libpq via ctypes", "psycopg's call"])
def test_the_sync_ends_psycopgs_pipeline_and_its_results_come_back(monkeypatch, libpq_call):
    """The call acts on the very connection psycopg holds: its libpq sees the Sync."""
    if not libpq_call:
        monkeypatch.setattr(pipeline_sync, "_LIBPQ_SYNC", None)
    with other_connection() as conn:
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(b"SELECT 41 + 1", None)
        pgconn.send_query_params(b"SELECT pg_backend_pid()", None)
        pipeline_sync.sync(pgconn)
        statuses, values = [], []
        while True:
            while pgconn.is_busy():
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue
            statuses.append(result.status)
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                break
            values.append(result.get_value(0, 0))
        pgconn.exit_pipeline_mode()
        assert statuses == [pq.ExecStatus.TUPLES_OK] * 2 + [pq.ExecStatus.PIPELINE_SYNC]
        assert values == [b"42", str(conn.info.backend_pid).encode()]
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


@pytest.mark.parametrize("libpq_call", [True, False], ids=["libpq via ctypes", "psycopg's call"])
def test_a_sync_outside_a_pipeline_or_on_a_closed_connection_raises(monkeypatch, libpq_call):
    if not libpq_call:
        monkeypatch.setattr(pipeline_sync, "_LIBPQ_SYNC", None)
    with other_connection() as conn:
        with pytest.raises(psycopg.OperationalError):
            pipeline_sync.sync(conn.pgconn)  # not in pipeline mode
        assert conn.execute("SELECT 2").fetchone() == (2,)
    with pytest.raises(psycopg.OperationalError):
        pipeline_sync.sync(conn.pgconn)  # closed


def test_the_segments_pipelines_run_with_either_call(monkeypatch):
    """``db.send_pipeline`` (the direct path) gives the same results with psycopg's call."""
    outcomes = []
    for replaced in (False, True):
        if replaced:
            monkeypatch.setattr(pipeline_sync, "_LIBPQ_SYNC", None)
        results: list = []
        db.send_pipeline([("SELECT %s::int + 1", (1,)), ("SELECT %s::text", ("b",))], results)
        assert all(isinstance(r, db.PipelineResult) for r in results)  # the direct path ran it
        outcomes.append([r.fetchone() for r in results])
    assert outcomes == [[(2,), ("b",)], [(2,), ("b",)]]
