"""The example project's expense approval, version 2, through its own pages.

Runs the example project (its settings, urls and templates) in a subprocess
against a scratch database, as ``test_registry_errors`` does, and drives it
with Django's test client; ``run_until_idle()`` stands in for the demo's
executor and ``advance_time`` for the days the timers wait.
"""

from __future__ import annotations

import pytest

from tests.test_registry_errors import example_manage

pytestmark = pytest.mark.slow

SCRIPT = r"""
import re
import django.test.utils
from django.contrib.auth.models import Group, User
from django.test import Client

django.test.utils.setup_test_environment()
import vertique_workflow as wf
from expenses.models import Payment
from vertique_workflow.testing import advance_time, run_until_idle

admin = User.objects.create_superuser("admin", "admin@example.com", "admin")
bob = User.objects.create_user("bob", password="bob")  # in no group, assigned nothing
director = User.objects.create_user("dora", password="dora")
director.groups.add(Group.objects.create(name="directors"))
client = Client()
client.force_login(admin)


def submit(amount, key):
    page = client.post("/", {"amount": amount, "description": "train", "submitted_by": "ann",
                             "manager": "admin", "idempotency_key": key})
    assert page.status_code == 302, page.status_code
    run_until_idle()
    return wf.tasks(assignee="admin", status="OPEN").items


def check(label, value):
    print(label, value)


# small: paid at once, no task
submit(50, "00000000-0000-4000-8000-000000000001")
check("small_paid", Payment.objects.filter(amount=50).exists())

# large: a manager task assigned to admin, due in two days
task = submit(500, "00000000-0000-4000-8000-000000000002")[0]
instance = task.instance_id
check("v2", wf.get(instance).definition_version)
page = client.get(f"/expenses/{instance}/").content.decode()
check("task_shown", "Approve expense" in page and "admin" in page and 'id="open-task"' in page)
check("forms_shown", f"/tasks/{task.id}/approve/" in page and f"/tasks/{task.id}/reject/" in page)

# bob may not decide: no forms, and a forged post is refused without a 500
bob_client = Client()
bob_client.force_login(bob)
page = bob_client.get(f"/expenses/{instance}/").content.decode()
check("bob_no_forms", f"/tasks/{task.id}/approve/" not in page)
refused = bob_client.post(f"/expenses/{instance}/tasks/{task.id}/approve/",
                          {"idempotency_key": "00000000-0000-4000-8000-0000000000b0"})
check("bob_refused", (refused.status_code, wf.get_task(task.id).status))

# a rejection without a reason: the decision's schema refuses it, shown on the form
page = client.post(f"/expenses/{instance}/tasks/{task.id}/reject/",
                   {"reason": "", "idempotency_key": "00000000-0000-4000-8000-0000000000c0"})
reason_errors = re.search(r'<ul class="errorlist"[^>]*>(.*?)</ul>\s*<label for="id_reason"',
                          page.content.decode(), re.S)
check("reject_needs_reason", (page.status_code, reason_errors is not None
                              and "does not match its schema" in reason_errors.group(1),
                              wf.get_task(task.id).status))

# reminders after 1d and 36h keep the task open
advance_time("1d", instance_id=instance)
run_until_idle()
advance_time("12h", instance_id=instance)
run_until_idle()
events = [e["outcome"] for e in wf.history_of(instance)]
check("reminded", (events.count("TASK_REMINDED"), wf.get_task(task.id).status))

# approve (twice with the same form key: one completion)
form = {"idempotency_key": "00000000-0000-4000-8000-0000000000d0"}
first = client.post(f"/expenses/{instance}/tasks/{task.id}/approve/", form)
second = client.post(f"/expenses/{instance}/tasks/{task.id}/approve/", form)
check("approve_posts", (first.status_code, second.status_code, wf.get_task(task.id).status))
run_until_idle()
view = wf.get(instance)
check("after_approve", (view.status, view.current_step, view.state["approved_by"]))
page = client.get(f"/expenses/{instance}/").content.decode()
check("receipt_form", f"/expenses/{instance}/receipt/" in page)

# the receipt: paid
page = client.post(f"/expenses/{instance}/receipt/",
                   {"receipt_url": "https://example.com/r.pdf",
                    "idempotency_key": "00000000-0000-4000-8000-0000000000e0"})
check("receipt_post", page.status_code)
run_until_idle()
view = wf.get(instance)
check("paid", (view.status, view.state["paid"], view.state["receipt_url"],
               Payment.objects.get(instance_id=instance).approved_by))

# escalation: the due date passes, a director task opens for "directors"
task = submit(700, "00000000-0000-4000-8000-000000000003")[0]
escalated = task.instance_id
advance_time("2d", instance_id=escalated)
run_until_idle()
view = wf.get(escalated)
statuses = sorted(t.status for t in wf.tasks(status=None, limit=500).items
                  if t.instance_id == escalated)
check("escalated", (view.current_step, view.state["escalated"], statuses))
mine = Client()
mine.force_login(director)
page = mine.get("/tasks/").content.decode()
check("director_sees_task", "Approve escalated expense" in page)
director_task = wf.tasks(candidate_groups=["directors"], status="OPEN").items[0]
page = mine.post(f"/expenses/{escalated}/tasks/{director_task.id}/reject/",
                 {"reason": "no budget", "idempotency_key": "00000000-0000-4000-8000-0000000000f0"})
check("director_reject", page.status_code)
run_until_idle()
view = wf.get(escalated)
check("rejected", (view.status, view.error_type, view.state["reason"], view.state["rejected_by"]))

# no receipt within 7 days: RECEIPT_MISSING
task = submit(800, "00000000-0000-4000-8000-000000000004")[0]
late = task.instance_id
client.post(f"/expenses/{late}/tasks/{task.id}/approve/",
            {"idempotency_key": "00000000-0000-4000-8000-0000000000a1"})
run_until_idle()
advance_time("7d", instance_id=late)
run_until_idle()
view = wf.get(late)
check("receipt_missing", (view.status, view.error_type))
"""

EXPECTED = {
    "small_paid": "True",
    "v2": "2",
    "task_shown": "True",
    "forms_shown": "True",
    "bob_no_forms": "True",
    "bob_refused": "(403, 'OPEN')",
    "reject_needs_reason": "(200, True, 'OPEN')",
    "reminded": "(2, 'OPEN')",
    "approve_posts": "(302, 302, 'COMPLETING')",
    "after_approve": "('WAITING', 'receipt', 'admin')",
    "receipt_form": "True",
    "receipt_post": "302",
    "paid": "('COMPLETED', True, 'https://example.com/r.pdf', 'admin')",
    "escalated": "('director_review', True, ['CANCELLED', 'OPEN'])",
    "director_sees_task": "True",
    "director_reject": "302",
    "rejected": "('FAILED', 'REJECTED', 'no budget', 'dora')",
    "receipt_missing": "('FAILED', 'RECEIPT_MISSING')",
}


def test_the_example_expense_approval_runs_its_task_reminders_escalation_and_receipt(
    scratch_database,
):
    migrated = example_manage("migrate", "--no-input", "-v", "0", dbname=scratch_database)
    assert migrated.returncode == 0, migrated.stderr
    run = example_manage("shell", "-v", "0", "-c", SCRIPT, dbname=scratch_database)
    assert run.returncode == 0, run.stderr + run.stdout
    seen = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert seen == EXPECTED
