"""The example project's order fulfilment (parallel branches) through its own pages.

Runs the example project in a subprocess against a scratch database, as
``test_example_expenses`` does, drives it with Django's test client, and
lets ``run_until_idle()`` stand in for the demo's executor.
"""

from __future__ import annotations

import pytest

from tests.test_registry_errors import example_manage

pytestmark = pytest.mark.slow

SCRIPT = r"""
import django.test.utils
from django.contrib.auth.models import Group, User
from django.test import Client

django.test.utils.setup_test_environment()
import vertique_workflow as wf
from orders.models import PaymentCharge, StockReservation
from vertique_workflow.testing import run_until_idle

admin = User.objects.create_superuser("admin", "admin@example.com", "admin")
fran = User.objects.create_user("fran", password="fran")
fran.groups.add(Group.objects.create(name="fraud"))
bob = User.objects.create_user("bob", password="bob")  # in no group
client = Client()
client.force_login(fran)
n = iter(range(1, 100))


def key():
    return f"00000000-0000-4000-8000-{next(n):012d}"


def place(amount, sku="book"):
    page = client.post("/orders/", {"amount": amount, "sku": sku, "quantity": 2,
                                    "idempotency_key": key()})
    assert page.status_code == 302, page.status_code
    run_until_idle()
    return page["Location"].strip("/").split("/")[-1]


def branches(instance):
    return sorted((b.branch_id, b.status, b.current_step) for b in wf.branches(instance))


def check(label, value):
    print(label, value)


# small order: fraud clears at once, stock reserved, payment waits for its signal
small = place(50)
check("small_branches", branches(small))
page = client.get(f"/orders/{small}/").content.decode()
check("branches_shown", 'id="branches"' in page and "await_payment" in page
      and f"/orders/{small}/pay/" in page)
# a payment form without a reference is a form error, not a 500
check("pay_empty", client.post(f"/orders/{small}/pay/", {"reference": "",
                                                          "idempotency_key": key()}).status_code)
form = {"reference": "PAY-1", "idempotency_key": key()}
check("pay_posts", (client.post(f"/orders/{small}/pay/", form).status_code,
                    client.post(f"/orders/{small}/pay/", form).status_code))
run_until_idle()
view = wf.get(small)
check("joined", (view.status, view.current_step, view.state["payment_reference"],
                 view.state["reserved"], view.state["fraud"]))
check("reserved", StockReservation.objects.filter(instance_id=small).count())
charged = PaymentCharge.objects.get()
check("charged", (charged.reference, charged.amount, charged.status,
                  view.state["charge_id"] == str(charged.pk)))
page = client.get(f"/orders/{small}/").content.decode()
check("ship_form", f"/orders/{small}/ship/" in page)
client.post(f"/orders/{small}/ship/", {"tracking": "TRACK-1", "idempotency_key": key()})
run_until_idle()
view = wf.get(small)
check("shipped", (view.status, view.state.get("tracking")))
entries = wf.history_of(small)
events = {e["outcome"] for e in entries} | {e["event_type"] for e in entries}
check("history", sorted(e for e in events if e and e.startswith(("BRANCH", "FORK", "JOIN"))
                        or e in {"FORKED", "ARRIVED", "JOINED"}))

# large order: a fraud-review task for the group "fraud"
large = place(5000)
task = wf.tasks(candidate_groups=["fraud"], status="OPEN").items[0]
check("task_for_large", (str(task.instance_id) == large, task.name))
bob_client = Client()
bob_client.force_login(bob)
refused = bob_client.post(f"/orders/{large}/tasks/{task.id}/clear/", {"idempotency_key": key()})
check("bob_refused", (refused.status_code, wf.get_task(task.id).status))
page = client.get(f"/orders/{large}/").content.decode()
check("review_forms", f"/tasks/{task.id}/clear/" in page and f"/tasks/{task.id}/block/" in page)
client.post(f"/orders/{large}/pay/", {"reference": "PAY-2", "idempotency_key": key()})
run_until_idle()
check("waits_for_review", (wf.get(large).status, branches(large)))
check("clear", client.post(f"/orders/{large}/tasks/{task.id}/clear/",
                           {"idempotency_key": key()}).status_code)
run_until_idle()
view = wf.get(large)
check("cleared", (view.status, view.current_step, view.state["reviewed_by"]))

# blocked by the fraud review: the join's on_failed cancels the order
blocked = place(5000)
task = wf.tasks(candidate_groups=["fraud"], status="OPEN").items[0]
client.post(f"/orders/{blocked}/tasks/{task.id}/block/", {"idempotency_key": key()})
run_until_idle()
view = wf.get(blocked)
check("blocked", (view.status, view.error_type, view.state.get("refunded"),
                  StockReservation.objects.filter(instance_id=blocked).count()))

# payment declined (a signal to the payment branch): the order is cancelled
declined = place(50)
wf.signal(declined, "payment_declined", None, dedup_key="declined", branch=("split", "payment"))
run_until_idle()
view = wf.get(declined)
check("declined", (view.status, view.error_type, view.state.get("refunded"),
                   StockReservation.objects.filter(instance_id=declined).count(),
                   branches(declined)))

# the provider is busy on the first attempt for amounts ending in 7: the relay retries
busy = place(77)
client.post(f"/orders/{busy}/pay/", {"reference": "PAY-77", "idempotency_key": key()})
run_until_idle()
view = wf.get(busy)
check("busy_retried", (view.current_step, PaymentCharge.objects.get(reference="PAY-77").amount,
                       [(c["state"], c["attempts"]) for c in
                        __import__("vertique_workflow.store.outbox", fromlist=["x"])
                        .for_instance(busy)]))

# a refused charge takes the charge step's failure path: the order is cancelled
refused_charge = place(50)
client.post(f"/orders/{refused_charge}/pay/", {"reference": "DECLINE-1", "idempotency_key": key()})
run_until_idle()
view = wf.get(refused_charge)
check("charge_refused", (view.status, view.error_type, view.state.get("charge_error", "")[:15]))

# charged, then undeliverable: the shipping child fails, the order is cancelled and the
# charge refunded by its compensation (COMPENSATING -> COMPENSATED)
lost = place(60)
client.post(f"/orders/{lost}/pay/", {"reference": "PAY-60", "idempotency_key": key()})
run_until_idle()
[shipping] = wf.children(lost)
wf.signal(shipping.id, "undeliverable", None, dedup_key="lost")
run_until_idle()
view = wf.get(lost)
check("compensated", (view.status, view.error_type, view.state.get("refunded"),
                      PaymentCharge.objects.get(reference="PAY-60").status))

# out of stock: refused before the fork
sold_out = place(50, sku="none-left")
view = wf.get(sold_out)
check("sold_out", (view.status, view.error_type))
"""

