"""Workflows of the test app, found by ``autodiscover``; callbacks are pure (no database)."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any

from vertique_workflow.definitions import (
    Retry,
    StepContext,
    Workflow,
    action,
    call,
    decision,
    end,
    fail,
    fork,
    join,
    task,
    timer,
    wait,
)
from vertique_workflow.definitions.tasks import decision_to


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


# -- flows whose actions touch the database or fail on purpose -------------------------


class Gate:
    """Test switches read by the flows below (set by a test, reset after it)."""

    fail_times = 0
    non_retryable = False
    calls = 0


class ShipmentFlow(Workflow[dict]):
    """An action writes a Shipment with the ORM; then waits for "confirm"; may fail."""

    id, version, contract = "shipment", 1, "shipment.v1"
    signals = {
        "confirm": {"type": "object", "properties": {"by": {"type": "string"}}},
        "note": None,
    }

    @action(start=True, next="confirm_wait")
    def create(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from django.core.exceptions import ImproperlyConfigured

        from tests.flows.models import Shipment
        from vertique_workflow.exceptions import NonRetryable

        Gate.calls += 1
        Shipment.objects.create(order_ref=state.get("ref", "?"), created_by_step=ctx.step_id)
        if Gate.non_retryable:
            raise NonRetryable("SHIPMENT_REFUSED", "shipment refused by the carrier")
        if Gate.fail_times > 0:
            Gate.fail_times -= 1
            raise ImproperlyConfigured("carrier unavailable")
        return {**state, "shipment_created": True}

    confirm_wait = wait("confirm", next="done")
    done = end()


class TwoWaits(Workflow[dict]):
    """Waits for "first", then for "second": a "second" sent early is parked."""

    id, version, contract = "two-waits", 1, "two-waits.v1"
    signals = {"first": None, "second": None, "extra": None}

    @action(start=True, next="wait_first")
    def begin(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "log": [*state.get("log", []), "begin"]}

    wait_first = wait("first", next="after_first")

    @action(next="wait_second")
    def after_first(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "log": [*state.get("log", []), "after_first"]}

    wait_second = wait("second", next="done")
    done = end()


class Blocking:
    """Lets a test hold a segment open inside an action (a real transaction)."""

    import threading

    entered = threading.Event()
    release = threading.Event()
    context_seen: list[Any] = []


class BlockingFlow(Workflow[dict]):
    """The start action blocks until the test releases it; then waits for "go"."""

    id, version, contract = "blocking", 1, "blocking.v1"
    signals = {"go": None}

    @action(start=True, next="wait_go")
    def hold(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        Blocking.entered.set()
        if not Blocking.release.wait(120):
            raise RuntimeError("the test never released the blocking action")
        return {**state, "held": True}

    wait_go = wait("go", next="done")
    done = end()


class ContextFlow(Workflow[dict]):
    """Copies the durable tenant context into the state."""

    id, version, contract = "context-flow", 1, "context-flow.v1"

    @action(start=True, next="done")
    def read_context(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from tests.flows.context import TENANT

        return {**state, "tenant": TENANT.get()}

    done = end()


GATE_LOCK_KEY = 7_340_001


class GatedFlow(Workflow[dict]):
    """Its action writes a Shipment, then waits on a PostgreSQL advisory lock the test holds.

    Works across processes: the executor's segment blocks inside the database
    until the test releases the lock, so a test can kill or signal an
    executor in the middle of a segment.
    """

    id, version, contract = "gated", 1, "gated.v1"

    @action(start=True, next="done")
    def pass_gate(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from django.db import connection

        from tests.flows.models import Shipment

        Shipment.objects.create(order_ref=str(ctx.instance_id), created_by_step=ctx.step_id)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GATE_LOCK_KEY])
        return {**state, "passed": True}

    done = end()


class Billing:
    """Switches of BillingFlow's ``charge`` step (reset by ``reset_gates``)."""

    fail_times = 0
    non_retryable = False
    calls = 0


