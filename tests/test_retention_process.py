"""Two real ``manage.py workflow_retention`` processes at once, as two cron nodes would run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from django.db import connection

import vertique_workflow as wf
from tests.conftest import ROOT, database_url
from vertique_workflow import tables
from vertique_workflow.models import WorkflowInstance
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

T = tables.sql_names()


def test_two_retention_processes_split_the_work_and_both_exit_zero():
    ids = [wf.start("order", {"amount": 0}, idempotency_key=f"rp-{i}").id for i in range(120)]
    run_until_idle()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['instances']} SET updated_at = now() - interval '40 days' "
            "WHERE id = ANY(%s::uuid[])",
            [[str(i) for i in ids]],
        )
    env = dict(
        os.environ,
        DATABASE_URL=database_url(connection.settings_dict["NAME"]),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
    )
    command = [
        sys.executable, "-m", "django", "workflow_retention",
        "--archive", "COMPLETED=30d", "--batch", "5",
    ]  # fmt: skip
    processes = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    totals = [int(re.search(r"archived (\d+) COMPLETED", out).group(1)) for out in outputs]
    assert sum(totals) == 120  # every instance archived exactly once between the two
    assert WorkflowInstance.objects.filter(id__in=ids, archived_at__isnull=True).count() == 0