EXPECTED = {
    "small_branches": "[('fraud', 'COMPLETED', 'joined'), ('payment', 'WAITING', 'await_payment'), ('stock', 'COMPLETED', 'joined')]",  # noqa: E501
    "branches_shown": "True",
    "pay_empty": "200",
    "pay_posts": "(302, 302)",
    "joined": "('WAITING', 'shipping', 'PAY-1', True, 'cleared')",
    "reserved": "1",
    "charged": "('PAY-1', 50, 'CHARGED', True)",
    "busy_retried": "('shipping', 77, [('DELIVERED', 2)])",
    "charge_refused": "('FAILED', 'CANCELLED', 'PAYMENT_REFUSED')",
    "compensated": "('COMPENSATED', 'CANCELLED', True, 'REFUNDED')",
    "ship_form": "True",
    "shipped": "('COMPLETED', 'TRACK-1')",
    "history": "['ARRIVED', 'BRANCH_DECISION', 'FORKED', 'JOINED']",
    "task_for_large": "(True, 'Review order for fraud')",
    "bob_refused": "(403, 'OPEN')",
    "review_forms": "True",
    "waits_for_review": "('WAITING', [('fraud', 'WAITING', 'fraud_review'), ('payment', 'COMPLETED', 'joined'), ('stock', 'COMPLETED', 'joined')])",  # noqa: E501
    "clear": "302",
    "cleared": "('WAITING', 'shipping', 'fran')",
    "blocked": "('FAILED', 'CANCELLED', True, 0)",
    "declined": "('FAILED', 'CANCELLED', True, 0, [('fraud', 'COMPLETED', 'joined'), ('payment', 'FAILED', 'declined'), ('stock', 'COMPLETED', 'joined')])",  # noqa: E501
    "sold_out": "('FAILED', 'OUT_OF_STOCK')",
}


def test_the_example_order_runs_its_branches_fraud_review_and_shipping(scratch_database):
    migrated = example_manage("migrate", "--no-input", "-v", "0", dbname=scratch_database)
    assert migrated.returncode == 0, migrated.stderr
    run = example_manage("shell", "-v", "0", "-c", SCRIPT, dbname=scratch_database)
    assert run.returncode == 0, run.stderr + run.stdout
    seen = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    assert seen == EXPECTED
