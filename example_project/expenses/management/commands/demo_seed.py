"""``manage.py demo_seed``: instances in every status, so the demo's admin shows a living system.

``./scripts/demo`` runs it before it starts the executor. Each instance is
started with a fixed idempotency key and each follow-up (a decision, a
signal) carries a fixed key too, and runs only while the instance still
stands where the follow-up applies: running it again adds nothing, and a
run cut short is finished by the next one. Between the steps the recorded
commands run on this process (``run_until_idle``, exactly as the executor
runs them), so the seed is complete when the command returns.

What it leaves (it prints each one's status):

- expenses (version 2): one paid (COMPLETED); one waiting on the manager's
  task; one approved and waiting for its receipt (a signal, with a 7-day
  timer); one rejected (FAILED, REJECTED); one approved for "mallory",
  whose payment the bank refuses (see ``BankOutage``): its receipt signal
  is dead-lettered and the instance waits with a dead letter;
- an expense on version 1, waiting for the "approve" / "reject" signals;
- orders: one in its branches (payment waiting for its signal, stock
  reserved, a fraud-review task); one paid and shipping (its child workflow
  waits for "shipped" or its 2-hour timer); one sold out (FAILED).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction

import vertique_workflow as wf
from expenses.models import BankOutage
from vertique_workflow.testing import run_until_idle

PREFIX = "demo-seed:"
SEEDER = wf.Actor.user("demo-seed")


def _start(key: str, definition_id: str, payload: dict[str, Any], **kwargs: Any) -> wf.InstanceRef:
    with transaction.atomic():
        return wf.start(
            definition_id, payload, idempotency_key=PREFIX + key, actor=SEEDER, **kwargs
        )


def _open_task(instance_id: Any) -> wf.TaskView | None:
    for item in wf.tasks(status="OPEN", limit=100).items:
        if item.instance_id == instance_id:
            return item
    return None


def _decide(ref: wf.InstanceRef, key: str, decision: str, payload: dict[str, Any]) -> None:
    """Complete the instance's open task, when it still has one."""
    task = _open_task(ref.id)
    if task is None:
        return
    with transaction.atomic():
        wf.complete_task(
            task.id,
            decision,
            payload,
            idempotency_key=PREFIX + key,
            actor=wf.Actor.user("admin"),
        )
    run_until_idle()


def _signal_at(ref: wf.InstanceRef, step: str, name: str, payload: Any, **kwargs: Any) -> None:
    """Send ``name`` when the instance waits at ``step`` (dedup: once per instance)."""
    view = wf.get(ref.id)
    if view.status != "WAITING" or view.current_step != step:
        return
    with transaction.atomic():
        wf.signal(
            ref.id,
            name,
            payload,
            dedup_key=f"{PREFIX}{ref.id}:{name}",
            actor=wf.Actor.user("admin"),
            **kwargs,
        )
    run_until_idle()


def _expense(key: str, amount: int, description: str, submitted_by: str = "ann", **extra: Any):
    payload = {"amount": amount, "description": description, "submitted_by": submitted_by}
    ref = _start(key, "expense-approval", {**payload, **extra.pop("payload", {})}, **extra)
    run_until_idle()
    return ref


def seed_paid() -> wf.InstanceRef:
    return _expense("expense-paid", 42, "Train ticket Zürich to Genève")


def seed_task() -> wf.InstanceRef:
    return _expense(
        "expense-task", 480, "Conference fee (Düsseldorf)", payload={"manager": "admin"}
    )


def seed_receipt() -> wf.InstanceRef:
    ref = _expense("expense-receipt", 250, "Hotel, two nights")
    _decide(ref, "expense-receipt:approve", "approve", {"approved_by": "admin"})
    return ref


def seed_rejected() -> wf.InstanceRef:
    ref = _expense("expense-rejected", 900, "New espresso machine")
    _decide(
        ref,
        "expense-rejected:reject",
        "reject",
        {"reason": "not a business expense", "rejected_by": "admin"},
    )
    return ref


def seed_dead_letter() -> wf.InstanceRef:
    ref = _expense("expense-dead-letter", 300, "Taxi to the airport", submitted_by="mallory")
    if ref.created:
        # only when this instance is seeded the first time: an operator who deleted
        # the outage (to repair the payment) does not get it back from a later run
        BankOutage.objects.get_or_create(
            payee="mallory",
            defaults={"note": "demo: delete this outage, then retry the expense's instance"},
        )
    _decide(ref, "expense-dead-letter:approve", "approve", {"approved_by": "admin"})
    _signal_at(ref, "receipt", "receipt", {"receipt_url": "https://example.com/taxi.pdf"})
    return ref


def seed_version_1() -> wf.InstanceRef:
    return _expense("expense-v1", 150, "Printer toner", version=1)


def _order(key: str, amount: int, sku: str, quantity: int = 1) -> wf.InstanceRef:
    ref = _start(key, "order-fulfilment", {"amount": amount, "sku": sku, "quantity": quantity})
    run_until_idle()
    return ref


def seed_order_branches() -> wf.InstanceRef:
    return _order("order-branches", 1500, "espresso-machine")


def seed_order_shipping() -> wf.InstanceRef:
    ref = _order("order-shipping", 120, "coffee-beans", 3)
    branch = next((b for b in wf.branches(ref.id) if b.branch_id == "payment"), None)
    if branch is not None and branch.status == "WAITING":
        with transaction.atomic():
            wf.signal(
                ref.id,
                "payment_confirmed",
                {"reference": "PAY-1001"},
                dedup_key=f"{PREFIX}{ref.id}:payment_confirmed",
                branch=("split", "payment"),
                actor=wf.Actor.user("admin"),
            )
        run_until_idle()
    return ref


def seed_order_sold_out() -> wf.InstanceRef:
    return _order("order-sold-out", 80, "none-left")


SCENARIOS: list[tuple[str, Callable[[], wf.InstanceRef]]] = [
    ("expense paid", seed_paid),
    ("expense waiting on the manager's task", seed_task),
    ("expense waiting for its receipt (signal, 7-day timer)", seed_receipt),
    ("expense rejected", seed_rejected),
    ("expense with a dead letter (the bank refuses mallory)", seed_dead_letter),
    ("expense on version 1 waiting for approve / reject", seed_version_1),
    ("order in its branches (payment, stock, fraud review)", seed_order_branches),
    ("order shipping (child waits for 'shipped' or 2h)", seed_order_shipping),
    ("order sold out", seed_order_sold_out),
]


class Command(BaseCommand):
    help = "Seed the demo with instances in every status (idempotent: run it again freely)."

    def handle(self, *args: Any, **options: Any) -> None:
        # the dead letter's ConnectionError is expected: its traceback (logged by
        # the executor's code on every attempt) only with -v 2
        executor_log = logging.getLogger("vertique_workflow.executor")
        quiet = options["verbosity"] < 2 and not executor_log.disabled
        executor_log.disabled = quiet or executor_log.disabled
        try:
            refs = [(label, seed()) for label, seed in SCENARIOS]
        finally:
            if quiet:
                executor_log.disabled = False
        for label, ref in refs:
            view = wf.get(ref.id)
            where = f" at {view.current_step}" if view.current_step else ""
            dead = f", {view.dead_commands} dead letter(s)" if view.dead_commands else ""
            self.stdout.write(f"{label}: {view.status}{where}{dead} ({ref.id})")
