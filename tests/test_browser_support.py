"""The browser tests' machinery: without a Chromium they are skipped with the reason.

Runs pytest on tests/test_browser_admin.py in a subprocess (against a scratch
database) with a ``VERTIQUE_CHROMIUM`` that names no browser, and with
``VERTIQUE_TEST_BROWSER=0`` (./scripts/test's PostgreSQL 15 stage): every
browser test is reported as skipped, the reason in the summary, none passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import find_chromium
from tests.conftest import ROOT, database_url

pytestmark = pytest.mark.slow


def run_browser_tests(dbname: str, **env: str) -> subprocess.CompletedProcess[str]:
    # the stage's own switches (the PostgreSQL 15 stage sets VERTIQUE_TEST_BROWSER=0)
    # must not decide which reason the inner run gives: only ``env`` does
    environment = dict(os.environ, DATABASE_URL=database_url(dbname))
    for name in (
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGDATABASE",
        "PYTEST_ADDOPTS",
        "VERTIQUE_TEST_BROWSER",
        "VERTIQUE_CHROMIUM",
    ):
        environment.pop(name, None)
    environment.update(env)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "tests/test_browser_admin.py",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_chromium_that_is_not_there_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("VERTIQUE_CHROMIUM", str(tmp_path / "no-such-chromium"))
    assert find_chromium() is None  # a named browser that is missing: no fallback to another


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"VERTIQUE_CHROMIUM": "/nonexistent/chromium"}, "no Chromium found"),
        ({"VERTIQUE_TEST_BROWSER": "0"}, "VERTIQUE_TEST_BROWSER=0"),
    ],
    ids=["no-chromium", "other-stage"],
)
def test_without_a_browser_the_browser_tests_are_skipped_with_the_reason(
    scratch_database: str, env: dict[str, str], reason: str
):
    run = run_browser_tests(scratch_database, **env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert " passed" not in output, output
    summary = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert summary and all(reason in line for line in summary), output
