"""Definitions of timers, wait timeouts and human tasks: DSL, plan fields, validation, hash.

Pure code: nothing here touches the database. The engine reads exactly the
fields asserted here (``Step.delay``/``until``/``timeout``/``on_timeout``/
``task``), so these tests pin the contract between definitions and engine.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import vertique_workflow as wf
from tests.flows import workflows as flows
from vertique_workflow.definitions import (
    STEP_KINDS,
    Plan,
    Step,
    StepContext,
    TaskDecision,
    TaskSpec,
    Workflow,
    action,
    decision,
    decision_to,
    end,
    fail,
    resolve_people,
    task,
    timer,
    wait,
)
from vertique_workflow.exceptions import WorkflowDefinitionError, WorkflowValidationError

SECRET = "s3cr3t-value"
UTC = datetime.UTC


def ctx(step_id: str = "s") -> StepContext:
    return StepContext(
        instance_id=uuid.uuid4(),
        step_id=step_id,
        definition_id="wf",
        definition_version=1,
        command_id=None,
        command_kind=None,
        business_key=None,
        scope="default",
    )


@dataclass
class Expense:
    amount: int
    manager: str
    version: int = 1


def _receipt_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}


class Expenses(Workflow[Expense]):
    """The expense approval of DESIGN.md 5 with every new field in use."""

    id, version, contract = "expense-time", 1, "expense.time"
    signals = {"receipt": _receipt_schema()}

    @action(start=True, next="route")
    def validate(self, state: Expense, ctx: StepContext) -> Expense:
        return state

    @decision(targets=["pay", "review"])
    def route(self, state: Expense) -> str:
        return "pay" if state.amount < 100 else "review"

    def finance(self, state: Expense, ctx: StepContext) -> list[str]:
        return ["finance", ctx.step_id]

    def current_version(self, state: Expense) -> int:
        return state.version

    def deadline(self, state: Expense) -> str:
        return "2030-01-02T03:04:05+02:00"

    review = task(
        assignee=lambda s: s.manager,
        candidate_groups=finance,
        candidate_users=["auditor"],
        decisions={
            "approve": "receipt",
            "reject": "rejected",
            "changes": decision_to("rejected", schema={"type": "object", "required": ["why"]}),
        },
        due="3d",
        on_due="escalate",
        reminders=["1d", "2d"],
        require_version_stability=True,
        subject_version="current_version",
    )
    receipt = wait("receipt", timeout="7d", next="pay", on_timeout="rejected")
    escalate = timer("90s", next="hold")
    hold = timer(until="deadline", next="pay")
    pay = end()
    rejected = fail(reason="REJECTED")


# -- constructors ------------------------------------------------------------


def test_new_step_kinds_are_known() -> None:
    assert {"timer", "task"} <= STEP_KINDS


def test_timer_with_duration_builds_delay_and_next() -> None:
    step = Expenses.plan().steps["escalate"]
    assert (step.kind, step.delay, step.until, step.until_name, step.next) == (
        "timer",
        datetime.timedelta(seconds=90),
        None,
        None,
        "hold",
    )
    assert step.timer_fire(None, ctx()) == ("delay", 90)


def test_timer_takes_a_timedelta() -> None:
    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        wait_a_bit = timer(datetime.timedelta(hours=2), next="done")
        done = end()

    assert T.plan().steps["wait_a_bit"].delay == datetime.timedelta(hours=2)


def test_timer_until_a_method_is_bound_and_named() -> None:
    step = Expenses.plan().steps["hold"]
    assert step.delay is None
    assert step.until_name == f"{__name__}.Expenses.deadline"
    assert step.timer_fire(Expense(1, "m"), ctx()) == (
        "at",
        datetime.datetime(2030, 1, 2, 1, 4, 5, tzinfo=UTC),
    )


def test_timer_until_a_lambda_is_named_by_its_qualname() -> None:
    at = datetime.datetime(2031, 5, 6, tzinfo=UTC)

    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        pause = timer(until=lambda s, c: at, next="done")
        done = end()

    step = T.plan().steps["pause"]
    assert step.until_name is not None and step.until_name.endswith("T.<lambda>")
    assert step.timer_fire({}, ctx()) == ("at", at)


def test_wait_timeout_builds_timeout_and_on_timeout() -> None:
    step = Expenses.plan().steps["receipt"]
    assert (step.timeout, step.on_timeout, step.next) == (
        datetime.timedelta(days=7),
        "rejected",
        "pay",
    )


def test_task_builds_the_task_spec() -> None:
    step = Expenses.plan().steps["review"]
    spec = step.task
    assert isinstance(spec, TaskSpec)
    assert step.kind == "task" and step.next is None
    assert spec.title == "review"  # defaults to the step id
    assert callable(spec.assignee)
    assert spec.assignee_name is not None and spec.assignee_name.endswith("Expenses.<lambda>")
    assert spec.candidate_users == ("auditor",)
    assert spec.candidate_groups_name == f"{__name__}.Expenses.finance"
    assert dict(spec.decisions) == {
        "approve": TaskDecision("receipt"),
        "reject": TaskDecision("rejected"),
        "changes": TaskDecision("rejected", schema={"type": "object", "required": ["why"]}),
    }
    assert spec.due == datetime.timedelta(days=3) and spec.on_due == "escalate"
    assert spec.reminders == (datetime.timedelta(days=1), datetime.timedelta(days=2))
    assert spec.require_version_stability is True
    assert spec.subject_version_name == f"{__name__}.Expenses.current_version"
    assert spec.subject_version is not None
    assert spec.subject_version(Expense(1, "m", version=7), ctx()) == 7
    hash(step)  # a Step stays hashable with a task


def test_task_title_and_literal_assignee() -> None:
    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        check = task(title="Check it", assignee="ann", decisions={"ok": "done"})
        done = end()

    spec = T.plan().steps["check"].task
    assert spec is not None
    assert (spec.title, spec.assignee, spec.assignee_name) == ("Check it", "ann", None)


def test_task_decision_directly_works_as_decision_value() -> None:
    decisions = {"approve": TaskDecision("done", schema={"type": "object"})}

    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        check = task(candidate_groups=["finance"], decisions=decisions)
        done = end()

    spec = T.plan().steps["check"].task
    assert spec is not None
    assert spec.decisions["approve"] == TaskDecision("done", schema={"type": "object"})
    assert spec.candidate_groups == ("finance",)


def test_step_built_directly_parses_readable_durations() -> None:
    step = Step("t", "timer", delay="1d12h", next="done")  # type: ignore[arg-type]
    spec = TaskSpec(assignee="ann", decisions={"ok": "done"}, due="2h", reminders=["1h"])
    assert step.delay == datetime.timedelta(days=1, hours=12)
    assert spec.due == datetime.timedelta(hours=2)
    assert spec.reminders == (datetime.timedelta(hours=1),)


def test_new_names_are_exported() -> None:
    for name in ("timer", "task", "TaskDecision", "decision_to"):
        assert name in wf.__all__
    assert wf.timer is timer and wf.task is task
    assert wf.TaskDecision is TaskDecision and wf.decision_to is decision_to


# -- validation --------------------------------------------------------------


def _flow(**steps: Any) -> type[Workflow[dict]]:
    """A dict workflow starting at ``first`` (a wait on signal 'go') with ``steps`` and done/bad."""
    body: dict[str, Any] = {
        "id": "v",
        "version": 1,
        "contract": "v",
        "signals": {"go": None},
        "first": wait("go", next=next(iter(steps)), start=True),
        **steps,
        "done": end(),
        "bad": fail(reason="BAD"),
    }
    return type("V", (Workflow,), body)


def _people() -> dict[str, Any]:
    return {"assignee": "ann"}


INVALID: dict[str, tuple[Callable[[], Any], str]] = {
    "timer next unknown": (
        lambda: _flow(s=timer("1h", next="nowhere")),
        "next names unknown step 'nowhere'",
    ),
    "timer without next": (lambda: _flow(s=timer("1h")), "a timer needs next"),
    "timer duration and until": (
        lambda: _flow(s=timer("1h", until=lambda s: None, next="done")),
        "exactly one of a duration or until",
    ),
    "timer neither duration nor until": (
        lambda: _flow(s=timer(next="done")),
        "exactly one of a duration or until",
    ),
    "timer sub-second": (
        lambda: _flow(s=timer(datetime.timedelta(milliseconds=1500), next="done")),
        "whole number of seconds",
    ),
    "timer bad duration text": (lambda: _flow(s=timer("9x", next="done")), "invalid duration"),
    "timer until names no method": (
        lambda: _flow(s=timer(until="nope", next="done")),
        "until names no method 'nope'",
    ),
    "timer until wrong arity": (
        lambda: _flow(s=timer(until=lambda: None, next="done")),
        "until must take (state) or (state, ctx)",
    ),
    "on_timeout unknown": (
        lambda: _flow(s=wait("go", next="done", timeout="1h", on_timeout="nowhere")),
        "on_timeout names unknown step 'nowhere'",
    ),
    "on_timeout without timeout": (
        lambda: _flow(s=wait("go", next="done", on_timeout="bad")),
        "timeout and on_timeout go together",
    ),
    "timeout without on_timeout": (
        lambda: _flow(s=wait("go", next="done", timeout="1h")),
        "timeout and on_timeout go together",
    ),
    "timeout sub-second": (
        lambda: _flow(
            s=wait(
                "go",
                next="done",
                timeout=datetime.timedelta(seconds=1, microseconds=5),
                on_timeout="bad",
            )
        ),
        "timeout must be a whole number of seconds",
    ),
    "decision target unknown": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "nowhere"})),
        "decision 'ok' names unknown step 'nowhere'",
    ),
    "on_due unknown": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, due="1d", on_due="nowhere")),
        "on_due names unknown step 'nowhere'",
    ),
    "on_due without due": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, on_due="bad")),
        "due and on_due go together",
    ),
    "due without on_due": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, due="1d")),
        "due and on_due go together",
    ),
    "due sub-second": (
        lambda: _flow(
            s=task(
                **_people(),
                decisions={"ok": "done"},
                due=datetime.timedelta(hours=1, milliseconds=1),
                on_due="bad",
            )
        ),
        "due must be a whole number of seconds",
    ),
    "reminder after due": (
        lambda: _flow(
            s=task(**_people(), decisions={"ok": "done"}, due="1d", on_due="bad", reminders=["2d"])
        ),
        "reminder 1 must come before the due date",
    ),
    "reminder at due": (
        lambda: _flow(
            s=task(
                **_people(),
                decisions={"ok": "done"},
                due="1d",
                on_due="bad",
                reminders=["1h", "24h"],
            )
        ),
        "reminder 2 must come before the due date",
    ),
    "reminder sub-second": (
        lambda: _flow(
            s=task(
                **_people(),
                decisions={"ok": "done"},
                reminders=[datetime.timedelta(microseconds=10)],
            )
        ),
        "reminder 1 must be a whole number of seconds",
    ),
    "reminder twice": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, reminders=["1h", "60m"])),
        "the same reminder twice",
    ),
    "reminder bad text": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, reminders=["soon"])),
        "reminder 1: invalid duration",
    ),
    "empty decisions": (
        lambda: _flow(s=task(**_people(), decisions={})),
        "a task needs at least one decision",
    ),
    "bad decision schema": (
        lambda: _flow(
            s=task(
                **_people(),
                decisions={"ok": decision_to("done", schema={"type": "no-such-type"})},
            )
        ),
        "payload schema of decision 'ok' is not a valid JSON Schema",
    ),
    "bad decision value": (
        lambda: _flow(s=task(**_people(), decisions={"ok": 3})),
        "decision 'ok' must be a step id or a TaskDecision",
    ),
    "stability without subject_version": (
        lambda: _flow(
            s=task(**_people(), decisions={"ok": "done"}, require_version_stability=True)
        ),
        "require_version_stability needs subject_version",
    ),
    "subject_version names no method": (
        lambda: _flow(s=task(**_people(), decisions={"ok": "done"}, subject_version="nope")),
        "subject_version names no method 'nope'",
    ),
    "no assignee or candidates": (
        lambda: _flow(s=task(decisions={"ok": "done"})),
        "a task needs an assignee, candidate_users or candidate_groups",
    ),
    "empty candidates only": (
        lambda: _flow(s=task(candidate_users=[], candidate_groups=(), decisions={"ok": "done"})),
        "a task needs an assignee, candidate_users or candidate_groups",
    ),
    "blank assignee": (
        lambda: _flow(s=task(assignee=" ann", decisions={"ok": "done"})),
        "assignee must be a user name",
    ),
    "candidate twice": (
        lambda: _flow(s=task(candidate_users=["ann", "ann"], decisions={"ok": "done"})),
        "candidate_users names someone twice",
    ),
    "assignee wrong arity": (
        lambda: _flow(s=task(assignee=lambda a, b, c: "x", decisions={"ok": "done"})),
        "assignee must take (state) or (state, ctx)",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_definitions_name_the_workflow_and_step(case: str) -> None:
    build, rule = INVALID[case]
    with pytest.raises(WorkflowDefinitionError) as caught:
        build().plan()
    message = str(caught.value)
    assert rule in message
    assert "'v'" in message and "step 's'" in message
    assert caught.value.step_id == "s"
    assert caught.value.definition_id == "v"


def test_task_step_takes_no_next_and_timer_no_task() -> None:
    spec = TaskSpec(assignee="ann", decisions={"ok": "done"})
    for step, rule in (
        (Step("s", "task", next="done", task=spec), "task steps take no next"),
        (Step("s", "timer", delay=datetime.timedelta(hours=1), next="done", task=spec), "no task"),
        (
            Step(
                "s", "action", callback=lambda s, c: s, next="done", timeout=datetime.timedelta(1)
            ),
            "no timeout",
        ),
    ):
        with pytest.raises(WorkflowDefinitionError, match=rule) as caught:
            Plan.from_steps(
                [Step("first", "wait", signals=("go",), next="s"), step, Step("done", "end")],
                id="p",
                version=1,
                contract="p",
                start="first",
                signals={"go": None},
            )
        assert caught.value.step_id == "s"


def test_steps_reached_only_by_the_new_edges_are_reachable() -> None:
    """on_timeout, on_due and decision targets are edges: their steps are not unreachable."""

    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        signals = {"go": None}
        first = wait("go", next="check", timeout="1h", on_timeout="late", start=True)
        check = task(
            assignee="ann", decisions={"ok": "done", "no": "refused"}, due="1d", on_due="overdue"
        )
        late = fail(reason="LATE")
        overdue = fail(reason="OVERDUE")
        refused = fail(reason="REFUSED")
        done = end()

    assert set(T.plan().steps) == {"first", "check", "late", "overdue", "refused", "done"}


# -- the plan hash -----------------------------------------------------------

# Computed from tests/flows before the timer and task fields were added: a
# plan that uses none of them keeps its hash (instances stay pinned to it).
HASHES_BEFORE = {
    "BillingFlow": "016dd8834e1903ae2333d83b4e20d56e90dd202978af80472e06bd166f80f83e",
    "BlockingFlow": "fc42972c5d4fa937d65aaf3982d1010cb621caefaf4ca875be32a9d1dd41ab20",
    "ContextFlow": "75db052a71823af705347eb839e4b48c40343df62c46b3c762dd0cc17501c5d8",
    "ExpenseApproval": "3b8f5491ef45b1cca358d0d8ac3fd627c5dd96734947341a2eeaf6fb054156ff",
    "GatedFlow": "d2ed897e491be03533be2ced74e85c2f0ae52c372d9d4c80ebcb03e830ff0144",
    "GrowingFlow": "b7634f97adf317a9ccafac2cf660b9a6b751aa934575e5d3e03d70b76ff11612",
    "LockProbeFlow": "7fabda94ad802001fd03cbf25a8bbdaa0d952ab3b46e48ce9ef8d38a73522b1e",
    "OrderFlow": "c538797cefc12f75670242830445943f2154b5abb4b4905a7ef538193e863761",
    "PolicyFlow": "c7cd3b00ef9643bb4595e35afdd0999e31c2179d02a199a1a0dc65a66cf7c576",
    "ShipmentFlow": "37561dfa2413183f3ad3b5b37a7779567e3ff4f7982d87a95df9024c8b07a4fa",
    "SignalContextFlow": "a50d5dcf5950fa7bf3883a45333ed9afc6e1c6241dade6f7d8c7fd7bbe766484",
    "TicketFlow": "2a47b0340ea37ea1601519a2d0fa0cdf0e8bfe1e603cd39b2348b1356467a2a8",
    "TwoWaits": "e904dcd7d699a68ac2a0f53fc9b7aa865c5cf3ee6e7f9dace343e08edc81211d",
}


@pytest.mark.parametrize("name", sorted(HASHES_BEFORE))
def test_existing_plans_keep_their_hash(name: str) -> None:
    assert getattr(flows, name).plan().plan_hash == HASHES_BEFORE[name]


def _task_plan(**changes: Any) -> Plan:
    fields: dict[str, Any] = {
        "assignee": "ann",
        "candidate_users": ("bob", "cy"),
        "decisions": {"ok": "done", "no": TaskDecision("bad", schema={"type": "object"})},
        "due": datetime.timedelta(days=3),
        "on_due": "bad",
        "reminders": (datetime.timedelta(days=1), datetime.timedelta(days=2)),
    }
    fields.update(changes)
    steps = [
        # on_timeout leads to the timer "t", which leads to "other".
        Step(
            "first",
            "wait",
            signals=("go",),
            next="s",
            timeout=datetime.timedelta(hours=1),
            on_timeout="t",
        ),
        Step("s", "task", task=TaskSpec(**fields)),
        Step("t", "timer", delay=datetime.timedelta(minutes=5), next="other"),
        Step("done", "end"),
        Step("bad", "fail", reason="BAD"),
        Step("other", "fail", reason="OTHER"),
    ]
    return Plan.from_steps(
        steps, id="h", version=1, contract="h", start="first", signals={"go": None}
    )


HASH_CHANGES: dict[str, dict[str, Any]] = {
    "due": {"due": datetime.timedelta(days=4)},
    "reminder": {"reminders": (datetime.timedelta(days=1), datetime.timedelta(hours=36))},
    "one reminder fewer": {"reminders": (datetime.timedelta(days=1),)},
    "on_due": {"on_due": "done"},
    "decision target": {
        "decisions": {"ok": "bad", "no": TaskDecision("done", schema={"type": "object"})}
    },
    "decision schema": {
        "decisions": {"ok": "done", "no": TaskDecision("bad", schema={"type": "array"})}
    },
    "schema dropped": {"decisions": {"ok": "done", "no": "bad"}},
    "decision renamed": {
        "decisions": {"yes": "done", "no": TaskDecision("bad", schema={"type": "object"})}
    },
    "assignee": {"assignee": "zed"},
    "candidate users": {"candidate_users": ("bob",)},
    "title": {"title": "Other title"},
    "stability": {"require_version_stability": True, "subject_version": lambda s: 1},
}


@pytest.mark.parametrize("case", sorted(HASH_CHANGES))
def test_task_changes_change_the_hash(case: str) -> None:
    assert _task_plan(**HASH_CHANGES[case]).plan_hash != _task_plan().plan_hash


def test_declaration_order_of_decisions_reminders_and_candidates_is_not_hashed() -> None:
    reordered = _task_plan(
        decisions={"no": TaskDecision("bad", schema={"type": "object"}), "ok": "done"},
        reminders=(datetime.timedelta(days=2), datetime.timedelta(days=1)),
        candidate_users=("cy", "bob"),
    )
    assert reordered.plan_hash == _task_plan().plan_hash


def test_callable_names_are_hashed_not_their_code() -> None:
    def one(state: Any) -> str:
        return "ann"

    def two(state: Any) -> str:
        return "bob"

    base = _task_plan(assignee=one, assignee_name="app.manager")
    same_name = _task_plan(assignee=two, assignee_name="app.manager")
    other_name = _task_plan(assignee=one, assignee_name="app.reviewer")
    assert base.plan_hash == same_name.plan_hash
    assert base.plan_hash != other_name.plan_hash


def test_timer_and_timeout_fields_are_hashed_in_whole_seconds() -> None:
    plan = _task_plan()
    assert plan.canonical()["steps"]["t"] == {"kind": "timer", "delay": 300, "next": "other"}
    assert plan.canonical()["steps"]["first"]["timeout"] == 3600
    assert plan.canonical()["steps"]["first"]["on_timeout"] == "t"
    canonical_task = plan.canonical()["steps"]["s"]["task"]
    assert canonical_task["due"] == 259200 and canonical_task["reminders"] == [86400, 172800]

    def at(state: Any) -> datetime.datetime:
        return datetime.datetime.now(UTC)

    a = Step("t", "timer", until=at, until_name="app.a", next="done")
    b = Step("t", "timer", until=at, until_name="app.b", next="done")
    assert a.canonical() != b.canonical()
    assert a.canonical() == {"kind": "timer", "until_name": "app.a", "next": "done"}


# -- completion payloads and the snapshot -------------------------------------


def _spec() -> TaskSpec:
    schema = {
        "type": "object",
        "required": ["amount", "note"],
        "properties": {
            "amount": {"type": "integer"},
            "lines": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        },
    }
    return TaskSpec(
        assignee="ann", decisions={"approve": decision_to("pay", schema=schema), "reject": "no"}
    )


def test_payload_failing_the_schema_names_path_and_keyword_never_the_value() -> None:
    spec = _spec()
    with pytest.raises(WorkflowValidationError) as caught:
        spec.check_payload(
            "approve", {"amount": 1, "note": "n", "lines": ["ok", SECRET]}, what="task 'review'"
        )
    message = str(caught.value)
    assert "$.lines[1]" in message and "'maxLength'" in message
    assert "decision 'approve' of task 'review'" in message
    assert SECRET not in message

    with pytest.raises(WorkflowValidationError) as caught:
        spec.check_payload("approve", {"amount": SECRET, "note": "n"})
    assert "$.amount" in str(caught.value) and "'type'" in str(caught.value)
    assert SECRET not in str(caught.value)

    with pytest.raises(WorkflowValidationError, match="missing required 'note'"):
        spec.check_payload("approve", {"amount": 1})


def test_payload_checks_accept_fitting_payloads_and_refuse_undeclared_decisions() -> None:
    spec = _spec()
    spec.check_payload("approve", {"amount": 1, "note": "fine"})
    spec.check_payload("reject", {"anything": [SECRET]})  # no schema: any payload
    spec.check_payload("reject", None)
    with pytest.raises(WorkflowValidationError) as caught:
        spec.check_payload(SECRET, {})
    assert "declares no decision" in str(caught.value)
    assert "'approve', 'reject'" in str(caught.value)


def test_snapshot_holds_next_and_payload_schema_only_when_present() -> None:
    spec = _spec()
    snapshot = spec.snapshot()
    assert snapshot == {
        "approve": {"next": "pay", "payloadSchema": spec.decisions["approve"].schema},
        "reject": {"next": "no"},
    }
    snapshot["approve"]["payloadSchema"]["type"] = "changed"  # a private copy
    assert spec.decisions["approve"].schema is not None
    assert spec.decisions["approve"].schema["type"] == "object"


# -- resolve_people -------------------------------------------------------------


def test_resolve_people_literals_and_callables_of_both_forms() -> None:
    state = Expense(500, "mia")
    literal = TaskSpec(assignee="ann", candidate_users=("bob",), decisions={"ok": "d"})
    assert resolve_people(literal, state, ctx()) == ("ann", ["bob"], [])
    called = TaskSpec(
        assignee=lambda s: s.manager,
        candidate_users=lambda s, c: ["bob", c.step_id, "bob"],
        candidate_groups=lambda s: None,
        decisions={"ok": "d"},
    )
    assert resolve_people(called, state, ctx("review")) == ("mia", ["bob", "review"], [])
    nobody = TaskSpec(assignee=lambda s: None, decisions={"ok": "d"})
    assert resolve_people(nobody, state, ctx()) == (None, [], [])


def test_resolve_people_accepts_unhashable_callable_objects() -> None:
    class Pick:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, state: Any, ctx: Any) -> list[str]:
            return [ctx.step_id]

    spec = TaskSpec(candidate_groups=Pick(), decisions={"ok": "d"})
    assert resolve_people(spec, {}, ctx("g")) == (None, [], ["g"])


def test_resolve_people_calls_dsl_methods_bound_to_the_workflow() -> None:
    spec = Expenses.plan().steps["review"].task
    assert spec is not None
    assert resolve_people(spec, Expense(500, "mia"), ctx("review")) == (
        "mia",
        ["auditor"],
        ["finance", "review"],
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (TaskSpec(assignee=lambda s: 42, decisions={"ok": "d"}), "assignee"),
        (TaskSpec(assignee=lambda s: "", decisions={"ok": "d"}), "assignee"),
        (TaskSpec(assignee=lambda s: f" {SECRET}", decisions={"ok": "d"}), "assignee"),
        (TaskSpec(assignee=lambda s: "x" * 256, decisions={"ok": "d"}), "assignee"),
        (TaskSpec(candidate_users=lambda s: SECRET, decisions={"ok": "d"}), "candidate_users"),
        (TaskSpec(candidate_users=lambda s: {SECRET: 1}, decisions={"ok": "d"}), "candidate_users"),
        (TaskSpec(candidate_users=lambda s: 7, decisions={"ok": "d"}), "candidate_users"),
        (TaskSpec(candidate_groups=lambda s: ["ok", 3], decisions={"ok": "d"}), "candidate_groups"),
    ],
)
def test_resolve_people_refuses_bad_returns_naming_the_field_not_the_value(
    spec: TaskSpec, field: str
) -> None:
    with pytest.raises(TypeError) as caught:
        resolve_people(spec, {}, ctx())
    assert field in str(caught.value)
    assert SECRET not in str(caught.value)


def test_subject_version_of_answers_int_or_str_and_refuses_the_rest() -> None:
    spec = Expenses.plan().steps["review"].task
    assert spec is not None
    assert spec.subject_version_of(Expense(1, "m", version=4), ctx()) == 4
    assert TaskSpec(assignee="a", decisions={"ok": "d"}).subject_version_of({}, ctx()) is None
    text = TaskSpec(assignee="a", decisions={"ok": "d"}, subject_version=lambda s, c: "v2")
    assert text.subject_version_of({}, ctx()) == "v2"

    def returning(value: Any) -> Callable[[Any], Any]:
        return lambda s: value

    for bad in (True, 1.5, [SECRET], None):
        spec_bad = TaskSpec(assignee="a", decisions={"ok": "d"}, subject_version=returning(bad))
        with pytest.raises(TypeError) as caught:
            spec_bad.subject_version_of({}, ctx())
        assert "subject_version" in str(caught.value) and SECRET not in str(caught.value)


# -- Step.timer_fire --------------------------------------------------------


def _until(value: Any) -> Step:
    return Step("pause", "timer", until=lambda s: value, next="done")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            datetime.datetime(
                2030, 1, 1, 12, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
            ),
            datetime.datetime(2030, 1, 1, 10, tzinfo=UTC),
        ),
        ("2030-01-01T12:00:00+02:00", datetime.datetime(2030, 1, 1, 10, tzinfo=UTC)),
        ("2030-01-01T10:00:00Z", datetime.datetime(2030, 1, 1, 10, tzinfo=UTC)),
        # an instant in the past is answered as is; the store takes it as now
        (datetime.datetime(2001, 1, 1, tzinfo=UTC), datetime.datetime(2001, 1, 1, tzinfo=UTC)),
    ],
)
def test_timer_fire_answers_an_aware_utc_instant(value: Any, expected: datetime.datetime) -> None:
    kind, at = _until(value).timer_fire({}, ctx())
    assert kind == "at" and at == expected
    assert isinstance(at, datetime.datetime) and at.utcoffset() == datetime.timedelta(0)


def test_timer_fire_passes_ctx_to_a_two_argument_until() -> None:
    seen: list[Any] = []
    at = datetime.datetime(2030, 1, 1, tzinfo=UTC)

    def until(state: Any, c: Any) -> datetime.datetime:
        seen.append((state, c.step_id))
        return at

    step = Step("pause", "timer", until=until, next="done")
    assert step.timer_fire({"k": 1}, ctx("pause")) == ("at", at)
    assert seen == [({"k": 1}, "pause")]


@pytest.mark.parametrize(
    "value",
    [
        datetime.datetime(2030, 1, 1),  # naive
        "2030-01-01T10:00:00",  # no offset
        SECRET,  # not ISO-8601
        1893456000,  # a number is not an instant
        datetime.date(2030, 1, 1),
        None,
    ],
)
def test_timer_fire_refuses_naive_and_non_instants(value: Any) -> None:
    with pytest.raises(TypeError) as caught:
        _until(value).timer_fire({}, ctx())
    assert "timer step 'pause'" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_timer_fire_of_another_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Step("done", "end").timer_fire({}, ctx())
