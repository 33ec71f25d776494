"""Spawn the real ``manage.py workflow_executor`` against the test database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

from tests.conftest import ROOT, connect, database_url


def process_environment(settings: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a Django process on the test database (tests.settings, ``settings``)."""
    return dict(
        os.environ,
        DATABASE_URL=database_url(connection.settings_dict["NAME"]),
        DJANGO_SETTINGS_MODULE="tests.settings",
        VERTIQUE_TEST_SETTINGS_JSON=json.dumps(settings or {}),
        PYTHONPATH=str(ROOT),
    )


class ExecutorProcess:
    """One executor subprocess; its log goes to a temporary file."""

    def __init__(
        self, *args: str, settings: dict[str, Any] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="executor-", suffix=".log")[1])
        full_env = process_environment(settings)
        full_env.update(env or {})
        self._log = self.log_path.open("w")
        self._final_log: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "workflow_executor", "--stats-interval", "1", *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def log(self) -> str:
        if self._final_log is not None:
            return self._final_log
        return self.log_path.read_text()

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log.close()

    def wait_running(self, timeout: float = 120) -> None:
        """Wait until the executor logs its counters: its run loop (and SIGTERM handler) is up.

        A test with two executors may see the other one drain everything while
        this one is still importing Django; a SIGTERM then would kill it before
        its handler exists (exit -15) instead of stopping it.
        """
        wait_until(
            lambda: "completed=" in self.log,
            timeout=timeout,
            what="the executor's first counters line",
            process=self,
        )

    def stop(self) -> int:
        if self.process.poll() is None:
            self.send(signal.SIGTERM)
        return self.wait(60)

    def __enter__(self) -> ExecutorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._log.close()
        self._final_log = self.log_path.read_text()
        self.log_path.unlink(missing_ok=True)


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 60,
    what: str = "condition",
    process: ExecutorProcess | None = None,
) -> Any:
    """Wait for an observable state of the database or the process (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.process.poll() is not None:
            raise AssertionError(
                f"executor exited ({process.process.returncode}) while "
                f"waiting for {what}:\n{process.log}"
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{process.log}" if process else ""))


def server_query(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A query on a connection of its own (sees committed state only)."""
    with connect(connection.settings_dict["NAME"], autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()
