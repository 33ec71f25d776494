"""Unit tests of the definitions package: DSL, plan model, validation, catalog, durations.

Pure code: nothing here touches the database.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from tests.flows.workflows import Expense, ExpenseApproval, OrderFlow
from vertique_workflow import exceptions
from vertique_workflow.definitions import (
    Catalog,
    Plan,
    Step,
    StepContext,
    Workflow,
    action,
    autodiscover,
    decision,
    end,
    fail,
    parse_duration,
    register,
    timer,
    wait,
)
from vertique_workflow.exceptions import (
    ContractMismatch,
    WorkflowDefinitionError,
    WorkflowValidationError,
)

SECRET = "s3cr3t-value"
# The package attribute `catalog` is the instance; this is the module.
catalog_module = importlib.import_module("vertique_workflow.definitions.catalog")


def ctx(step_id: str = "s", **extra: Any) -> StepContext:
    return StepContext(
        instance_id=uuid.uuid4(),
        step_id=step_id,
        definition_id="wf",
        definition_version=1,
        command_id=None,
        command_kind=None,
        business_key=None,
        scope="default",
        **extra,
    )


def noop(state: Any, ctx: Any) -> Any:
    return state


def choose(state: Any, ctx: Any) -> str:
    return "done"


def make_plan(*steps: Step, **fields: Any) -> Plan:
    """A plan named "wf" from ``steps``; ``fields`` override the header."""
    header: dict[str, Any] = {
        "id": "wf",
        "version": 1,
        "contract": "wf.v1",
        "start": steps[0].id if steps else "a",
        "signals": {"go": None, "stop": {"type": "object"}},
    }
    header.update(fields)
    return Plan.from_steps(steps, **header)


# -- exceptions -----------------------------------------------------------------


def test_exception_reason_codes_and_hierarchy() -> None:
    expected = {
        exceptions.WorkflowError: "ERROR",
        exceptions.WorkflowNotFound: "NOT_FOUND",
        exceptions.WorkflowConflict: "CONFLICT",
        exceptions.WorkflowValidationError: "VALIDATION",
        exceptions.WorkflowDefinitionError: "DEFINITION",
        exceptions.ContractMismatch: "CONTRACT_MISMATCH",
        exceptions.WorkflowPersistenceError: "PERSISTENCE",
        exceptions.NonRetryable: "NON_RETRYABLE",
    }
    for cls, code in expected.items():
        assert cls.reason_code == code
        assert issubclass(cls, exceptions.WorkflowError)
    assert issubclass(ContractMismatch, WorkflowDefinitionError)
    assert exceptions.WorkflowPersistenceError("x").retryable is False
    assert exceptions.WorkflowPersistenceError("x", retryable=True).retryable is True
    error = WorkflowDefinitionError("m", definition_id="wf", step_id="s")
    assert (str(error), error.definition_id, error.step_id) == ("m", "wf", "s")


# -- the DSL --------------------------------------------------------------------


def test_order_flow_compiles_to_the_expected_plan() -> None:
    plan = OrderFlow.plan()
    assert (plan.id, plan.version, plan.contract) == ("order", 1, "order.v1")
    assert plan.state_type is None and plan.state_type_name == "dict"
    assert plan.start == "reserve"
    assert list(plan.steps) == ["reserve", "route", "await_payment", "ship", "done"]
    assert [s.kind for s in plan.steps.values()] == ["action", "decision", "wait", "action", "end"]
    assert plan.step("reserve").next == "route"
    assert plan.step("route").targets == ("await_payment", "done")
    assert plan.step("await_payment").signals == ("paid",)
    assert plan.step("await_payment").next == "ship"
    assert plan.step("ship").next == "done"
    assert plan.step("reserve").callback_name == "tests.flows.workflows.OrderFlow.reserve"
    assert plan.signals["paid"]["required"] == ["amount_paid"]


def test_order_flow_callbacks_run_with_the_plan_alone() -> None:
    plan = OrderFlow.plan()
    state = plan.state_from_json({"amount": 5})
    state = plan.step("reserve").callback(state, ctx("reserve"))
    assert state == {"amount": 5, "reserved": True}
    assert plan.step("route").callback(state, ctx("route")) == "await_payment"
    assert plan.step("route").callback({"amount": 0}, ctx("route")) == "done"
    state = plan.apply_signal(plan.step("await_payment"), state, "paid", {"amount_paid": 5}, None)
    assert plan.next_after_signal(plan.step("await_payment"), "paid") == "ship"
    state = plan.step("ship").callback(state, ctx("ship"))
    assert plan.state_to_json(state) == {
        "amount": 5,
        "reserved": True,
        "amount_paid": 5,
        "shipped": True,
    }


def test_expense_flow_compiles_typed_state_waits_and_fail() -> None:
    plan = ExpenseApproval.plan()
    assert plan.state_type is Expense
    assert plan.state_type_name == "tests.flows.workflows.Expense"
    assert plan.start == "validate"
    assert list(plan.steps) == ["validate", "route", "approval", "done", "rejected"]
    approval = plan.step("approval")
    assert approval.kind == "wait" and approval.next is None
    assert approval.signals == ("approve", "reject")
    assert dict(approval.on_signal) == {"approve": "done", "reject": "rejected"}
    assert approval.apply_name == "tests.flows.workflows.ExpenseApproval.record"
    assert plan.step("rejected").kind == "fail"
    assert plan.step("rejected").reason == "REJECTED"
    assert plan.signals["reject"] is None
    assert plan.start_schema is not None and plan.start_schema["required"] == ["amount"]
    # The one-argument decision form gets no ctx; the wrapper still takes (state, ctx).
    assert plan.step("route").callback(Expense(amount=500), ctx()) == "approval"
    approved = plan.apply_signal(approval, Expense(amount=500), "approve", {"by": "ann"}, ctx())
    assert approved == Expense(amount=500, approved=True, approved_by="ann")
    assert plan.next_after_signal(approval, "reject") == "rejected"


def test_first_declared_step_is_the_start_when_none_is_marked() -> None:
    class Flow(Workflow):
        id, version, contract = "first", 1, "first"
        signals = {"go": None}
        hold = wait("go", next="finish")
        finish = end()

    plan = Flow.plan()
    assert plan.start == "hold"
    assert plan.state_type is None


def test_start_may_be_any_declared_step() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "later-start", 1, "c"
        finish = end()

        @action(start=True, next="finish")
        def begin(self, state: dict, ctx: StepContext) -> dict:
            return state

    assert Flow.plan().start == "begin"
    assert list(Flow.plan().steps) == ["finish", "begin"]


def test_two_start_steps_are_refused() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "two-starts", 1, "c"

        @action(start=True, next="b")
        def a(self, state: dict, ctx: StepContext) -> dict:
            return state

        b = end(start=True)

    with pytest.raises(WorkflowDefinitionError, match="more than one start step: a, b"):
        Flow.plan()


@pytest.mark.parametrize("missing", ["id", "version", "contract"])
def test_missing_header_attribute_is_refused(missing: str) -> None:
    body: dict[str, Any] = {"id": "hdr", "version": 1, "contract": "c", "done": end()}
    del body[missing]
    flow = type("Flow", (Workflow,), body)
    with pytest.raises(WorkflowDefinitionError, match=f"declares no {missing}"):
        flow.plan()


def test_state_type_must_be_dict_or_dataclass() -> None:
    class Flow(Workflow[int]):  # type: ignore[type-var]
        id, version, contract = "bad-state", 1, "c"
        done = end()

    with pytest.raises(WorkflowDefinitionError, match="dict or a dataclass"):
        Flow.plan()


def test_parameterised_dict_is_a_dict_state() -> None:
    class Flow(Workflow[dict[str, Any]]):
        id, version, contract = "dict-state", 1, "c"
        done = end()

    assert Flow.plan().state_type is None


def test_subclasses_are_not_built_until_plan_is_asked() -> None:
    class Abstract(Workflow[dict]):
        broken = wait("undeclared", next="nowhere")  # invalid, but never built

    class Concrete(Abstract):
        id, version, contract = "concrete", 1, "c"
        signals = {"undeclared": None}
        nowhere = end()

    with pytest.raises(WorkflowDefinitionError):
        Abstract.plan()
    plan = Concrete.plan()
    assert list(plan.steps) == ["broken", "nowhere"]  # base class steps first


def test_plan_is_cached_per_class_and_not_inherited() -> None:
    class Base(Workflow[dict]):
        id, version, contract = "cached", 1, "c"
        done = end()

    class Child(Base):
        version = 2

    assert Base.plan() is Base.plan()
    assert Child.plan() is not Base.plan()
    assert Child.plan().version == 2


def test_reserved_names_cannot_be_steps() -> None:
    with pytest.raises(WorkflowDefinitionError, match="'plan' is reserved"):

        class Flow(Workflow[dict]):
            plan = end()  # type: ignore[assignment]


def test_undecorated_step_factory_is_refused() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "undecorated", 1, "c"
        a = action(next="done")
        done = end()

    with pytest.raises(WorkflowDefinitionError, match="must decorate a method"):
        Flow.plan()


def test_methods_get_a_bound_instance_and_stay_callable() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "bound", 1, "c"

        @action(next="done")
        def bump(self, state: dict, ctx: StepContext) -> dict:
            return {**state, "n": self.increment(state.get("n", 0)), "step": ctx.step_id}

        done = end()

        def increment(self, value: int) -> int:
            return value + 1

    plan = Flow.plan()
    assert plan.step("bump").callback({"n": 1}, ctx("bump")) == {"n": 2, "step": "bump"}
    # The decorated method still works as a method, for direct unit tests.
    assert Flow().bump({}, ctx("bump")) == {"n": 1, "step": "bump"}


def test_step_method_with_wrong_arity_is_refused() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "arity", 1, "c"

        @action(next="done")
        def bad(self) -> dict:
            return {}

        done = end()

    with pytest.raises(WorkflowDefinitionError, match=r"step 'bad'.*self, state"):
        Flow.plan()


def test_bare_decision_decorator_needs_targets() -> None:
    class Flow(Workflow[dict]):
        id, version, contract = "bare", 1, "c"

        @decision
        def route(self, state: dict) -> str:
            return "done"

        done = end()

    with pytest.raises(WorkflowDefinitionError, match=r"workflow 'bare' step 'route'.*targets"):
        Flow.plan()


def test_wait_apply_callable_and_unknown_method_name() -> None:
    def merge(state: dict, name: str, payload: Any, ctx: Any) -> dict:
        return {**state, "last": name}

    class Flow(Workflow[dict]):
        id, version, contract = "apply", 1, "c"
        signals = {"go": None}
        hold = wait("go", next="done", apply=merge)
        done = end()

    step = Flow.plan().step("hold")
    assert step.apply_name == f"{__name__}.{merge.__qualname__}"
    assert Flow.plan().apply_signal(step, {}, "go", None, None) == {"last": "go"}

    class Broken(Workflow[dict]):
        id, version, contract = "apply-broken", 1, "c"
        signals = {"go": None}
        hold = wait("go", next="done", apply="missing")
        done = end()

    with pytest.raises(WorkflowDefinitionError, match="apply names no method 'missing'"):
        Broken.plan()


# -- the plan hash --------------------------------------------------------------


def _flow_class(threshold: int, approve_next: str = "done") -> type[Workflow[Any]]:
    """Same structure and names on every call; ``threshold`` only changes code."""

    class Flow(Workflow[dict]):
        id, version, contract = "hashed", 1, "hashed"
        signals = {"approve": None}

        @decision(targets=["approval", "done", "rejected"], start=True)
        def route(self, state: dict) -> str:
            return "done" if state["amount"] < threshold else "approval"

        approval = wait("approve", next=approve_next)
        done = end()
        rejected = fail(reason="REJECTED")

    return Flow


def test_hash_ignores_callback_bodies() -> None:
    low, high = _flow_class(10), _flow_class(1000)
    assert low.plan().step("route").callback({"amount": 50}, None) == "approval"
    assert high.plan().step("route").callback({"amount": 50}, None) == "done"
    assert low.plan().plan_hash == high.plan().plan_hash


def test_hash_changes_with_structure() -> None:
    changed = _flow_class(10, approve_next="rejected").plan()
    assert _flow_class(10).plan().plan_hash != changed.plan_hash


def _base_steps() -> list[Step]:
    return [
        Step("a", "action", next="w", callback=noop, callback_name="m.a"),
        Step("w", "wait", signals=("go", "stop"), next="done", on_signal={"stop": "bad"}),
        Step("done", "end"),
        Step("bad", "fail", reason="STOPPED"),
    ]


def test_hash_is_pinned_for_a_known_plan() -> None:
    # A regression guard: changing the canonical form changes every stored pin.
    plan = make_plan(*_base_steps())
    assert plan.canonical() == {
        "contract": "wf.v1",
        "id": "wf",
        "signals": {"go": None, "stop": {"type": "object"}},
        "start": "a",
        "start_schema": None,
        "state_type_name": "dict",
        "steps": {
            "a": {"callback_name": "m.a", "kind": "action", "next": "w"},
            "bad": {"kind": "fail", "reason": "STOPPED"},
            "done": {"kind": "end"},
            "w": {
                "kind": "wait",
                "next": "done",
                "on_signal": {"stop": "bad"},
                "signals": ["go", "stop"],
            },
        },
        "version": 1,
    }
    assert plan.plan_hash == "a7dc27a9558f87550232b5f3326f2d9339306bddf23c57b799179c8b97d32309"


def test_hash_ignores_callables_declaration_order_and_set_order() -> None:
    steps = _base_steps()
    other = [
        dataclasses.replace(steps[0], callback=choose),
        dataclasses.replace(steps[1], signals=("stop", "go")),
        *steps[2:],
    ]
    plan = make_plan(*steps)
    assert make_plan(*other).plan_hash == plan.plan_hash
    assert make_plan(*reversed(steps), start="a").plan_hash == plan.plan_hash


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"contract": "wf.v2"},
        {"signals": {"go": None, "stop": {"type": "object", "required": ["x"]}}},
        {"start_schema": {"type": "object"}},
        {"state_type": Expense},
        {"step": ("a", {"callback_name": "m.other"})},
        {"step": ("w", {"next": "bad", "on_signal": {"go": "done"}})},
        {"step": ("w", {"on_signal": {"go": "bad"}})},
        {"step": ("bad", {"reason": "OTHER"})},
        {"step": ("w", {"apply": noop})},
    ],
)
def test_hash_changes_with_every_structural_field(change: dict[str, Any]) -> None:
    base = make_plan(*_base_steps())
    steps = _base_steps()
    change = dict(change)
    if "step" in change:
        step_id, fields = change.pop("step")
        steps = [dataclasses.replace(s, **fields) if s.id == step_id else s for s in steps]
    assert make_plan(*steps, **change).plan_hash != base.plan_hash


# -- validation -----------------------------------------------------------------


def _invalid_cases() -> list[Any]:
    a = Step("a", "action", next="done", callback=noop)
    done = Step("done", "end")
    return [
        pytest.param(
            (a, Step("done", "end", next="a")), {}, "done", "end steps take no next", id="end-next"
        ),
        pytest.param(
            (Step("a", "action", next="nowhere", callback=noop), done),
            {},
            "a",
            "next names unknown step 'nowhere'",
            id="unknown-next",
        ),
        pytest.param(
            (Step("a", "decision", callback=choose, targets=("done", "zz")), done),
            {},
            "a",
            "targets names unknown step 'zz'",
            id="unknown-target",
        ),
        pytest.param(
            (Step("a", "wait", signals=("go",), on_signal={"go": "zz"}), done),
            {},
            "a",
            "on_signal\\['go'\\] names unknown step 'zz'",
            id="unknown-on-signal-target",
        ),
        pytest.param((a, done), {"start": "zz"}, "zz", "start step does not exist", id="start"),
        pytest.param(
            (a, done, Step("orphan", "end")), {}, "orphan", "unreachable", id="unreachable"
        ),
        pytest.param(
            (Step("a", "action", next="done"), done), {}, "a", "needs a callback", id="no-cb"
        ),
        pytest.param(
            (Step("a", "decision", targets=("done",)), done),
            {},
            "a",
            "needs a callback",
            id="decision-no-callback",
        ),
        pytest.param(
            (Step("a", "decision", callback=choose), done),
            {},
            "a",
            "must declare the step ids it may return",
            id="decision-no-targets",
        ),
        pytest.param(
            (Step("a", "decision", callback=choose, targets=("done", "done")), done),
            {},
            "a",
            "target twice",
            id="decision-duplicate-target",
        ),
        pytest.param(
            (Step("a", "decision", callback=choose, targets=("done",), next="done"), done),
            {},
            "a",
            "decision steps take no next",
            id="decision-with-next",
        ),
        pytest.param(
            (Step("a", "wait", next="done"), done),
            {},
            "a",
            "needs at least one signal",
            id="wait-no-signals",
        ),
        pytest.param(
            (Step("a", "wait", signals=("nope",), next="done"), done),
            {},
            "a",
            "signal 'nope' the workflow does not declare",
            id="wait-undeclared-signal",
        ),
        pytest.param(
            (Step("a", "wait", signals=("go", "stop"), on_signal={"go": "done"}), done),
            {},
            "a",
            "no next step for signal 'stop'",
            id="wait-signal-without-next",
        ),
        pytest.param(
            (Step("a", "wait", signals=("go",), next="done", on_signal={"stop": "done"}), done),
            {},
            "a",
            "on_signal names signal 'stop' the step does not wait for",
            id="on-signal-not-waited",
        ),
        pytest.param(
            (Step("a", "action", callback=noop), done),
            {},
            "a",
            "an action needs next",
            id="action-no-next",
        ),
        pytest.param(
            (Step("a", "action", callback=noop, next="done", targets=("done",)), done),
            {},
            "a",
            "action steps take no targets",
            id="action-with-targets",
        ),
        pytest.param(
            (a, Step("done", "fail", reason="", next="a")),
            {},
            "done",
            "fail steps take no next",
            id="fail-with-next",
        ),
        pytest.param(
            (Step("a", "action", callback=noop, next="done"), Step("done", "fail", reason="")),
            {},
            "done",
            "needs a reason code",
            id="fail-without-reason",
        ),
        pytest.param(
            (a, Step("done", "teleport")),  # type: ignore[arg-type]
            {},
            "done",
            "unknown step kind 'teleport'",
            id="unknown-kind",
        ),
        pytest.param(
            (Step("a", "action", next=" done", callback=noop), Step(" done", "end")),
            {},
            " done",
            "a step id must be",
            id="bad-id",
        ),
    ]


@pytest.mark.parametrize(("steps", "header", "step_id", "rule"), _invalid_cases())
def test_validation_rules_name_workflow_step_and_rule(
    steps: tuple[Step, ...], header: dict[str, Any], step_id: str, rule: str
) -> None:
    pattern = f"^workflow 'wf' step '{step_id}': .*{rule}"
    with pytest.raises(WorkflowDefinitionError, match=pattern) as info:
        make_plan(*steps, **header)
    assert (info.value.definition_id, info.value.step_id) == ("wf", step_id)


def test_duplicate_step_ids_are_refused() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"workflow 'wf' step 'a': .*declared twice"):
        make_plan(Step("a", "end"), Step("a", "end"))


def test_steps_keyed_under_another_id_are_refused() -> None:
    with pytest.raises(WorkflowDefinitionError, match="step 'x': is keyed under"):
        Plan(id="wf", version=1, contract="c", start="x", steps={"x": Step("y", "end")})


@pytest.mark.parametrize(
    ("header", "rule"),
    [
        ({"id": ""}, "id must be"),
        ({"id": 7}, "id must be"),
        ({"version": 0}, "version must be a positive integer"),
        ({"version": True}, "version must be a positive integer"),
        ({"version": "1"}, "version must be a positive integer"),
        ({"contract": ""}, "contract must be"),
        ({"contract": None}, "contract must be"),
        ({"state_type": int}, "dict or a dataclass"),
        ({"signals": ["go"]}, "signals must map"),
        ({"start_schema": {"type": 5}}, "start_schema is not a valid JSON Schema"),
        ({"start_schema": "object"}, "start_schema must be a JSON Schema object"),
        ({"signals": {"go": {"minimum": "x"}}}, "signal 'go' is not a valid JSON Schema"),
        ({"signals": {"": None}}, "signal name '' must be"),
    ],
)
def test_header_rules(header: dict[str, Any], rule: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=rule):
        make_plan(Step("a", "end"), **header)


def test_a_plan_needs_steps() -> None:
    with pytest.raises(WorkflowDefinitionError, match="at least one step"):
        Plan(id="wf", version=1, contract="c", start="a", steps={})


def test_unknown_step_lookup_is_a_definition_error() -> None:
    with pytest.raises(WorkflowDefinitionError, match="workflow 'order' version 1 has no step 'x'"):
        OrderFlow.plan().step("x")


def test_steps_are_immutable_and_hashable() -> None:
    step = Step("w", "wait", signals=["go"], on_signal={"go": "done"})  # type: ignore[arg-type]
    assert step.signals == ("go",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.next = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        step.on_signal["go"] = "x"  # type: ignore[index]
    assert hash(step) == hash(Step("w", "wait", signals=("go",), on_signal={"go": "done"}))
    plan = make_plan(Step("a", "end"), start_schema={"type": "object"})
    with pytest.raises(TypeError):
        plan.signals["new"] = None  # type: ignore[index]


def test_plan_copies_schemas_given_to_it() -> None:
    schema: dict[str, Any] = {"type": "object"}
    plan = make_plan(Step("a", "end"), start_schema=schema, signals={"go": schema})
    schema["type"] = "string"
    assert plan.start_schema == {"type": "object"}
    assert plan.signals["go"] == {"type": "object"}


# -- state ------------------------------------------------------------------------


@dataclass
class Item:
    sku: str
    qty: int = 1


@dataclass
class Cart:
    owner: str
    items: list[Any] = dataclasses.field(default_factory=list)
    note: str | None = None


def cart_plan() -> Plan:
    return make_plan(
        Step("w", "wait", signals=("go",), next="done"), Step("done", "end"), state_type=Cart
    )


def test_dict_state_is_a_private_deep_copy() -> None:
    plan = OrderFlow.plan()
    stored = {"lines": [{"qty": 1}]}
    state = plan.state_from_json(stored)
    state["lines"][0]["qty"] = 2
    assert stored == {"lines": [{"qty": 1}]}
    assert plan.state_from_json(None) == {}
    out = plan.state_to_json(state)
    out["lines"].append({})
    assert state == {"lines": [{"qty": 2}]}


def test_dataclass_state_round_trip() -> None:
    plan = cart_plan()
    cart = Cart(owner="ann", items=[Item("a"), ("b", 2)])
    data = plan.state_to_json(cart)
    assert data == {"owner": "ann", "items": [{"sku": "a", "qty": 1}, ["b", 2]], "note": None}
    assert plan.state_from_json(data) == Cart(owner="ann", items=data["items"])


def test_dataclass_state_refuses_unknown_and_missing_fields_without_values() -> None:
    plan = cart_plan()
    with pytest.raises(WorkflowValidationError, match="does not declare: 'extra'") as info:
        plan.state_from_json({"owner": SECRET, "extra": SECRET})
    assert SECRET not in str(info.value)
    with pytest.raises(WorkflowValidationError, match=r"lacks required fields .*'owner'"):
        plan.state_from_json({"note": SECRET})
    with pytest.raises(WorkflowValidationError, match="must be a JSON object"):
        plan.state_from_json([SECRET])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"when": datetime.date(2024, 1, 1)}, "state.when holds a date"),
        ({"n": float("nan")}, "state.n holds a non-finite float"),
        ({"m": {1: SECRET}}, "state.m has a int key"),
        ({"s": [1, {SECRET}]}, r"state.s\[1\] holds a set"),
        ([SECRET], "must be a dict, not list"),
    ],
)
def test_state_to_json_refuses_non_json_naming_the_path(state: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message) as info:
        OrderFlow.plan().state_to_json(state)
    assert SECRET not in str(info.value)


def test_state_to_json_refuses_the_wrong_state_type() -> None:
    with pytest.raises(TypeError, match=r"must be a tests\.test_definitions\.Cart, not dict"):
        cart_plan().state_to_json({"owner": "ann"})


# -- signals ----------------------------------------------------------------------


def test_default_merge_of_a_dict_state() -> None:
    plan = OrderFlow.plan()
    step = plan.step("await_payment")
    state = {"amount": 5, "keep": 1}
    merged = plan.apply_signal(step, state, "paid", {"amount_paid": 5, "amount": 6}, None)
    assert merged == {"amount": 6, "keep": 1, "amount_paid": 5}
    assert state == {"amount": 5, "keep": 1}
    assert plan.apply_signal(step, state, "paid", None, None) is state
    with pytest.raises(WorkflowValidationError, match="must be a JSON object") as info:
        plan.apply_signal(step, state, "paid", [SECRET], None)
    assert SECRET not in str(info.value)


def test_default_merge_of_a_dataclass_state() -> None:
    plan = cart_plan()
    step = plan.step("w")
    cart = Cart(owner="ann")
    assert plan.apply_signal(step, cart, "go", {"note": "hi"}, None) == Cart("ann", note="hi")
    assert cart.note is None
    with pytest.raises(WorkflowValidationError, match="does not declare: 'admin'") as info:
        plan.apply_signal(step, cart, "go", {"note": SECRET, "admin": SECRET}, None)
    assert SECRET not in str(info.value)


def test_a_wait_refuses_signals_it_does_not_accept() -> None:
    plan = ExpenseApproval.plan()
    assert plan.next_after_signal(plan.step("approval"), "other") is None
    assert plan.next_after_signal(plan.step("done"), "approve") is None
    with pytest.raises(WorkflowValidationError, match="does not accept signal 'other'"):
        plan.apply_signal(plan.step("approval"), Expense(1), "other", None, None)


def test_next_after_signal_prefers_on_signal_over_next() -> None:
    plan = make_plan(*_base_steps())
    assert plan.next_after_signal(plan.step("w"), "stop") == "bad"
    assert plan.next_after_signal(plan.step("w"), "go") == "done"


def test_payload_schemas_are_checked_without_quoting_values() -> None:
    plan = OrderFlow.plan()
    plan.check_signal_payload("paid", {"amount_paid": 3.5})
    with pytest.raises(WorkflowValidationError, match=r"at \$.amount_paid: 'type'") as info:
        plan.check_signal_payload("paid", {"amount_paid": SECRET})
    assert SECRET not in str(info.value)
    with pytest.raises(WorkflowValidationError, match="missing required 'amount_paid'"):
        plan.check_signal_payload("paid", {"other": SECRET})
    with pytest.raises(WorkflowValidationError, match="declares no signal 'nope'"):
        plan.check_signal_payload("nope", {})


def test_start_payload_and_schemaless_signals() -> None:
    plan = ExpenseApproval.plan()
    plan.check_start_payload({"amount": 3})
    plan.check_signal_payload("reject", [SECRET, 1])  # None schema: any payload
    with pytest.raises(WorkflowValidationError, match=r"start payload.*'minimum'") as info:
        plan.check_start_payload({"amount": -5})
    assert "-5" not in str(info.value)
    OrderFlow.plan().check_start_payload({"anything": 1})  # no start schema


# -- catalog ----------------------------------------------------------------------


def test_catalog_register_get_latest_all_clear() -> None:
    target = Catalog()
    order = target.register(OrderFlow)
    assert order is OrderFlow.plan()
    v2 = make_plan(Step("a", "end"), id="order", version=2)
    target.register(v2)
    target.register(ExpenseApproval.plan())
    assert target.get("order", 1) is order
    assert target.get("order", 3) is None
    assert target.latest("order") is v2
    assert target.latest("missing") is None
    assert [(p.id, p.version) for p in target.all()] == [
        ("expense-approval", 1),
        ("order", 1),
        ("order", 2),
    ]
    assert ("order", 2) in target and len(target) == 3
    target.clear()
    assert target.all() == [] and target.get("order", 1) is None


def test_catalog_same_hash_is_a_no_op_and_another_hash_a_conflict() -> None:
    target = Catalog()
    first = target.register(make_plan(*_base_steps()))
    assert target.register(make_plan(*_base_steps())) is first
    changed = make_plan(
        *[dataclasses.replace(s, reason="X") if s.id == "bad" else s for s in _base_steps()]
    )
    with pytest.raises(WorkflowDefinitionError, match="'wf' version 1 is already registered"):
        target.register(changed)
    assert target.get("wf", 1) is first
    with pytest.raises(TypeError):
        target.register(object())  # type: ignore[arg-type]


def test_autodiscover_registers_workflows_modules_and_explicit_classes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(catalog_module, "catalog", Catalog())
    monkeypatch.setattr(catalog_module, "_explicit", [])

    @register
    class Elsewhere(Workflow[dict]):
        id, version, contract = "elsewhere", 1, "c"
        done = end()

    assert catalog_module.catalog.get("elsewhere", 1) is Elsewhere.plan()
    target = Catalog()
    plans = autodiscover(target)
    from tests.flows import workflows as flows_module

    declared = [
        value.id
        for value in vars(flows_module).values()
        if isinstance(value, type)
        and issubclass(value, Workflow)
        and value is not Workflow
        and getattr(value, "id", None)
    ]
    assert [p.id for p in plans] == ["elsewhere", *declared]
    assert {"order", "expense-approval"} <= set(declared)
    assert target.get("order", 1) is OrderFlow.plan()
    assert autodiscover(target) == plans  # idempotent


# -- durations --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", datetime.timedelta(seconds=30)),
        ("15m", datetime.timedelta(minutes=15)),
        ("2h", datetime.timedelta(hours=2)),
        ("3d", datetime.timedelta(days=3)),
        ("1w", datetime.timedelta(weeks=1)),
        ("1d12h", datetime.timedelta(days=1, hours=12)),
        ("1h30m15s", datetime.timedelta(hours=1, minutes=30, seconds=15)),
        (" 90m ", datetime.timedelta(minutes=90)),
        (datetime.timedelta(minutes=1), datetime.timedelta(minutes=1)),
    ],
)
def test_parse_duration(text: Any, expected: datetime.timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3",
        "d",
        "1x",
        "12h1d",
        "1d 12h",
        "1.5h",
        "-1h",
        "0s",
        "1h1h",
        "9" * 80 + "d",
        5,
        datetime.timedelta(0),
    ],
)
def test_parse_duration_refuses_bad_text(text: Any) -> None:
    with pytest.raises(WorkflowDefinitionError):
        parse_duration(text)


def test_parse_duration_refuses_overflow() -> None:
    with pytest.raises(WorkflowDefinitionError, match="too large"):
        parse_duration("999999999999d")


def test_a_cycle_of_actions_and_decisions_without_a_wait_is_a_definition_error() -> None:
    """A token in such a loop would never stop; a wait (or timer, task, fork, call) breaks it."""

    class Spin(Workflow[dict]):
        id, version, contract = "spin", 1, "spin.v1"

        @action(start=True, next="again")
        def work(self, state: dict, ctx: StepContext) -> dict:
            return state

        @decision(targets=["work", "done"])
        def again(self, state: dict) -> str:
            return "done"

        done = end()

    with pytest.raises(WorkflowDefinitionError, match=r"'work' -> 'again' -> 'work' form a cycle"):
        Spin.plan()

    class Paced(Spin):
        id = "paced"

        @decision(targets=["pause", "done"])
        def again(self, state: dict) -> str:
            return "done"

        pause = timer("1m", next="work")

    assert Paced.plan().steps["pause"].kind == "timer"
