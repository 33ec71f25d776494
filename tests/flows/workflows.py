"""Workflows of the test app, found by ``autodiscover``; callbacks are pure (no database)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vertique_workflow.definitions import StepContext, Workflow, action, decision, end, fail, wait


class OrderFlow(Workflow[dict]):
    """Reserve, skip payment for free orders, otherwise wait for "paid", ship."""

    id, version, contract = "order", 1, "order.v1"
    signals = {
        "paid": {
            "type": "object",
            "required": ["amount_paid"],
            "properties": {"amount_paid": {"type": "number"}},
        }
    }

    @action(start=True, next="route")
    def reserve(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "reserved": True}

    @decision(targets=["await_payment", "done"])
    def route(self, state: dict[str, Any], ctx: StepContext) -> str:
        return "done" if state.get("amount", 0) == 0 else "await_payment"

    await_payment = wait("paid", next="ship")

    @action(next="done")
    def ship(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "shipped": True}

    done = end()


@dataclass
class Expense:
    amount: int
    approved: bool = False
    approved_by: str | None = None


class ExpenseApproval(Workflow[Expense]):
    """Small expenses pass; others wait for an approve or reject signal."""

    id, version, contract = "expense-approval", 1, "expense.approval"
    signals = {
        "approve": {"type": "object", "properties": {"by": {"type": "string"}}},
        "reject": None,
    }
    start_schema = {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer", "minimum": 0}},
    }

    @action(start=True, next="route")
    def validate(self, state: Expense, ctx: StepContext) -> Expense:
        return state

    @decision(targets=["approval", "done"])
    def route(self, state: Expense) -> str:
        return "done" if state.amount < 100 else "approval"

    approval = wait(
        "approve", "reject", on={"approve": "done", "reject": "rejected"}, apply="record"
    )
    done = end()
    rejected = fail(reason="REJECTED")

    def record(self, state: Expense, name: str, payload: Any, ctx: StepContext) -> Expense:
        """Fold an approval in; a rejection changes nothing (the fail step records it)."""
        if name != "approve":
            return state
        return dataclasses.replace(state, approved=True, approved_by=(payload or {}).get("by"))
