"""Definitions of fork, join and call steps: DSL, plan fields, validation, hash and helpers.

Pure code: nothing here touches the database. The engine reads exactly the
fields asserted here (``Step.fork``/``join``/``call``, the ``StepContext``
branch fields) and calls the helpers ``branches_of``, ``join_outcome`` and
``call_payload``, so these tests pin the contract between definitions and
engine.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import vertique_workflow as wf
from tests.flows import workflows as flows
from vertique_workflow.definitions import (
    STEP_KINDS,
    BranchListError,
    BranchResult,
    CallSpec,
    ChildResult,
    ForkSpec,
    JoinSpec,
    Plan,
    Step,
    StepContext,
    Workflow,
    action,
    branches_of,
    call,
    call_payload,
    decision,
    end,
    fail,
    fork,
    join,
    join_outcome,
    task,
    wait,
)
from vertique_workflow.definitions.branches import DEFAULT_MAX_BRANCHES, MAX_BRANCHES_LIMIT
from vertique_workflow.exceptions import WorkflowDefinitionError

SECRET = "s3cr3t-value"


def ctx(step_id: str = "s", **fields: Any) -> StepContext:
    return StepContext(
        instance_id=uuid.uuid4(),
        step_id=step_id,
        definition_id="wf",
        definition_version=1,
        command_id=None,
        command_kind=None,
        business_key=None,
        scope="default",
        **fields,
    )


@dataclass
class Order:
    lines: list[dict[str, Any]] = field(default_factory=list)
    paid: bool = False
    shipped: list[str] = field(default_factory=list)


class Fulfilment(Workflow[Order]):
    """Payment, stock and a fraud check in parallel, joined; one shipping child per line."""

    id, version, contract = "fulfilment", 1, "order.fulfilment"

    @action(start=True, next="parallel")
    def receive(self, state: Order, ctx: StepContext) -> Order:
        return state

    parallel = fork(
        branches={"payment": "charge", "stock": "reserve", "fraud": "check"}, join="checked"
    )

    @action(next="checked")
    def charge(self, state: Order, ctx: StepContext) -> Order:
        return dataclasses.replace(state, paid=True)

    @action(next="checked")
    def reserve(self, state: Order, ctx: StepContext) -> Order:
        return state

    @decision(targets=["checked", "review"])
    def check(self, state: Order) -> str:
        return "checked"

    review = task(candidate_groups=["fraud"], decisions={"clear": "checked", "block": "blocked"})
    blocked = fail(reason="FRAUD")

    def fold(self, state: Order, results: Any, ctx: StepContext) -> Order:
        return dataclasses.replace(state, paid=results["payment"].state["paid"])

    checked = join(merge="fold", next="ship", on_failed="refused")

    def sku(self, item: dict[str, Any]) -> str:
        return str(item["sku"])

    ship = fork(each="lines", start="ship_line", join="shipped", key=sku, max_branches=50)

    def shipping_payload(self, state: Order, ctx: StepContext) -> dict[str, Any]:
        return {"line": ctx.branch_item, "branch": ctx.branch_id}

    def record(self, state: Order, child: ChildResult, ctx: StepContext) -> Order:
        return dataclasses.replace(state, shipped=[*state.shipped, str(ctx.branch_id)])

    ship_line = call(
        "shipping",
        version=2,
        payload="shipping_payload",
        on_completed="shipped",
        on_failed="line_failed",
        result=record,
    )
    line_failed = fail(reason="SHIPPING_FAILED")
    shipped = join(policy=2, next="done")
    done = end()
    refused = fail(reason="REFUSED")


# -- constructors ------------------------------------------------------------


def test_new_step_kinds_are_known() -> None:
    assert {"fork", "join", "call"} <= STEP_KINDS


def test_fixed_fork_builds_its_branches_in_declaration_order() -> None:
    step = Fulfilment.plan().steps["parallel"]
    spec = step.fork
    assert isinstance(spec, ForkSpec)
    assert (step.kind, step.next, spec.join, spec.fan_out) == ("fork", None, "checked", False)
    assert list(spec.branches.items()) == [
        ("payment", "charge"),
        ("stock", "reserve"),
        ("fraud", "check"),
    ]
    assert (spec.each, spec.start, spec.key, spec.max_branches) == (
        None,
        None,
        None,
        DEFAULT_MAX_BRANCHES,
    )
    hash(step)  # a Step stays hashable with a fork


def test_fan_out_fork_builds_each_start_key_and_bound() -> None:
    spec = Fulfilment.plan().steps["ship"].fork
    assert isinstance(spec, ForkSpec)
    assert (spec.fan_out, spec.each, spec.each_name, spec.start, spec.join, spec.max_branches) == (
        True,
        "lines",
        None,
        "ship_line",
        "shipped",
        50,
    )
    assert spec.key_name == f"{__name__}.Fulfilment.sku"
    assert spec.key is not None and spec.key({"sku": 7}) == "7"  # bound to an instance


def test_fan_out_each_may_be_a_method_or_lambda() -> None:
    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"

        def rows(self, state: dict[str, Any], ctx: StepContext) -> list[int]:
            return [ctx.step_id, *state["rows"]]

        by_method = fork(each=rows, start="work", join="joined")

        @action(next="joined")
        def work(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            return state

        joined = join(next="second")
        second = fork(each=lambda s: s["rows"], start="work2", join="joined2")

        @action(next="joined2")
        def work2(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
            return state

        joined2 = join(next="done")
        done = end()

    plan = T.plan()
    first, second = plan.steps["by_method"].fork, plan.steps["second"].fork
    assert first is not None and second is not None
    assert first.each_name is not None and first.each_name.endswith("<locals>.T.rows")
    assert callable(first.each) and first.each({"rows": [1]}, ctx("by_method")) == ["by_method", 1]
    assert second.each_name is not None and second.each_name.endswith("T.<lambda>")


def test_join_builds_policy_merge_next_and_on_failed() -> None:
    plan = Fulfilment.plan()
    step = plan.steps["checked"]
    spec = step.join
    assert isinstance(spec, JoinSpec)
    assert (step.kind, step.next, spec.policy, spec.on_failed) == (
        "join",
        "ship",
        "all",
        "refused",
    )
    assert spec.merge_name == f"{__name__}.Fulfilment.fold"
    results = {"payment": BranchResult("COMPLETED", {"paid": True})}
    assert spec.merge is not None and spec.merge(Order(), results, ctx()).paid is True
    shipped = plan.steps["shipped"].join
    assert shipped is not None
    assert (shipped.policy, shipped.merge, shipped.merge_name, shipped.on_failed) == (
        2,
        None,
        None,
        None,
    )


def test_join_merge_may_be_a_method_by_reference_or_a_lambda() -> None:
    def build(merge: Any) -> JoinSpec:
        class T(Workflow[dict]):
            id, version, contract = "t", 1, "t"
            split = fork(branches={"a": "work"}, join="joined")

            @action(next="joined")
            def work(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
                return state

            def fold(self, state: Any, results: Any, ctx: Any) -> Any:
                return {"n": len(results)}

            joined = join(merge=fold if merge == "ref" else merge, next="done")
            done = end()

        spec = T.plan().steps["joined"].join
        assert spec is not None
        return spec

    by_ref = build("ref")
    assert by_ref.merge_name is not None and by_ref.merge_name.endswith("<locals>.T.fold")
    assert by_ref.merge is not None and by_ref.merge({}, {"a": 1}, ctx()) == {"n": 1}
    by_lambda = build(lambda s, r, c: s)
    assert by_lambda.merge_name is not None and by_lambda.merge_name.endswith("<lambda>")


def test_call_builds_target_payload_transitions_and_result() -> None:
    step = Fulfilment.plan().steps["ship_line"]
    spec = step.call
    assert isinstance(spec, CallSpec)
    assert (step.kind, step.next) == ("call", None)
    assert (spec.workflow, spec.version, spec.on_completed, spec.on_failed) == (
        "shipping",
        2,
        "shipped",
        "line_failed",
    )
    assert spec.payload_name == f"{__name__}.Fulfilment.shipping_payload"
    assert spec.result_name == f"{__name__}.Fulfilment.record"
    child = ChildResult("COMPLETED", {"tracking": "x"})
    assert spec.result is not None
    assert spec.result(Order(), child, ctx(branch_id="A")).shipped == ["A"]
    hash(step)


def test_call_defaults() -> None:
    class T(Workflow[dict]):
        id, version, contract = "t", 1, "t"
        child = call("other", on_completed="done", start=True)
        done = end()

    spec = T.plan().steps["child"].call
    assert spec == CallSpec("other", on_completed="done")
    assert (spec.version, spec.payload, spec.result, spec.on_failed) == (None, None, None, None)


def test_step_context_has_branch_fields_defaulting_to_none() -> None:
    plain = ctx()
    assert (plain.fork_step_id, plain.branch_id, plain.branch_item) == (None, None, None)
    inside = ctx(fork_step_id="ship", branch_id="3", branch_item={"sku": "A"})
    assert (inside.fork_step_id, inside.branch_id, inside.branch_item) == (
        "ship",
        "3",
        {"sku": "A"},
    )


def test_results_are_frozen_dataclasses() -> None:
    result = BranchResult("FAILED", {"a": 1}, error="OUT_OF_STOCK")
    child = ChildResult("FAILED", None, error_type="REFUSED")
    for value in (result, child):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.status = "COMPLETED"  # type: ignore[misc]
    assert BranchResult("COMPLETED") == BranchResult("COMPLETED", None, None)


def test_new_names_are_exported() -> None:
    for name in ("fork", "join", "call", "BranchResult", "ChildResult"):
        assert name in wf.__all__
    assert (wf.fork, wf.join, wf.call) == (fork, join, call)
    assert (wf.BranchResult, wf.ChildResult) == (BranchResult, ChildResult)


def test_steps_only_inside_branches_count_as_reachable() -> None:
    plan = Fulfilment.plan()  # review and blocked are reached only from the fraud branch
    assert {"charge", "reserve", "check", "review", "blocked", "ship_line"} <= set(plan.steps)
    assert plan.fork_of_join == {"checked": "parallel", "shipped": "ship"}


def test_nested_forks_with_their_join_inside_the_branch_are_valid() -> None:
    class Nested(Workflow[dict]):
        id, version, contract = "nested", 1, "nested"
        outer = fork(branches={"a": "inner", "b": "solo"}, join="outer_joined")
        inner = fork(branches={"x": "ax", "y": "ay"}, join="inner_joined")

        @action(next="inner_joined")
        def ax(self, state: Any, ctx: Any) -> Any:
            return state

        @action(next="inner_joined")
        def ay(self, state: Any, ctx: Any) -> Any:
            return state

        inner_joined = join(policy="any", next="after_inner", on_failed="inner_failed")

        @action(next="outer_joined")
        def after_inner(self, state: Any, ctx: Any) -> Any:
            return state

        inner_failed = fail(reason="INNER")

        @action(next="outer_joined")
        def solo(self, state: Any, ctx: Any) -> Any:
            return state

        outer_joined = join(next="done")
        done = end()

    assert Nested.plan().fork_of_join == {"outer_joined": "outer", "inner_joined": "inner"}


def test_a_fork_inside_a_loop_is_valid() -> None:
    class Loop(Workflow[dict]):
        id, version, contract = "loop", 1, "loop"
        split = fork(branches={"a": "work"}, join="joined")

        @action(next="joined")
        def work(self, state: Any, ctx: Any) -> Any:
            return state

        joined = join(next="again")

        @decision(targets=["split", "done"])
        def again(self, state: Any) -> str:
            return "done"

        done = end()

    assert Loop.plan().start == "split"


# -- validation --------------------------------------------------------------


def _act(next: str) -> Any:
    @action(next=next)
    def step(self: Any, state: Any, ctx: Any) -> Any:
        return state

    return step


def _choose(*targets: str) -> Any:
    @decision(targets=list(targets))
    def step(self: Any, state: Any) -> str:
        return targets[0]

    return step


def _flow(steps: dict[str, Any], state: type | None = None) -> type[Workflow[Any]]:
    """A workflow 'v' whose start waits for 'go' (to the first of ``steps``) or 'stop' (to bad)."""
    body: dict[str, Any] = {
        "id": "v",
        "version": 1,
        "contract": "v",
        "signals": {"go": None, "stop": None},
        "first": wait("go", "stop", next=next(iter(steps)), on={"stop": "bad"}, start=True),
        **steps,
        "done": end(),
        "bad": fail(reason="BAD"),
    }
    base = Workflow[state] if state is not None else Workflow  # type: ignore[valid-type]
    return types.new_class("V", (base,), {}, lambda namespace: namespace.update(body))


def _split(**fork_options: Any) -> dict[str, Any]:
    """A fork 's' over branches a -> wa and b -> wb, joined at 'j', then done."""
    options: dict[str, Any] = {"branches": {"a": "wa", "b": "wb"}, "join": "j"}
    options.update(fork_options)
    return {"s": fork(**options), "wa": _act("j"), "wb": _act("j"), "j": join(next="done")}


def _fan(**fork_options: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"each": "items", "start": "wa", "join": "j"}
    options.update(fork_options)
    return {"s": fork(**options), "wa": _act("j"), "j": join(next="done")}


def _with(steps: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**steps, **changes}


def _without(steps: dict[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in steps.items() if key != name}


def _call(**options: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"on_completed": "done", "on_failed": "bad"}
    fields.update(options)
    return {"s": call(fields.pop("workflow", "child"), **fields)}


@dataclass
class Lines:
    items: list[Any] = field(default_factory=list)


INVALID: dict[str, tuple[Callable[[], Any], str, str]] = {
    # fork
    "fork join unknown": (lambda: _flow(_split(join="nowhere")), "join names unknown step", "s"),
    "fork join is not a join": (
        lambda: _flow(_with(_split(join="wa"), j=end())),
        "join names step 'wa', which is not a join step",
        "s",
    ),
    "branch first step unknown": (
        lambda: _flow(_split(branches={"a": "wa", "b": "nowhere"})),
        "branch 'b' names unknown step 'nowhere'",
        "s",
    ),
    "fan-out start unknown": (
        lambda: _flow(_fan(start="nowhere")),
        "start names unknown step 'nowhere'",
        "s",
    ),
    "branches and each": (
        lambda: _flow(_split(each="items", start="wa")),
        "exactly one of branches (fixed) or each (a fan-out)",
        "s",
    ),
    "neither branches nor each": (
        lambda: _flow(_split(branches={})),
        "exactly one of branches (fixed) or each (a fan-out)",
        "s",
    ),
    "fixed fork with start": (
        lambda: _flow(_split(start="wa")),
        "start goes with each",
        "s",
    ),
    "fixed fork with key": (lambda: _flow(_split(key=str)), "key goes with each", "s"),
    "fixed fork with max_branches": (
        lambda: _flow(_split(max_branches=5)),
        "max_branches goes with each",
        "s",
    ),
    "fan-out without start": (
        lambda: _flow(_fan(start=None)),
        "a fan-out needs start",
        "s",
    ),
    "each is neither a name nor callable": (
        lambda: _flow(_fan(each=5)),
        "each is not callable",
        "s",
    ),
    "each callable of wrong arity": (
        lambda: _flow(_fan(each=lambda a, b, c: [])),
        "each must take (state) or (state, ctx)",
        "s",
    ),
    "each names no dataclass field": (
        lambda: _flow(_fan(each="nope"), state=Lines),
        "each names field 'nope' the state type",
        "s",
    ),
    "key not callable": (lambda: _flow(_fan(key=5)), "key is not callable", "s"),
    "key names no method": (lambda: _flow(_fan(key="sku")), "key names no method 'sku'", "s"),
    "max_branches zero": (
        lambda: _flow(_fan(max_branches=0)),
        f"max_branches must be an integer from 1 to {MAX_BRANCHES_LIMIT}",
        "s",
    ),
    "max_branches too big": (
        lambda: _flow(_fan(max_branches=MAX_BRANCHES_LIMIT + 1)),
        "max_branches must be an integer",
        "s",
    ),
    "max_branches bool": (
        lambda: _flow(_fan(max_branches=True)),
        "max_branches must be an integer",
        "s",
    ),
    # branch ids
    **{
        f"branch id {label}": (
            lambda bid=bid: _flow(_split(branches={"a": "wa", bid: "wb"})),
            "must be 1 to 64 letters, digits",
            "s",
        )
        for label, bid in (
            ("empty", ""),
            ("with a space", "two words"),
            ("with a slash", "a/b"),
            ("leading dash", "-b"),
            ("too long", "b" * 65),
            ("with a quote", "b'"),
        )
    },
    # branch paths
    "branch reaches end": (
        lambda: _flow(_with(_split(), wb=_act("done"))),
        "branch 'b' of fork 's' can reach end step 'done'; a branch ends at its join",
        "s",
    ),
    "branch reaches the fork": (
        lambda: _flow(_with(_split(), wb=_act("s"))),
        "branch 'b' of fork 's' can reach the fork itself",
        "s",
    ),
    "branch never reaches the join": (
        lambda: _flow(_with(_split(), wb=_act("spin"), spin=_act("wb"))),
        "branch 'b' of fork 's' can stand at step 'wb', from which its join 'j' is never reached",
        "s",
    ),
    "branch starts at its join": (
        lambda: _flow(_without(_split(branches={"a": "wa", "b": "j"}), "wb")),
        "branch 'b' of fork 's' starts at its join",
        "s",
    ),
    "fan-out branch reaches end": (
        lambda: _flow(_with(_fan(), wa=_act("done"))),
        "a branch of fork 's' can reach end step 'done'",
        "s",
    ),
    "instance enters a join without its fork": (
        lambda: _flow(
            _with(
                _split(),
                j=join(next="after"),
                after=_choose("j", "done"),
            )
        ),
        "goes to join 'j' outside the branches of its fork 's'",
        "after",
    ),
    "inner branch escapes to the outer join": (
        lambda: _flow(
            {
                "s": fork(branches={"a": "inner", "b": "wb"}, join="j"),
                "inner": fork(branches={"x": "wx", "y": "wy"}, join="ij"),
                "wx": _act("ij"),
                "wy": _act("j"),
                "ij": join(next="j"),
                "wb": _act("j"),
                "j": join(next="done"),
            }
        ),
        "branch 'y' of fork 'inner' can reach join 'j' of fork 's' from step 'wy'; "
        "a branch ends at its own join 'ij'",
        "inner",
    ),
    # join
    "join named by no fork": (
        lambda: _flow(_with(_split(), wb=_act("j2"), j2=join(next="done"))),
        "no fork names this join",
        "j2",
    ),
    "join named by two forks": (
        lambda: _flow(
            _with(
                _split(),
                j=join(next="s2"),
                s2=fork(branches={"c": "wc"}, join="j"),
                wc=_act("j"),
            )
        ),
        "is named by more than one fork ('s', 's2')",
        "j",
    ),
    "join without next": (
        lambda: _flow(_with(_split(), j=join())),
        "a join needs next",
        "j",
    ),
    "join on_failed unknown": (
        lambda: _flow(_with(_split(), j=join(next="done", on_failed="nowhere"))),
        "on_failed names unknown step 'nowhere'",
        "j",
    ),
    "merge not callable": (
        lambda: _flow(_with(_split(), j=join(next="done", merge=5))),  # type: ignore[arg-type]
        "merge is not callable",
        "j",
    ),
    "merge names no method": (
        lambda: _flow(_with(_split(), j=join(next="done", merge="nope"))),
        "merge names no method 'nope'",
        "j",
    ),
    **{
        f"policy {label}": (
            lambda policy=policy: _flow(_with(_split(), j=join(next="done", policy=policy))),
            "policy must be 'all', 'any' or a number of branches",
            "j",
        )
        for label, policy in (
            ("zero", 0),
            ("negative", -1),
            ("bool", True),
            ("first", "first"),
            ("float", 1.0),
        )
    },
    "policy n above the fixed branches": (
        lambda: _flow(_with(_split(), j=join(next="done", policy=3))),
        "policy 3 needs more branches than fork 's' starts (2)",
        "j",
    ),
    # call
    "call without on_completed": (
        lambda: _flow(_call(on_completed=None)),
        "a call needs on_completed",
        "s",
    ),
    "call on_completed unknown": (
        lambda: _flow(_call(on_completed="nowhere")),
        "on_completed names unknown step 'nowhere'",
        "s",
    ),
    "call on_failed unknown": (
        lambda: _flow(_call(on_failed="nowhere")),
        "on_failed names unknown step 'nowhere'",
        "s",
    ),
    "call workflow empty": (
        lambda: _flow(_call(workflow="")),
        "workflow must be a definition id",
        "s",
    ),
    "call workflow not a str": (
        lambda: _flow(_call(workflow=7)),
        "workflow must be a definition id",
        "s",
    ),
    **{
        f"call version {label}": (
            lambda version=version: _flow(_call(version=version)),
            "version must be None (the latest) or a positive integer",
            "s",
        )
        for label, version in (("zero", 0), ("bool", True), ("str", "1"))
    },
    "call payload wrong arity": (
        lambda: _flow(_call(payload=lambda a, b, c: {})),
        "payload must take (state) or (state, ctx)",
        "s",
    ),
    "call payload names no method": (
        lambda: _flow(_call(payload="nope")),
        "payload names no method 'nope'",
        "s",
    ),
    "call result not callable": (
        lambda: _flow(_call(result=5)),
        "result is not callable",
        "s",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_definitions_name_the_workflow_and_step(case: str) -> None:
    build, rule, step_id = INVALID[case]
    with pytest.raises(WorkflowDefinitionError) as caught:
        build().plan()
    message = str(caught.value)
    assert rule in message
    assert "'v'" in message and f"step {step_id!r}" in message
    assert caught.value.step_id == step_id
    assert caught.value.definition_id == "v"


def test_fan_out_join_may_ask_for_any_number_of_branches() -> None:
    plan = _flow(_with(_fan(), j=join(next="done", policy=500))).plan()
    assert plan.steps["j"].join == JoinSpec(policy=500)


def test_fork_spec_of_a_plain_step_is_validated_too() -> None:
    steps = [
        Step("s", "fork", fork=ForkSpec("j", branches={"a": "w"})),
        Step("w", "action", callback=lambda s, c: s, next="j"),
        Step("j", "join", next="done", join=JoinSpec(policy="any")),
        Step("done", "end"),
    ]
    plan = Plan.from_steps(steps, id="p", version=1, contract="p", start="s")
    assert plan.steps["s"].canonical() == {
        "kind": "fork",
        "fork": {"join": "j", "branches": {"a": "w"}},
    }
    for broken, rule in (
        (Step("s", "fork"), "a fork step needs a fork built"),
        (Step("s", "fork", next="done", fork=ForkSpec("j", {"a": "w"})), "take no next"),
        (Step("s", "action", callback=_noop, next="j", fork=ForkSpec("j")), "take no fork"),
        (Step("s", "join", next="done"), "a join step needs a join built"),
        (Step("s", "call"), "a call step needs a call built"),
    ):
        with pytest.raises(WorkflowDefinitionError, match=rule) as caught:
            Plan.from_steps([broken, *steps[1:]], id="p", version=1, contract="p", start="s")
        assert caught.value.step_id == "s"


# -- the plan hash -----------------------------------------------------------


def test_steps_without_the_new_fields_hash_as_before() -> None:
    classes = [
        value
        for value in vars(flows).values()
        if isinstance(value, type) and issubclass(value, Workflow) and hasattr(value, "id")
    ]
    assert len(classes) >= 10
    for cls in classes:
        for step in cls.plan().steps.values():
            if step.kind not in ("fork", "join", "call"):  # flows that fork use them
                assert not {"fork", "join", "call"} & set(step.canonical())


def _hash_plan(
    *,
    branches: dict[str, str] | None = None,
    policy: Any = "all",
    merge: Any = None,
    join_failed: str | None = "bad",
    call_options: dict[str, Any] | None = None,
    fan: dict[str, Any] | None = None,
) -> Plan:
    call_fields: dict[str, Any] = {"workflow": "child", "on_completed": "j", "on_failed": "bad"}
    call_fields.update(call_options or {})
    fan_fields: dict[str, Any] = {"join": "fj", "each": "items", "start": "fw"}
    fan_fields.update(fan or {})
    steps = [
        Step("s", "fork", fork=ForkSpec("j", branches=branches or {"a": "wa", "b": "wb"})),
        Step("wa", "action", callback=_noop, next="j"),
        Step("wb", "call", call=CallSpec(**call_fields)),
        Step(
            "j", "join", next="f", join=JoinSpec(policy=policy, merge=merge, on_failed=join_failed)
        ),
        Step("f", "fork", fork=ForkSpec(**fan_fields)),
        Step("fw", "action", callback=_noop, next="fj"),
        Step("fj", "join", next="done", join=JoinSpec()),
        Step("done", "end"),
        Step("bad", "fail", reason="BAD"),
    ]
    return Plan.from_steps(steps, id="h", version=1, contract="h", start="s")


def _noop(state: Any, ctx: Any) -> Any:
    return state


def _merge_a(state: Any, results: Any, ctx: Any) -> Any:
    return state


def _merge_b(state: Any, results: Any, ctx: Any) -> Any:
    return state


def _key(item: Any) -> str:
    return str(item)


HASH_CHANGES: dict[str, dict[str, Any]] = {
    "branch target": {"branches": {"a": "wb", "b": "wa"}},
    "branch id": {"branches": {"a": "wa", "c": "wb"}},
    "policy any": {"policy": "any"},
    "policy n": {"policy": 1},
    "merge set": {"merge": _merge_a},
    "join on_failed": {"join_failed": None},
    "call workflow": {"call_options": {"workflow": "other"}},
    "call version": {"call_options": {"version": 3}},
    "call on_failed": {"call_options": {"on_failed": "j"}},
    "call on_completed": {"call_options": {"on_completed": "bad"}},
    "call payload": {"call_options": {"payload": _noop}},
    "call result": {"call_options": {"result": _merge_a}},
    "fan-out field": {"fan": {"each": "rows"}},
    "fan-out callable": {"fan": {"each": _noop}},
    "fan-out key": {"fan": {"key": _key}},
    "fan-out bound": {"fan": {"max_branches": 10}},
}


@pytest.mark.parametrize("case", sorted(HASH_CHANGES))
def test_branch_and_call_changes_change_the_hash(case: str) -> None:
    assert _hash_plan(**HASH_CHANGES[case]).plan_hash != _hash_plan().plan_hash


def test_merge_is_hashed_by_name() -> None:
    first = _hash_plan(merge=_merge_a)
    assert first.plan_hash != _hash_plan(merge=_merge_b).plan_hash
    same_name = JoinSpec(
        merge=lambda s, r, c: s, merge_name=f"{__name__}._merge_a", on_failed="bad"
    )
    assert same_name.canonical() == first.steps["j"].join.canonical()  # type: ignore[union-attr]


def test_branch_declaration_order_is_not_hashed() -> None:
    reordered = _hash_plan(branches={"b": "wb", "a": "wa"})
    assert reordered.plan_hash == _hash_plan().plan_hash
    assert list(reordered.steps["s"].fork.branches) == ["b", "a"]  # type: ignore[union-attr]


def test_default_bound_is_left_out_of_the_hash() -> None:
    default = _hash_plan(fan={"max_branches": DEFAULT_MAX_BRANCHES})
    assert default.plan_hash == _hash_plan().plan_hash
    assert "max_branches" not in default.steps["f"].canonical()["fork"]


# -- branches_of -------------------------------------------------------------


def _fork_step(**options: Any) -> Step:
    fields: dict[str, Any] = {"join": "j", "each": "items", "start": "w"}
    fields.update(options)
    return Step("ship", "fork", fork=ForkSpec(**fields))


def test_fixed_branches_in_declaration_order_without_items() -> None:
    step = Fulfilment.plan().steps["parallel"]
    assert branches_of(step, Order(), ctx("parallel")) == [
        ("payment", "charge", None),
        ("stock", "reserve", None),
        ("fraud", "check", None),
    ]


def test_fan_out_over_a_state_field_by_index() -> None:
    state = {"items": [{"sku": "A"}, 2, "three", None]}
    found = branches_of(_fork_step(), state, ctx())
    assert found == [
        ("0", "w", {"sku": "A"}),
        ("1", "w", 2),
        ("2", "w", "three"),
        ("3", "w", None),
    ]
    found[0][2]["sku"] = "changed"
    assert state["items"][0] == {"sku": "A"}  # each branch gets a private copy of its item


def test_fan_out_over_a_dataclass_field_with_keys() -> None:
    step = Fulfilment.plan().steps["ship"]
    state = Order(lines=[{"sku": "A-1"}, {"sku": "b_2.x"}])
    assert branches_of(step, state, ctx("ship")) == [
        ("A-1", "ship_line", {"sku": "A-1"}),
        ("b_2.x", "ship_line", {"sku": "b_2.x"}),
    ]


def test_fan_out_over_a_callable_with_ctx() -> None:
    step = _fork_step(each=lambda state, c: [c.step_id, *state["n"]])
    assert branches_of(step, {"n": (1,)}, ctx("here")) == [("0", "w", "here"), ("1", "w", 1)]
    tuple_step = _fork_step(each=lambda state: (1, 2))
    assert [branch for branch, _, _ in branches_of(tuple_step, {}, ctx())] == ["0", "1"]


def test_fan_out_over_an_empty_list_starts_no_branch() -> None:
    assert branches_of(_fork_step(), {"items": []}, ctx()) == []


def test_fan_out_at_the_bound_and_above_it() -> None:
    step = _fork_step(max_branches=3)
    assert len(branches_of(step, {"items": [1, 2, 3]}, ctx())) == 3
    with pytest.raises(BranchListError) as caught:
        branches_of(step, {"items": [1, 2, 3, 4]}, ctx())
    assert caught.value.reason_code == "TOO_MANY_BRANCHES"
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        "fork step 'ship': the list has 4 items, more than max_branches (3)"
    )


@pytest.mark.parametrize(
    ("state", "step_options", "rule"),
    [
        ({"other": [SECRET]}, {}, "the state has no field 'items' to fan out over"),
        ({"items": {SECRET: 1}}, {}, "state field 'items' must hold a list, not dict"),
        ({"items": SECRET}, {}, "state field 'items' must hold a list, not str"),
        (Order(), {"each": "items"}, "the state has no field 'items' to fan out over"),
        ({}, {"each": lambda s: {SECRET}}, "each must return a list, not set"),
        ({"items": [1, {SECRET}]}, {}, "item 1 holds a set, which is not JSON"),
        ({"items": [float("nan")]}, {}, "item 0"),
        ({"items": [SECRET]}, {"key": lambda item: 7}, "key of fork step 'ship' for item 0 must"),
        ({"items": [SECRET]}, {"key": lambda item: None}, "must be a str, not NoneType"),
    ],
)
def test_branches_of_refuses_bad_lists_naming_the_step_never_the_value(
    state: Any, step_options: dict[str, Any], rule: str
) -> None:
    with pytest.raises(TypeError) as caught:
        branches_of(_fork_step(**step_options), state, ctx())
    message = str(caught.value)
    assert rule in message and "'ship'" in message
    assert SECRET not in message


@pytest.mark.parametrize("bad", ["", "two words", "a/b", "-a", "x" * 65, SECRET + "/"])
def test_branches_of_refuses_a_key_that_is_no_branch_id(bad: str) -> None:
    step = _fork_step(key=lambda item: bad)
    with pytest.raises(BranchListError) as caught:
        branches_of(step, {"items": [1]}, ctx())
    assert caught.value.reason_code == "BRANCH_KEY_INVALID"
    assert "key of fork step 'ship' for item 0 is not 1 to 64 letters" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_branches_of_refuses_duplicate_keys() -> None:
    step = _fork_step(key=lambda item: SECRET if item else "other")
    with pytest.raises(BranchListError) as caught:
        branches_of(step, {"items": [1, 0, 1]}, ctx())
    assert caught.value.reason_code == "BRANCH_KEY_DUPLICATE"
    assert str(caught.value) == ("key of fork step 'ship' gives items 0 and 2 the same branch id")


def test_branches_of_a_step_that_is_no_fork() -> None:
    with pytest.raises(TypeError, match="step 'done' is a end step, not a fork"):
        branches_of(Step("done", "end"), {}, ctx())


# -- join_outcome ------------------------------------------------------------


def _join_step(policy: Any) -> Step:
    return Step("j", "join", next="done", join=JoinSpec(policy=policy))


def _done(status: str) -> BranchResult:
    return BranchResult(status, {})  # type: ignore[arg-type]


def _needed(policy: Any, expected: int) -> int:
    return {"all": expected, "any": 1}.get(policy, policy)


def _oracle(policy: Any, expected: int, ended: list[str]) -> str:
    """The outcome by brute force: decided when met now; failed when no future meets it."""
    needed = _needed(policy, expected)
    if ended.count("COMPLETED") >= needed:
        return "DECIDED"
    remaining = expected - len(ended)
    futures = itertools.product(("COMPLETED", "FAILED"), repeat=remaining)
    if any((ended + list(future)).count("COMPLETED") >= needed for future in futures):
        return "WAIT"
    return "FAILED"


POLICIES = ["all", "any", 1, 2, 3, 4]


@pytest.mark.parametrize("expected", [3, 4])
@pytest.mark.parametrize("policy", POLICIES)
def test_join_outcome_in_every_arrival_order(policy: Any, expected: int) -> None:
    step = _join_step(policy)
    branches = [f"b{index}" for index in range(expected)]
    checked = 0
    for statuses in itertools.product(("COMPLETED", "FAILED"), repeat=expected):
        for order in itertools.permutations(range(expected)):
            results: dict[str, BranchResult] = {}
            ended: list[str] = []
            settled = None
            assert join_outcome(step, expected, results) == _oracle(policy, expected, [])
            for index in order:
                results[branches[index]] = _done(statuses[index])
                ended.append(statuses[index])
                outcome = join_outcome(step, expected, results)
                assert outcome == _oracle(policy, expected, ended), (statuses, order)
                if settled is not None:
                    assert outcome == settled  # a decided or failed join never changes its mind
                elif outcome != "WAIT":
                    settled = outcome
                checked += 1
            assert settled is not None  # once every branch ended the join is settled
    assert checked == 2**expected * len(list(itertools.permutations(range(expected)))) * expected


@pytest.mark.parametrize(
    ("policy", "arrivals", "outcomes"),
    [
        ("all", "CCC", ["WAIT", "WAIT", "DECIDED"]),
        ("all", "CFC", ["WAIT", "FAILED", "FAILED"]),
        ("any", "FFC", ["WAIT", "WAIT", "DECIDED"]),
        ("any", "FFF", ["WAIT", "WAIT", "FAILED"]),
        ("any", "CFF", ["DECIDED", "DECIDED", "DECIDED"]),
        (2, "CFC", ["WAIT", "WAIT", "DECIDED"]),
        (2, "FFC", ["WAIT", "FAILED", "FAILED"]),
        (2, "CCF", ["WAIT", "DECIDED", "DECIDED"]),
    ],
)
def test_join_outcome_worked_examples(policy: Any, arrivals: str, outcomes: list[str]) -> None:
    step = _join_step(policy)
    results: dict[str, BranchResult] = {}
    seen = []
    for index, letter in enumerate(arrivals):
        results[str(index)] = _done({"C": "COMPLETED", "F": "FAILED"}[letter])
        seen.append(join_outcome(step, 3, results))
    assert seen == outcomes


def test_join_outcome_without_branches_and_above_the_count() -> None:
    assert join_outcome(_join_step("all"), 0, {}) == "DECIDED"
    assert join_outcome(_join_step("any"), 0, {}) == "FAILED"
    assert join_outcome(_join_step(5), 3, {}) == "FAILED"  # a fan-out with fewer items than n


def test_join_outcome_refuses_inconsistent_input() -> None:
    step = _join_step("all")
    with pytest.raises(ValueError, match="2 branch results for 1 branches"):
        join_outcome(step, 1, {"a": _done("COMPLETED"), "b": _done("COMPLETED")})
    with pytest.raises(ValueError, match="unknown status"):
        join_outcome(step, 1, {"a": _done("SUPERSEDED")})
    with pytest.raises(ValueError, match="expected must be a count"):
        join_outcome(step, -1, {})
    with pytest.raises(TypeError, match="not a join"):
        join_outcome(Step("done", "end"), 1, {})


# -- call_payload ------------------------------------------------------------


def _call_step(payload: Any = None) -> Step:
    return Step("ship", "call", call=CallSpec("shipping", on_completed="done", payload=payload))


def test_call_payload_without_a_callable_is_empty() -> None:
    assert call_payload(_call_step(), {"secret": SECRET}, ctx()) == {}


def test_call_payload_calls_with_state_and_ctx_and_copies() -> None:
    line = {"sku": "A"}
    step = Fulfilment.plan().steps["ship_line"]
    payload = call_payload(step, Order(), ctx("ship_line", branch_id="A", branch_item=line))
    assert payload == {"line": {"sku": "A"}, "branch": "A"}
    payload["line"]["sku"] = "changed"
    assert line == {"sku": "A"}
    assert call_payload(_call_step(lambda state: {"n": state["n"]}), {"n": 1}, ctx()) == {"n": 1}


@pytest.mark.parametrize(
    ("payload", "rule"),
    [
        (lambda s: [SECRET], "payload of call step 'ship' must return a dict, not list"),
        (lambda s: None, "must return a dict, not NoneType"),
        (lambda s: {"a": {SECRET}}, "call step 'ship': payload.a holds a set"),
        (lambda s: {1: SECRET}, "call step 'ship': payload"),
    ],
)
def test_call_payload_refuses_what_is_no_json_object(payload: Any, rule: str) -> None:
    with pytest.raises(TypeError) as caught:
        call_payload(_call_step(payload), {}, ctx())
    assert rule in str(caught.value)
    assert SECRET not in str(caught.value)


def test_call_payload_of_a_step_that_is_no_call() -> None:
    with pytest.raises(TypeError, match="not a call"):
        call_payload(Step("done", "end"), {}, ctx())