class BillingFlow(Workflow[dict]):
    """Waits for "charge", then runs a step that may fail; a failed signal is repairable."""

    id, version, contract = "billing", 1, "billing.v1"
    signals = {"charge": None, "note": None}

    @action(start=True, next="await_charge")
    def open(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "opened": True}

    await_charge = wait("charge", next="charge")

    @action(next="await_note")
    def charge(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        import os

        from vertique_workflow.exceptions import NonRetryable

        Billing.calls += 1
        if os.environ.get("VERTIQUE_TEST_BILLING_DOWN"):  # process tests: "before the deploy"
            raise ConnectionError("payment gateway down")
        if Billing.non_retryable:
            raise NonRetryable("CARD_DECLINED", "card 4111 1111 1111 1111 declined")
        if Billing.fail_times > 0:
            Billing.fail_times -= 1
            raise ConnectionError("payment gateway down: secret-token-123")
        return {**state, "charged": True}

    await_note = wait("note", next="done")
    done = end()


class PolicyFlow(Workflow[dict]):
    """A step with its own retry policy: two attempts, KeyError never retried."""

    id, version, contract = "policy", 1, "policy.v1"

    @action(
        start=True,
        next="done",
        retry=Retry(max_attempts=2, backoff=datetime.timedelta(milliseconds=5), never=(KeyError,)),
    )
    def flaky(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        Gate.calls += 1
        if state.get("raise") == "key":
            raise KeyError("missing")
        if Gate.fail_times > 0:
            Gate.fail_times -= 1
            raise RuntimeError("flaky")
        return {**state, "ok": True}

    done = end()


class Probes:
    """What LockProbeFlow saw (reset by ``reset_gates``)."""

    lock_timeouts: list[str] = []
    iterations = 0
    slow = ""


PROBE_LOCK_KEY = 0x5EED


class LockProbeFlow(Workflow[dict]):
    """Reads the session's lock_timeout inside a segment, then waits on a lock the test may hold.

    With ``Probes.slow == "small"`` it works in many short statements (at most
    400 x 50 ms) and with ``"long"`` in one 30 s statement: the segment
    deadline must stop either long before that.
    """

    id, version, contract = "lock-probe", 1, "lock-probe.v1"

    @action(start=True, next="done")
    def probe(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            Probes.lock_timeouts.append(cursor.fetchone()[0])
            if state.get("lock"):
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PROBE_LOCK_KEY])
            if Probes.slow == "small":
                for _ in range(400):
                    Probes.iterations += 1
                    cursor.execute("SELECT pg_sleep(0.05)")
            elif Probes.slow == "long":
                cursor.execute("SELECT pg_sleep(30)")
        return {**state, "probed": True}

    done = end()


# -- payload hygiene (tests/test_payloads.py) -------------------------------------------


@dataclass
class Ticket:
    title: str
    status: str = "open"
    notes: list[Any] = dataclasses.field(default_factory=list)


class TicketFlow(Workflow[Ticket]):
    """A dataclass state; "update" is folded in by the default merge only, "both" also by
    a wait with its own apply (so the record side cannot tell what fits)."""

    id, version, contract = "ticket", 1, "ticket.v1"
    signals = {"update": None, "both": None}

    @action(start=True, next="triage")
    def open_ticket(self, state: Ticket, ctx: StepContext) -> Ticket:
        return state

    triage = wait("update", "both", next="review")
    review = wait("both", next="done", apply="note")
    done = end()

    def note(self, state: Ticket, name: str, payload: Any, ctx: StepContext) -> Ticket:
        return dataclasses.replace(state, notes=[*state.notes, payload])


class GrowingFlow(Workflow[dict]):
    """Each "grow" step appends ``size`` characters to the state (STATE_TOO_LARGE)."""

    id, version, contract = "growing", 1, "growing.v1"
    signals = {"more": None}

    @action(start=True, next="more_wait")
    def grow(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "blob": state.get("blob", "") + "x" * int(state.get("size", 0))}

    more_wait = wait("more", next="grow_again")

    @action(next="done")
    def grow_again(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "blob": state["blob"] + "x" * int(state.get("size", 0))}

    done = end()


class SignalContextFlow(Workflow[dict]):
    """Copies the durable tenant context into the state at start and after the "go" signal."""

    id, version, contract = "signal-context-flow", 1, "signal-context-flow.v1"
    signals = {"go": None}

    @action(start=True, next="wait_go")
    def at_start(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from tests.flows.context import TENANT

        return {**state, "at_start": TENANT.get()}

    wait_go = wait("go", next="after_go")

    @action(next="done")
    def after_go(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from tests.flows.context import TENANT

        return {**state, "after_go": TENANT.get()}

    done = end()


class NapFlow(Workflow[dict]):
    """Sleep an hour on a timer step, then note the waking."""

    id, version, contract = "nap", 1, "nap.v1"

    @action(start=True, next="sleep")
    def lie_down(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "asleep": True}

    sleep = timer("1h", next="wake")

    @action(next="done")
    def wake(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "asleep": False, "woke": True}

    done = end()


class AlarmFlow(Workflow[dict]):
    """A timer step until the instant the start payload names (``at``)."""

    id, version, contract = "alarm", 1, "alarm.v1"

    ring_at = timer(until="alarm_time", next="ring", start=True)

    def alarm_time(self, state: dict[str, Any]) -> str:
        return str(state["at"])

    @action(next="done")
    def ring(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "rang": True}

    done = end()


class ReceiptFlow(Workflow[dict]):
    """Wait seven days for a receipt; without one the claim expires."""

    id, version, contract = "receipt-wait", 1, "receipt.v1"
    signals = {"receipt": None, "note": None}

    receipt = wait("receipt", timeout="7d", on_timeout="expire", next="done", start=True)

    @action(next="done")
    def expire(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "expired": True}

    done = end()


REJECTION = {"type": "object", "required": ["reason"], "properties": {"reason": {"type": "string"}}}


class ReviewFlow(Workflow[dict]):
    """A manager reviews: approve or reject (with a reason); escalated after three days."""

    id, version, contract = "review", 1, "review.v1"

    review = task(
        title="Review the claim",
        assignee=lambda s: s["manager"],
        candidate_groups=("reviewers",),
        decisions={"approve": "approved", "reject": decision_to("rejected", schema=REJECTION)},
        due="3d",
        on_due="escalated",
        reminders=["1d", "2d"],
        start=True,
    )

    @action(next="done")
    def approved(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "outcome": "approved"}

    @action(next="done")
    def rejected(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "outcome": "rejected"}

    @action(next="done")
    def escalated(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "outcome": "escalated"}

    done = end()


class StableReviewFlow(Workflow[dict]):
    """A review that must be completed against the current revision (``rev``)."""

    id, version, contract = "stable-review", 1, "stable-review.v1"

    review = task(
        candidate_users=("ann", "bob"),
        decisions={"approve": "done"},
        require_version_stability=True,
        subject_version=lambda s: s["rev"],
        start=True,
    )
    done = end()


class TimedContextFlow(Workflow[dict]):
    """Sleeps an hour, then copies the durable tenant context into the state."""

    id, version, contract = "timed-context", 1, "timed-context.v1"

    sleep = timer("1h", next="read_context", start=True)

    @action(next="done")
    def read_context(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from tests.flows.context import TENANT

        return {**state, "tenant": TENANT.get()}

    done = end()


def _collect(state: dict[str, Any], results: Any, ctx: StepContext) -> dict[str, Any]:
    """A join's merge: each completed branch's ``done`` marks, by branch id."""
    return {
        **state,
        "joined": {
            b: r.state.get("done") for b, r in sorted(results.items()) if r.status == "COMPLETED"
        },
    }


class ParallelFlow(Workflow[dict]):
    """Three branches: one runs through, two wait for their own signal; all joined."""

    id, version, contract = "parallel", 1, "parallel.v1"
    signals = {"go": None}

    split = fork(branches={"a": "run_a", "b": "wait_b", "c": "wait_c"}, join="joined")

    @action(next="joined")
    def run_a(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": f"a:{ctx.branch_id}"}

    wait_b = wait("go", next="finish_b")

    @action(next="joined")
    def finish_b(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": f"b:{ctx.branch_id}"}

    wait_c = wait("go", next="finish_c")

    @action(next="joined")
    def finish_c(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": f"c:{ctx.branch_id}"}

    joined = join(policy="all", merge=_collect, next="done")
    done = end()


class RaceFlow(Workflow[dict]):
    """Two branches race: a one-hour timer and a signal; the first one wins (policy any).

    After the join the instance waits for "finish", so late callbacks of the
    losing branch reach a live instance.
    """

    id, version, contract = "race", 1, "race.v1"
    signals = {"go": None, "finish": None}

    split = fork(branches={"slow": "nap", "fast": "listen"}, join="joined")
    nap = timer("1h", next="joined")
    listen = wait("go", next="joined")
    joined = join(policy="any", next="hold")
    hold = wait("finish", next="done")
    done = end()


class FanFlow(Workflow[dict]):
    """One branch per item: each doubles its item; the join gathers the results."""

    id, version, contract = "fan", 1, "fan.v1"

    spread = fork(each="items", start="work", join="gathered")

    @action(next="gathered")
    def work(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": ctx.branch_item * 2}

    gathered = join(merge="gather", next="done")

    def gather(self, state: dict[str, Any], results: Any, ctx: StepContext) -> dict[str, Any]:
        return {**state, "doubled": [results[str(i)].state["done"] for i in range(len(results))]}

    done = end()


class PartialFlow(Workflow[dict]):
    """Two of three branches must complete; one fails by a fail step."""

    id, version, contract = "partial", 1, "partial.v1"
    signals = {"go": None}

    split = fork(branches={"a": "ok_a", "b": "broken", "c": "wait_c"}, join="joined")

    @action(next="joined")
    def ok_a(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": "a"}

    broken = fail(reason="BRANCH_BROKE")
    wait_c = wait("go", next="ok_c")

    @action(next="joined")
    def ok_c(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": "c"}

    joined = join(policy=2, merge=_collect, next="done", on_failed="gave_up")
    gave_up = fail(reason="NOT_ENOUGH")
    done = end()


class NestedFlow(Workflow[dict]):
    """A fork inside a branch: the outer join waits for the inner one."""

    id, version, contract = "nested", 1, "nested.v1"
    signals = {"go": None}

    outer = fork(branches={"x": "inner", "y": "wait_y"}, join="outer_joined")
    inner = fork(branches={"p": "mark_p", "q": "wait_q"}, join="inner_joined")

    @action(next="inner_joined")
    def mark_p(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": "p"}

    wait_q = wait("go", next="inner_joined")
    inner_joined = join(next="outer_joined")
    wait_y = wait("go", next="outer_joined")
    outer_joined = join(next="done")
    done = end()


class ChildFlow(Workflow[dict]):
    """A child: waits for "finish" (or fails when told to at the start)."""

    id, version, contract = "child", 1, "child.v1"
    signals = {"finish": None}

    @decision(targets=["hold", "broken"], start=True)
    def route(self, state: dict[str, Any], ctx: StepContext) -> str:
        return "broken" if state.get("fail") else "hold"

    hold = wait("finish", next="done")
    broken = fail(reason="CHILD_BROKE")
    done = end()


class ParentFlow(Workflow[dict]):
    """Calls a child and folds its result; a failed child takes the on_failed path."""

    id, version, contract = "parent", 1, "parent.v1"

    delegate = call(
        "child",
        payload="child_payload",
        result="fold",
        on_completed="done",
        on_failed="recover",
        start=True,
    )

    def child_payload(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state.get("n", 0), "fail": state.get("fail", False)}

    def fold(self, state: dict[str, Any], child: Any, ctx: StepContext) -> dict[str, Any]:
        return {
            **state,
            "child_status": child.status,
            "child_finished": (child.state or {}).get("finished"),
        }

    @action(next="done")
    def recover(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "recovered": True}

    done = end()


class FanCallFlow(Workflow[dict]):
    """A child workflow per item: the fan-out of child workflows."""

    id, version, contract = "fan-call", 1, "fan-call.v1"

    spread = fork(each="items", start="delegate", join="gathered")
    delegate = call("child", payload="child_payload", on_completed="gathered")

    def child_payload(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {"n": ctx.branch_item}

    gathered = join(next="done")
    done = end()


class FlakyBranchesFlow(Workflow[dict]):
    """Two branches; the ``charge`` branch's action fails ``Billing.fail_times`` times first."""

    id, version, contract = "flaky-branches", 1, "flaky-branches.v1"

    split = fork(branches={"charge": "charge", "note": "note"}, join="joined")

    @action(next="joined")
    def charge(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        Billing.calls += 1
        if Billing.fail_times > 0:
            Billing.fail_times -= 1
            raise ConnectionError("payment gateway down")
        return {**state, "done": "charged"}

    @action(next="joined")
    def note(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": "noted"}

    joined = join(merge=_collect, next="done")
    done = end()


class Gifts:
    """Switch of BrokenBranchesFlow's ``gift`` step: "ok", "refuse" or "flaky" (reset_gates)."""

    mode = "ok"
    calls = 0


def _gift(state: dict[str, Any]) -> dict[str, Any]:
    from vertique_workflow.exceptions import NonRetryable

    Gifts.calls += 1
    if Gifts.mode == "refuse":
        raise NonRetryable("GIFT_REFUSED", "no gifts today")
    if Gifts.mode == "never":
        raise KeyError("wrapping")
    if Gifts.mode == "flaky":
        raise ConnectionError("gift shop down")
    return {**state, "done": "gifted"}


class BrokenBranchesFlow(Workflow[dict]):
    """Two of three branches needed; the ``gift`` branch's action may fail terminally."""

    id, version, contract = "broken-branches", 1, "broken-branches.v1"
    signals = {"go": None, "finish": None}

    split = fork(branches={"charge": "charge", "gift": "gift", "note": "wait_note"}, join="joined")

    @action(next="joined")
    def charge(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": "charged"}

    @action(
        next="joined",
        retry=Retry(max_attempts=2, backoff=datetime.timedelta(milliseconds=5), never=(KeyError,)),
    )
    def gift(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return _gift(state)

    wait_note = wait("go", next="joined")
    joined = join(policy=2, merge=_collect, next="hold", on_failed="gave_up")

    @action(next="hold")
    def gave_up(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "gave_up": True}

    hold = wait("finish", next="done")
    done = end()


class AllOrNothingFlow(Workflow[dict]):
    """Both branches needed, no on_failed: a branch failing terminally fails the instance."""

    id, version, contract = "all-or-nothing", 1, "all-or-nothing.v1"
    signals = {"go": None}

    split = fork(branches={"gift": "gift", "note": "wait_note"}, join="joined")

    @action(next="joined")
    def gift(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return _gift(state)

    wait_note = wait("go", next="joined")
    joined = join(merge=_collect, next="done")
    done = end()


class ReviewRaceFlow(Workflow[dict]):
    """A reviewer's task races a signal (policy any); the loser's task is cancelled."""

    id, version, contract = "review-race", 1, "review-race.v1"
    signals = {"go": None, "finish": None}

    split = fork(branches={"review": "ask", "auto": "listen"}, join="joined")
    ask = task(candidate_users=("ann",), decisions={"approve": "joined"}, due="1d", on_due="joined")
    listen = wait("go", next="joined")
    joined = join(policy="any", next="hold")
    hold = wait("finish", next="done")
    done = end()


class RefusingChildFlow(Workflow[dict]):
    """A child whose first step fails non-retryably."""

    id, version, contract = "refusing-child", 1, "refusing-child.v1"

    @action(start=True, next="done")
    def refuse(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from vertique_workflow.exceptions import NonRetryable

        raise NonRetryable("OUT_OF_STOCK", "nothing left")

    done = end()


class RefusedParentFlow(Workflow[dict]):
    """Calls a child that fails non-retryably; no on_failed: the parent fails too."""

    id, version, contract = "refused-parent", 1, "refused-parent.v1"

    delegate = call("refusing-child", on_completed="done", start=True)
    done = end()


class ExhaustingChildFlow(Workflow[dict]):
    """A child whose first step fails on its only attempt: its START is dead-lettered."""

    id, version, contract = "exhausting-child", 1, "exhausting-child.v1"

    @action(start=True, next="done", retry=Retry(max_attempts=1))
    def attempt(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        raise ConnectionError("warehouse unreachable")

    done = end()


class ExhaustedParentFlow(Workflow[dict]):
    """Calls a child whose START is dead-lettered, and takes on_failed."""

    id, version, contract = "exhausted-parent", 1, "exhausted-parent.v1"

    delegate = call("exhausting-child", on_completed="done", on_failed="fallback", start=True)

    @action(next="done")
    def fallback(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "fell_back": True}

    done = end()


# -- branches driven by real executor processes (tests/test_branches_process.py) -----


class SignalledFanFlow(Workflow[dict]):
    """One branch per item, each waits for its own "go", then marks itself; all joined.

    Every branch is a segment of its own (one branch-addressed signal each),
    so several executors compete for the branches of one instance.
    """

    id, version, contract = "signalled-fan", 1, "signalled-fan.v1"
    signals = {"go": None}

    spread = fork(each="items", start="wait_go", join="gathered")
    wait_go = wait("go", next="finish")

    @action(next="gathered")
    def finish(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": ctx.branch_item}

    gathered = join(merge=_collect, next="done")
    done = end()


class GatedFanFlow(Workflow[dict]):
    """A fan-out whose branch actions write a Shipment; branch ``gate_at`` waits on the gate.

    All branches run in the START segment that creates them; the branch whose
    item is ``state["gate_at"]`` takes the advisory lock ``GATE_LOCK_KEY``
    (held by the test, as for ``GatedFlow``), so the segment blocks in the
    middle of the fan-out with half of its Shipments written.
    """

    id, version, contract = "gated-fan", 1, "gated-fan.v1"

    spread = fork(each="items", start="ship", join="gathered")

    @action(next="gathered")
    def ship(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        from django.db import connection

        from tests.flows.models import Shipment

        Shipment.objects.create(
            order_ref=f"{ctx.instance_id}:{ctx.branch_id}", created_by_step=ctx.step_id
        )
        if ctx.branch_item == state.get("gate_at"):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GATE_LOCK_KEY])
        return {**state, "done": ctx.branch_item}

    gathered = join(merge=_collect, next="done")
    done = end()


class EagerFailFlow(Workflow[dict]):
    """A branch fails in the fork's own segment while another still waits (issue 9 example)."""

    id, version, contract = "eager-fail", 1, "eager-fail.v1"
    signals = {"go": None}

    split = fork(branches={"a": "wait_a", "b": "broken"}, join="joined")
    wait_a = wait("go", next="joined")
    broken = fail(reason="BRANCH_BROKE")
    joined = join(next="done", on_failed="gave_up")
    gave_up = fail(reason="GAVE_UP")
    done = end()


# the how-to's parcel documents name callables registered there
from . import compensation as _compensation  # noqa: E402, F401
from . import parcels as _parcels  # noqa: E402, F401
from . import services as _services  # noqa: E402, F401
