"""The demo workflow: expense approval.

vertique_workflow imports a ``workflows.py`` module of every installed app at
startup (the way the admin discovers ``admin.py``) and registers the
``Workflow`` subclasses found there.

Version 2 (new expenses) -- a manager task with a due date and reminders, an
escalation, and a receipt with a timeout::

    validate -> route --(amount < 100)--> pay -> done
                      \\--(otherwise)--> manager_review (task: manager, group "finance";
                                         reminders after 1d and 36h, due after 2d)
                            --approve--> receipt (wait 7d for the "receipt" signal)
                                           --receipt--> pay -> done
                                           \\-7d, none-> receipt_missing (fails, RECEIPT_MISSING)
                            --reject (reason)--> rejected (fails, REJECTED)
                            --due after 2d--> escalate -> director_review (task: group "directors")
                                                  --approve--> receipt ...
                                                  --reject---> rejected

Version 1 (kept for instances started on it) waits for an "approve" or
"reject" signal instead of a task::

    validate -> route --(amount < 100)--> pay -> done
                      \\--(otherwise)--> approval --approve--> pay -> done
                                                  \\-reject--> rejected (fails, REJECTED)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vertique_workflow.definitions import (
    StepContext,
    Workflow,
    action,
    decision,
    decision_to,
    end,
    fail,
    task,
    wait,
)
from vertique_workflow.exceptions import NonRetryable

from .models import BankOutage, Payment

APPROVAL_LIMIT = 100  # amounts below this are paid without an approval

BY = {
    "type": "object",
    "required": ["by"],
    "properties": {"by": {"type": "string", "minLength": 1}},
    "additionalProperties": False,
}


# version 2: the payloads of the task decisions and of the receipt signal are
# merged into the state (the default merge), so each of their keys is a field
APPROVE = {
    "type": "object",
    "required": ["approved_by"],
    "properties": {"approved_by": {"type": "string", "minLength": 1, "maxLength": 255}},
    "additionalProperties": False,
}
REJECT = {
    "type": "object",
    "required": ["reason"],
    "properties": {
        "reason": {"type": "string", "minLength": 1, "maxLength": 500},
        "rejected_by": {"type": "string", "minLength": 1, "maxLength": 255},
    },
    "additionalProperties": False,
}
RECEIPT = {
    "type": "object",
    "required": ["receipt_url"],
    "properties": {"receipt_url": {"type": "string", "minLength": 1, "maxLength": 500}},
    "additionalProperties": False,
}


@dataclass
class Expense:
    """The state of both versions (one state type per definition id).

    Fields after ``paid`` are version 2's; they have defaults, so version 1
    instances (whose stored state lacks them) still load.
    """

    amount: int
    description: str
    submitted_by: str = "anonymous"
    approved_by: str | None = None
    paid: bool = False
    manager: str = "admin"  # who the manager task goes to (demo: the admin user)
    reason: str | None = None  # a rejection's reason
    rejected_by: str | None = None
    escalated: bool = False  # the manager task passed its due date
    receipt_url: str | None = None


class ExpenseApproval(Workflow[Expense]):
    """Small expenses are paid at once; others wait for an "approve" or "reject" signal."""

    id, version, contract = "expense-approval", 1, "expenses.approval"
    signals = {"approve": BY, "reject": BY}
    start_schema = {
        "type": "object",
        "required": ["amount", "description"],
        "properties": {
            "amount": {"type": "integer", "minimum": 0},
            "description": {"type": "string", "minLength": 1, "maxLength": 200},
            "submitted_by": {"type": "string"},
        },
        "additionalProperties": False,
    }

    @action(start=True, next="route")
    def validate(self, state: Expense, ctx: StepContext) -> Expense:
        if not state.description.strip():
            raise NonRetryable("DESCRIPTION_MISSING", "an expense needs a description")
        return dataclasses.replace(state, description=state.description.strip())

    @decision(targets=["pay", "approval"])
    def route(self, state: Expense) -> str:
        return "pay" if state.amount < APPROVAL_LIMIT else "approval"

    approval = wait(
        "approve", "reject", on={"approve": "pay", "reject": "rejected"}, apply="record"
    )

    def record(self, state: Expense, name: str, payload: Any, ctx: StepContext) -> Expense:
        """Note who approved; a rejection changes nothing (the fail step records it)."""
        if name == "approve":
            return dataclasses.replace(state, approved_by=payload["by"])
        return state

    @action(next="done")
    def pay(self, state: Expense, ctx: StepContext) -> Expense:
        # same transaction as the step: a retried segment never pays twice
        Payment.objects.get_or_create(
            instance_id=ctx.instance_id,
            defaults={
                "amount": state.amount,
                "description": state.description,
                "paid_to": state.submitted_by,
                "approved_by": state.approved_by or "",
            },
        )
        return dataclasses.replace(state, paid=True)

    done = end()
    rejected = fail(reason="REJECTED")


class ExpenseApprovalV2(Workflow[Expense]):
    """Version 2: a manager task (due in 2 days, reminders), escalation, a receipt.

    A new version rather than a change of version 1, whose instances wait at
    its ``approval`` step (docs/changing-workflows.md): the highest version
    is the current one, so new expenses start here.
    """

    id, version, contract = "expense-approval", 2, "expenses.approval"
    signals = {"receipt": RECEIPT}
    start_schema = {
        "type": "object",
        "required": ["amount", "description"],
        "properties": {
            "amount": {"type": "integer", "minimum": 0},
            "description": {"type": "string", "minLength": 1, "maxLength": 200},
            "submitted_by": {"type": "string"},
            "manager": {"type": "string", "minLength": 1, "maxLength": 255},
        },
        "additionalProperties": False,
    }

    @action(start=True, next="route")
    def validate(self, state: Expense, ctx: StepContext) -> Expense:
        if not state.description.strip():
            raise NonRetryable("DESCRIPTION_MISSING", "an expense needs a description")
        return dataclasses.replace(state, description=state.description.strip())

    @decision(targets=["pay", "manager_review"])
    def route(self, state: Expense) -> str:
        return "pay" if state.amount < APPROVAL_LIMIT else "manager_review"

    def manager_of(self, state: Expense) -> str:
        return state.manager

    manager_review = task(
        title="Approve expense",
        assignee=manager_of,
        candidate_groups=["finance"],
        decisions={
            "approve": decision_to("receipt", schema=APPROVE),
            "reject": decision_to("rejected", schema=REJECT),
        },
        due="2d",
        on_due="escalate",
        reminders=["1d", "36h"],
    )

    @action(next="director_review")
    def escalate(self, state: Expense, ctx: StepContext) -> Expense:
        # the manager task is closed by now (its DUE timer cancelled it)
        return dataclasses.replace(state, escalated=True)

    director_review = task(
        title="Approve escalated expense",
        candidate_groups=["directors"],
        decisions={
            "approve": decision_to("receipt", schema=APPROVE),
            "reject": decision_to("rejected", schema=REJECT),
        },
    )

    receipt = wait("receipt", next="pay", timeout="7d", on_timeout="receipt_missing")

    @action(next="done")
    def pay(self, state: Expense, ctx: StepContext) -> Expense:
        # the demo's repairable failure: a retryable error while an outage names
        # the payee (the command is dead-lettered; delete the outage, then retry)
        if BankOutage.objects.filter(payee=state.submitted_by).exists():
            raise ConnectionError(f"the bank refuses payments to {state.submitted_by}")
        # same transaction as the step: a retried segment never pays twice
        Payment.objects.get_or_create(
            instance_id=ctx.instance_id,
            defaults={
                "amount": state.amount,
                "description": state.description,
                "paid_to": state.submitted_by,
                "approved_by": state.approved_by or "",
            },
        )
        return dataclasses.replace(state, paid=True)

    done = end()
    rejected = fail(reason="REJECTED")
    receipt_missing = fail(reason="RECEIPT_MISSING")
