"""The demo workflow: expense approval.

vertique_workflow imports a ``workflows.py`` module of every installed app at
startup (the way the admin discovers ``admin.py``) and registers the
``Workflow`` subclasses found there.

    validate -> route --(amount < 100)--> pay -> done
                      \\--(otherwise)--> approval --approve--> pay -> done
                                                  \\-reject--> rejected (fails, REJECTED)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vertique_workflow.definitions import StepContext, Workflow, action, decision, end, fail, wait
from vertique_workflow.exceptions import NonRetryable

from .models import Payment

APPROVAL_LIMIT = 100  # amounts below this are paid without an approval

BY = {
    "type": "object",
    "required": ["by"],
    "properties": {"by": {"type": "string", "minLength": 1}},
    "additionalProperties": False,
}


@dataclass
class Expense:
    amount: int
    description: str
    submitted_by: str = "anonymous"
    approved_by: str | None = None
    paid: bool = False


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
