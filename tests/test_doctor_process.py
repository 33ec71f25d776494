"""``manage.py workflow_doctor`` as monitoring runs it: exit status 1 on a finding, 0 healthy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connection

import vertique_workflow as wf
from tests.conftest import ROOT, database_url
from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def doctor() -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        DATABASE_URL=database_url(connection.settings_dict["NAME"]),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", "workflow_doctor"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_exit_status_says_whether_something_needs_a_human():
    with connection.cursor() as cursor:
        for name in tables.sql_names().values():
            cursor.execute(f"ANALYZE {name}")
    healthy = doctor()
    assert (healthy.returncode, healthy.stdout) == (0, "healthy: nothing needs a human\n")
    ref = wf.start("order", {"amount": 0}, idempotency_key="monitor")
    WorkflowCommand.objects.filter(workflow_id=ref.id).update(state="COMPLETE")
    sick = doctor()
    assert sick.returncode == 1 and "STRANDED:" in sick.stdout and str(ref.id) in sick.stdout
