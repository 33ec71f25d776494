"""The demo (./scripts/demo): its seeded instances and the fixes of what a newcomer's walk found.

As in ``test_example_expenses``, the example project runs in a subprocess
against a scratch database and is driven with Django's test client;
``run_until_idle()`` stands in for the demo's executor. The port helper of
``scripts/demo`` (``scripts/demo_port.py``) is run as the script runs it.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_registry_errors import example_manage

pytestmark = pytest.mark.slow

SEED_CHECK = r"""
import collections
import vertique_workflow as wf
from expenses.models import BankOutage
from vertique_workflow.models import WorkflowCommand, WorkflowInstance

rows = WorkflowInstance.objects.order_by("created_at")
print("instances", rows.count())
print("statuses", sorted(collections.Counter(r.status for r in rows).items()))
steps = sorted(f"{r.definition_id}@{r.current_step_id}:{r.status}" for r in rows)
print("steps", steps)
print("dead", WorkflowCommand.objects.filter(state="DEAD").count())
print("open_tasks", sorted(t.name for t in wf.tasks(status="OPEN", limit=50).items))
print("branches", sorted(f"{b.branch_id}:{b.status}" for r in rows
                          if r.definition_id == "order-fulfilment" and r.current_step_id == "split"
                          for b in wf.branches(r.id)))
print("outages", list(BankOutage.objects.values_list("payee", flat=True)))
"""

SEEDED = {
    "instances": "10",
    "statuses": "[('COMPLETED', 1), ('FAILED', 2), ('WAITING', 7)]",
    "steps": str(
        sorted(
            [
                "expense-approval@done:COMPLETED",
                "expense-approval@manager_review:WAITING",
                "expense-approval@receipt:WAITING",  # waits for its receipt (7-day timer)
                "expense-approval@receipt:WAITING",  # the dead-lettered receipt signal
                "expense-approval@rejected:FAILED",
                "expense-approval@approval:WAITING",  # version 1: signals
                "order-fulfilment@split:WAITING",  # in branches
                "order-fulfilment@shipping:WAITING",  # its child ships
                "order-shipping@dispatch:WAITING",  # "shipped" or the 2h timer
                "order-fulfilment@sold_out:FAILED",
            ]
        )
    ),
    "dead": "1",
    "open_tasks": "['Approve expense', 'Review order for fraud']",
    "branches": "['fraud:WAITING', 'payment:WAITING', 'stock:COMPLETED']",
    "outages": "['mallory']",
}


def lines(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines() if " " in line)


def test_the_demo_seed_leaves_instances_in_every_status_and_a_second_run_adds_nothing(
    scratch_database,
):
    migrated = example_manage("migrate", "--no-input", "-v", "0", dbname=scratch_database)
    assert migrated.returncode == 0, migrated.stderr
    first = example_manage("demo_seed", dbname=scratch_database)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "with a dead letter (the bank refuses mallory): WAITING at receipt, 1 dead" in (
        first.stdout
    )
    seen = example_manage("shell", "-v", "0", "-c", SEED_CHECK, dbname=scratch_database)
    assert seen.returncode == 0, seen.stderr
    assert lines(seen.stdout) == SEEDED

    # the operator repairs the dead letter: no outage comes back from a second run
    repaired = example_manage(
        "shell",
        "-v",
        "0",
        "-c",
        "from expenses.models import BankOutage; BankOutage.objects.all().delete()",
        dbname=scratch_database,
    )
    assert repaired.returncode == 0, repaired.stderr
    second = example_manage("demo_seed", dbname=scratch_database)
    assert second.returncode == 0, second.stderr + second.stdout
    again = example_manage("shell", "-v", "0", "-c", SEED_CHECK, dbname=scratch_database)
    assert lines(again.stdout) == {**SEEDED, "outages": "[]"}


PAGES = r"""
import re
import django.test.utils
from django.contrib.auth.models import Group, User
from django.test import Client

django.test.utils.setup_test_environment()
import vertique_workflow as wf
from vertique_workflow.models import WorkflowCommand
from vertique_workflow.testing import run_until_idle

admin = User.objects.create_superuser("admin", "admin@example.com", "admin")
ann = User.objects.create_user("ann", password="ann")  # submits; in finance, a decider
ann.groups.add(Group.objects.create(name="finance"))
bob = User.objects.create_user("bob", password="bob")  # in no group

def client(user=None):
    c = Client()
    if user is not None:
        c.force_login(user)
    return c

def check(label, value):
    print(label, value)

def commands(instance):
    return WorkflowCommand.objects.filter(workflow_id=instance).count()

# non-ASCII text is shown as such, and a long name wraps (the CSS)
long_name = "Ü" * 3 + "x" * 300
ref = wf.start("expense-approval", {"amount": 500, "description": "Zürich Düsseldorf",
               "submitted_by": long_name}, idempotency_key="k-ascii", version=1)
run_until_idle()
page = client(admin).get(f"/expenses/{ref.id}/").content.decode()
check("no_escapes", ("Zürich Düsseldorf" in page, "\\u00fc" in page, "\\u00dc" in page))
index = client(admin).get("/").content.decode()
check("index_no_escapes", ("Zürich Düsseldorf" in index, "\\u00fc" in index))
check("wraps", "overflow-wrap: anywhere" in page)

