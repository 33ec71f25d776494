"""The peers benchmark starts its figures on a server that holds WAL segments ahead.

A fresh server creates, zero-fills and fsyncs each WAL segment when its WAL
first reaches it, with every committer waiting; a running one has recycled
segments ahead of its insert position (docs/performance.md, "WAL segments of a
fresh server"). ``ready_wal`` puts the benchmark's server in the running state.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.peers import (
    WalReady,
    checkpoint,
    checkpoint_line,
    ready_wal,
    wal_ahead,
    wal_line,
    wal_written,
)
from tests.conftest import connect, database_url


def _segment(conn: Any) -> int:
    """The number of the WAL segment being written (timeline left out)."""
    name = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0]
    return int(name[8:], 16)


@pytest.mark.django_db(transaction=True)
def test_ready_wal_switches_through_new_segments_and_leaves_recycled_ones_ahead(
    settings: Any,
) -> None:
    name = settings.DATABASES["default"]["NAME"]
    with connect(name, autocommit=True) as conn:
        before, written = _segment(conn), wal_written(conn)
        ready = ready_wal(database_url(name), 3)
        after = _segment(conn)
        # three switches: at least the rest of the first segment and two whole ones
        assert wal_written(conn) - written >= 2 * 16 * 2**20
        assert ready is not None
        assert ready.created == 3
        assert after >= before + 3  # every switch moved the insert position to a new segment
        assert ready.switch_ms > 0
        # the checkpoint renamed segments the insert position had left behind into
        # segments after it (PostgreSQL keeps at least min_wal_size, 5 segments)
        assert ready.ahead >= 3
        assert wal_ahead(conn) >= 1


@contextlib.contextmanager
def _not_superuser(conn: Any, name: str) -> Iterator[str]:
    """The URL of ``name`` for a session that runs as a role of no privileges."""
    # roles belong to the whole server, not to the test database: a name of its own
    role = f"vw_peers_not_super_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role} NOSUPERUSER")
    try:
        # the session runs as that role from its start (no login of its own needed)
        yield f"{database_url(name)}?options=-c%20role%3D{role}"
    finally:
        conn.execute(f"DROP ROLE {role}")


@pytest.mark.django_db(transaction=True)
def test_a_role_that_may_not_switch_wal_leaves_the_server_as_it_is(settings: Any) -> None:
    name = settings.DATABASES["default"]["NAME"]
    with connect(name, autocommit=True) as conn, _not_superuser(conn, name) as url:
        before = _segment(conn)
        assert ready_wal(url, 3) is None
        assert _segment(conn) == before  # refused at the first switch: nothing written


def test_the_wal_line_names_what_was_prepared_or_that_nothing_was():
    line = wal_line(WalReady(created=64, switch_ms=49.96, ahead=63))
    assert line == (
        "WAL: 64 segments created before the figures (a switch: 50.0 ms, median), "
        "63 ready ahead of the insert position after a checkpoint"
    )
    assert "the server as it is" in wal_line(None)


@pytest.mark.django_db(transaction=True)
def test_checkpoint_has_the_server_checkpoint_now(settings: Any) -> None:
    name = settings.DATABASES["default"]["NAME"]
    with connect(name, autocommit=True) as conn:
        written = conn.execute(
            "SELECT pg_logical_emit_message(false, 'vertique-peers', 'x')"
        ).fetchone()[0]
        assert checkpoint(database_url(name)) is True
        # CHECKPOINT returns when its checkpoint is done and in the control file: its
        # redo point is at the end of the WAL written just before or after it (the count of
        # pg_stat_bgwriter is reported by the checkpointer after it wakes the caller,
        # so it is not read here)
        past = conn.execute(
            "SELECT redo_lsn >= %s::pg_lsn FROM pg_control_checkpoint()", (str(written),)
        ).fetchone()[0]
        assert past is True


@pytest.mark.django_db(transaction=True)
def test_a_role_that_may_not_checkpoint_leaves_it_to_the_server(settings: Any) -> None:
    name = settings.DATABASES["default"]["NAME"]
    with connect(name, autocommit=True) as conn, _not_superuser(conn, name) as url:
        # False: the server refused the CHECKPOINT itself (InsufficientPrivilege)
        assert checkpoint(url) is False


def test_the_checkpoint_line_says_whether_the_run_checkpoints_before_each_scenario():
    assert checkpoint_line(True, True) == (
        "checkpoints: one before every scenario (none starts during a drain)"
    )
    assert "--no-checkpoints" in checkpoint_line(False, False)
    assert "may not checkpoint" in checkpoint_line(True, False)