# version 1: anonymous is sent to log in, nothing recorded
v1 = wf.start("expense-approval", {"amount": 500, "description": "desk",
              "submitted_by": "ann"}, idempotency_key="k-v1", version=1).id
run_until_idle()
before = commands(v1)
anon = client().post(f"/expenses/{v1}/approve/", {"next": "detail"})
check("anon_v1", (anon.status_code, "/admin/login/" in anon["Location"], commands(v1) - before))
page = client().get(f"/expenses/{v1}/").content.decode()
check("anon_no_buttons", (f"/expenses/{v1}/approve/" in page, "to decide" in page))

# the submitter may not decide their own expense (ann is in finance)
refused = client(ann).post(f"/expenses/{v1}/approve/", {"next": "detail"}, follow=True)
mine = "You submitted this expense"
check("submitter_v1",
      (refused.status_code, mine in refused.content.decode(), commands(v1) - before))
page = client(ann).get(f"/expenses/{v1}/").content.decode()
check("submitter_no_buttons", f"/expenses/{v1}/approve/" in page)
# bob is no decider
refused = client(bob).post(f"/expenses/{v1}/approve/", {"next": "detail"}, follow=True)
check("bob_v1", ("Only the group" in refused.content.decode(), commands(v1) - before))

# a decision by the admin: the page says processing, shows no buttons and reloads itself
decided = client(admin).post(f"/expenses/{v1}/approve/", {"next": "detail"})
check("admin_v1", (decided.status_code, commands(v1) - before))
page = client(admin).get(f"/expenses/{v1}/").content.decode()
check("processing", ('id="processing"' in page, f"/expenses/{v1}/approve/" in page,
                     'http-equiv="refresh"' in page, wf.get(v1).status))
index = client(admin).get("/").content.decode()
check("index_processing", ('id="processing"' in index, 'http-equiv="refresh"' in index))
run_until_idle()
page = client(admin).get(f"/expenses/{v1}/").content.decode()
check("after_executor", ('id="processing"' in page, 'http-equiv="refresh"' in page,
                         wf.get(v1).status))

# version 2: the submitter is refused the task, although the task rule lets them (finance)
v2 = wf.start("expense-approval", {"amount": 500, "description": "chair", "submitted_by": "ann",
              "manager": "admin"}, idempotency_key="k-v2").id
run_until_idle()
task = wf.tasks(status="OPEN", assignee="admin").items[0]
page = client(ann).get(f"/expenses/{v2}/").content.decode()
check("v2_submitter_form", (f"/tasks/{task.id}/approve/" in page, mine in page,
                            wf.can_complete(ann, task)))
refused = client(ann).post(f"/expenses/{v2}/tasks/{task.id}/approve/",
                           {"idempotency_key": "00000000-0000-4000-8000-0000000000a1"})
check("v2_submitter_post", (refused.status_code, wf.get_task(task.id).status))
done = client(admin).post(f"/expenses/{v2}/tasks/{task.id}/approve/",
                          {"idempotency_key": "00000000-0000-4000-8000-0000000000a2"})
page = client(admin).get(f"/expenses/{v2}/").content.decode()
check("v2_processing", (done.status_code, 'id="processing"' in page, "Send receipt" in page,
                        'http-equiv="refresh"' in page))
run_until_idle()
page = client(admin).get(f"/expenses/{v2}/").content.decode()
check("v2_after", ('id="processing"' in page, "Send receipt" in page, wf.get(v2).current_step))
"""

PAGES_EXPECTED = {
    "no_escapes": "(True, False, False)",
    "index_no_escapes": "(True, False)",
    "wraps": "True",
    "anon_v1": "(302, True, 0)",
    "anon_no_buttons": "(False, True)",
    "submitter_v1": "(200, True, 0)",
    "submitter_no_buttons": "False",
    "bob_v1": "(True, 0)",
    "admin_v1": "(302, 1)",
    "processing": "(True, False, True, 'WAITING')",
    "index_processing": "(True, True)",
    "after_executor": "(False, False, 'COMPLETED')",
    "v2_submitter_form": "(False, True, True)",
    "v2_submitter_post": "(403, 'OPEN')",
    "v2_processing": "(302, True, False, True)",
    "v2_after": "(False, True, 'receipt')",
}


def test_the_demo_pages_show_text_as_is_refresh_while_processing_and_refuse_the_submitter(
    scratch_database,
):
    migrated = example_manage("migrate", "--no-input", "-v", "0", dbname=scratch_database)
    assert migrated.returncode == 0, migrated.stderr
    run = example_manage("shell", "-v", "0", "-c", PAGES, dbname=scratch_database)
    assert run.returncode == 0, run.stderr + run.stdout
    assert lines(run.stdout) == PAGES_EXPECTED


def demo_port(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo_port.py"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_busy_demo_port_is_named_with_the_hint_to_set_demo_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        busy = demo_port("check", str(port))
    assert busy.returncode == 3
    assert f"port {port} busy" in busy.stderr and "set DEMO_PORT" in busy.stderr
    free = demo_port("check", str(port))  # closed now
    assert (free.returncode, free.stderr) == (0, "")


def test_the_banner_waits_until_the_port_accepts_and_gives_up_when_the_server_died():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        try:
            assert demo_port("wait", str(port), str(sleeper.pid)).returncode == 0
        finally:
            sleeper.communicate(b"")
    # nothing listens on the port and the server process has ended: no banner
    assert demo_port("wait", str(port), str(sleeper.pid)).returncode == 1
