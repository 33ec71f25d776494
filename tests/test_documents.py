"""Workflow documents: each compiles to the plan of its code twin, and runs like it.

Every document under ``tests/documents/`` mirrors a workflow of
``tests/flows/workflows.py`` (YAML, and the same in JSON). The hash rule:
document and code compile to the same plan hash and name binding. The
compiled plan then runs through the normal API in place of the code plan and
reaches the same end.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import vertique_workflow as wf
from tests.flows import workflows as flows
from vertique_workflow import registry
from vertique_workflow.definitions import (
    Plan,
    Retry,
    StepContext,
    Workflow,
    action,
    call,
    catalog,
    decision,
    end,
    fork,
    join,
    task,
    timer,
    wait,
)
from vertique_workflow.definitions.documents import (
    DocumentError,
    compile_document,
    document_format_of,
    document_schema,
    register_callable,
    register_type,
)
from vertique_workflow.models import WorkflowTask
from vertique_workflow.pins import resident_plan
from vertique_workflow.testing import advance_time, run_until_idle

DOCUMENTS = Path(__file__).parent / "documents"

# The names the documents use beyond Workflow methods (which need no registration).
register_type(flows.Expense, name="Expense")
register_callable(flows._collect)  # by its default name, tests.flows.workflows._collect
register_callable(flows._collect, name="collect")  # and by an alias
register_callable(flows.ReviewFlow.plan().steps["review"].task.assignee, name="review.manager")  # type: ignore[union-attr]
register_callable(
    flows.StableReviewFlow.plan().steps["review"].task.subject_version,  # type: ignore[union-attr]
    name="stable-review.revision",
)

TWINS: dict[str, type[Workflow[Any]]] = {
    "order": flows.OrderFlow,
    "expense-approval": flows.ExpenseApproval,
    "receipt-wait": flows.ReceiptFlow,
    "nap": flows.NapFlow,
    "alarm": flows.AlarmFlow,
    "review": flows.ReviewFlow,
    "stable-review": flows.StableReviewFlow,
    "parallel": flows.ParallelFlow,
    "race": flows.RaceFlow,
    "partial": flows.PartialFlow,
    "fan": flows.FanFlow,
    "nested": flows.NestedFlow,
    "parent": flows.ParentFlow,
    "fan-call": flows.FanCallFlow,
    "policy": flows.PolicyFlow,
}


def load(name: str, format: str = "yaml") -> Plan:
    path = DOCUMENTS / f"{name}.{format}"
    return compile_document(
        path.read_text("utf-8"), format=document_format_of(path.name), source=path.name
    )


@pytest.mark.parametrize("format", ["yaml", "json"])
@pytest.mark.parametrize("name", sorted(TWINS))
def test_a_document_compiles_to_the_plan_of_its_code_twin(name: str, format: str) -> None:
    code = TWINS[name].plan()
    plan = load(name, format)
    assert plan.canonical() == code.canonical()
    assert (plan.plan_hash, plan.name_binding) == (code.plan_hash, code.name_binding)
    assert list(plan.steps) == list(code.steps), "declaration order kept (diagrams, listings)"


def test_every_document_file_has_a_yaml_and_a_json_form_and_a_twin() -> None:
    stems = {path.stem for path in DOCUMENTS.iterdir() if path.suffix in (".yaml", ".json")}
    assert stems == {*TWINS, "kitchen-sink"}
    for stem in stems:
        assert (DOCUMENTS / f"{stem}.yaml").exists() and (DOCUMENTS / f"{stem}.json").exists()


def test_the_dataclass_state_type_is_bound_by_its_binary_name_whatever_alias_names_it() -> None:
    plan = load("expense-approval")
    assert plan.state_type is flows.Expense
    assert plan.state_type_name == "tests.flows.workflows.Expense"
    assert plan.name_binding == {"tests.flows.workflows.Expense": "tests.flows.workflows.Expense"}


def test_an_alias_hashes_the_callables_own_name_not_the_alias() -> None:
    by_alias = load("partial").steps["joined"].join
    by_name = load("parallel").steps["joined"].join
    assert by_alias is not None and by_name is not None
    assert by_alias.merge is by_name.merge is flows._collect
    assert by_alias.merge_name == by_name.merge_name == "tests.flows.workflows._collect"
    review = load("review").steps["review"].task
    assert review is not None
    assert review.assignee_name == "tests.flows.workflows.ReviewFlow.<lambda>"


def test_the_shipped_schema_is_package_data_and_admits_every_test_document() -> None:
    from importlib import resources

    from jsonschema import Draft202012Validator

    text = (
        resources.files("vertique_workflow.schemas")
        .joinpath("workflow-document.schema.json")
        .read_text("utf-8")
    )
    schema = json.loads(text)
    assert schema == document_schema()
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    for path in DOCUMENTS.glob("*.json"):
        assert list(validator.iter_errors(json.loads(path.read_text("utf-8")))) == [], path.name


def test_document_format_of_goes_by_the_extension() -> None:
    assert [document_format_of(n) for n in ("a.yaml", "b.YML", "c/d.json")] == [
        "yaml",
        "yaml",
        "json",
    ]
    with pytest.raises(DocumentError) as caught:
        document_format_of("notes.txt")
    assert caught.value.source == "notes.txt"


def test_format_yml_is_yaml_and_an_unknown_format_is_refused() -> None:
    text = (DOCUMENTS / "nap.yaml").read_text("utf-8")
    assert compile_document(text, format="yml").plan_hash == flows.NapFlow.plan().plan_hash
    with pytest.raises(DocumentError, match="unknown document format 'toml'"):
        compile_document(text, format="toml")


# -- every option of the DSL: a kitchen-sink workflow and its document ---------------


class OrderGone(Exception):
    """An exception class a retry policy never retries (registered as a type)."""


register_type(OrderGone)


def line_key(item: dict[str, Any]) -> str:
    return str(item["sku"])


def lines_of(state: dict[str, Any]) -> list[Any]:
    return list(state.get("lines", []))


register_callable(line_key, name="sku")
register_callable(lines_of)


class KitchenSink(Workflow[dict]):
    """Options the test flows leave out: fork key/each callable/max_branches, call version,
    people callables, decision without ctx, retry with durations and never, timer until a
    staticmethod, wait apply by method."""

    id, version, contract = "kitchen-sink", 3, "kitchen.sink"
    signals = {"go": {"type": "object"}, "stop": None}
    start_schema = {"type": "object"}

    @decision(targets=["lines", "hold"], start=True, retry=Retry(max_attempts=3))
    def route(self, state: dict[str, Any]) -> str:
        return "lines" if state.get("lines") else "hold"

    hold = wait(
        "go",
        "stop",
        on={"stop": "stopped"},
        next="later",
        apply="fold",
        timeout="1d12h",
        on_timeout="stopped",
        retry=Retry(backoff="5s", max_backoff="1m", never=(OrderGone, KeyError)),
    )

    def fold(self, state: dict[str, Any], name: str, payload: Any, ctx: StepContext) -> Any:
        return {**state, "folded": name}

    later = timer(until="wake_at", next="approve")

    @staticmethod
    def wake_at(state: dict[str, Any]) -> str:
        return "2030-01-01T00:00:00+00:00"

    def manager_of(self, state: dict[str, Any]) -> str:
        return str(state["manager"])

    def helpers(self, state: dict[str, Any], ctx: StepContext) -> list[str]:
        return ["ann"]

    approve = task(
        assignee=manager_of,
        candidate_users=helpers,
        candidate_groups=["finance", "audit"],
        decisions={"ok": "stopped"},
        title="Approve",
    )
    lines = fork(each=lines_of, start="ship", join="shipped", key=line_key, max_branches=50)
    ship = call("shipping", version=2, payload="ship_payload", on_completed="shipped")

    def ship_payload(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {"line": ctx.branch_item}

    shipped = join(policy="any", next="stopped")

    @action(next="done")
    def stopped(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return state

    done = end()


@pytest.mark.parametrize("format", ["yaml", "json"])
def test_every_dsl_option_has_its_document_form(format: str) -> None:
    code = KitchenSink.plan()
    plan = load("kitchen-sink", format)
    assert plan.canonical() == code.canonical()
    assert (plan.plan_hash, plan.name_binding) == (code.plan_hash, code.name_binding)


def test_a_registered_function_taking_only_the_state_is_a_decision_callback() -> None:
    @register_callable(name="tests.documents.always_done")
    def always_done(state: dict[str, Any]) -> str:
        return "done"

    text = (
        "id: doc-only\nversion: 1\nsteps:\n"
        "  route: {kind: decision, callback: tests.documents.always_done, targets: [done]}\n"
        "  done: {kind: end}\n"
    )
    step = compile_document(text).steps["route"]
    assert step.callback_name == f"{__name__}.{always_done.__qualname__}"
    assert step.callback is not None and step.callback({}, None) == "done"


def test_registering_another_callable_under_a_taken_name_is_refused() -> None:
    with pytest.raises(wf.WorkflowDefinitionError, match="already registered"):
        register_callable(lambda state: state, name="collect")
    assert register_callable(flows._collect, name="collect") is flows._collect, "same: no-op"


# -- the compiled plan runs in place of the code plan ------------------------------------


@pytest.fixture
def as_document() -> Iterator[Callable[[str], Plan]]:
    """Replace the catalog's code plan of a twin by its compiled document (as a node runs it)."""
    originals: list[Plan] = []

    def swap(name: str) -> Plan:
        plan = load(name)
        old = catalog.remove(plan.id, plan.version)
        assert old is not None and old.plan_hash == plan.plan_hash
        originals.append(old)
        assert catalog.register(plan) is plan
        assert resident_plan(plan.id, plan.version) is plan
        return plan

    yield swap
    for old in reversed(originals):
        catalog.remove(old.id, old.version)
        catalog.register(old)
    registry._reset_sync_state()


def run_order(key: str) -> Any:
    ref = wf.start("order", {"amount": 5}, idempotency_key=key)
    run_until_idle()
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key=f"{key}-paid")
    run_until_idle()
    return ref.id


def run_expense(key: str) -> Any:
    ref = wf.start("expense-approval", {"amount": 500}, idempotency_key=key)
    run_until_idle()
    wf.signal(ref.id, "approve", {"by": "ann"}, dedup_key=f"{key}-approve")
    run_until_idle()
    return ref.id


def run_nap(key: str) -> Any:
    ref = wf.start("nap", {}, idempotency_key=key)
    run_until_idle()
    assert advance_time("1h", instance_id=ref.id) == 1
    run_until_idle()
    return ref.id


def run_review(key: str) -> Any:
    ref = wf.start("review", {"manager": "ann"}, idempotency_key=key)
    run_until_idle()
    review = WorkflowTask.objects.get(workflow_id=ref.id)
    assert review.assignee == "ann"
    wf.complete_task(review.id, "reject", {"reason": "no receipt"}, idempotency_key=key)
    run_until_idle()
    return ref.id


def run_parallel(key: str) -> Any:
    ref = wf.start("parallel", {}, idempotency_key=key)
    run_until_idle()
    for branch in ("b", "c"):
        wf.signal(ref.id, "go", None, dedup_key=f"{key}-{branch}", branch=("split", branch))
    run_until_idle()
    return ref.id


def run_fan(key: str) -> Any:
    ref = wf.start("fan", {"items": [1, 2, 3]}, idempotency_key=key)
    run_until_idle()
    return ref.id


def run_parent(key: str) -> Any:
    ref = wf.start("parent", {"fail": True}, idempotency_key=key)
    run_until_idle()
    return ref.id


def run_policy(key: str) -> Any:
    ref = wf.start("policy", {"raise": "key"}, idempotency_key=key)
    run_until_idle()
    return ref.id


SCENARIOS: dict[str, tuple[Callable[[str], Any], str]] = {
    "order": (run_order, "COMPLETED"),
    "expense-approval": (run_expense, "COMPLETED"),
    "nap": (run_nap, "COMPLETED"),
    "review": (run_review, "COMPLETED"),
    "parallel": (run_parallel, "COMPLETED"),
    "fan": (run_fan, "COMPLETED"),
    "parent": (run_parent, "COMPLETED"),
    "policy": (run_policy, "FAILED"),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_compiled_document_runs_to_the_same_end_as_the_code(
    name: str, as_document: Callable[[str], Plan], reset_gates: None
) -> None:
    scenario, status = SCENARIOS[name]
    by_code = wf.get(scenario("by-code"))
    as_document(name)
    by_document = wf.get(scenario("by-document"))
    assert by_code.status == status
    assert (by_document.status, by_document.current_step) == (status, by_code.current_step)
    assert by_document.state == by_code.state
    assert by_document.error_type == by_code.error_type


def test_a_dataclass_document_state_is_rebuilt_as_the_registered_type() -> None:
    plan = load("expense-approval")
    state = plan.state_from_json({"amount": 7})
    assert isinstance(state, flows.Expense)
    assert dataclasses.asdict(state) == {"amount": 7, "approved": False, "approved_by": None}


# -- the service step and compensation in a document --------------------------------------


class PaymentDoc(Workflow[dict]):
    """Every option of ``service`` and a compensation, as code and as a document."""

    id, version, contract = "payment-doc", 1, "payment.doc"

    @action(start=True, next="pay", compensate="release")
    def hold(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return state

    pay = wf.service(
        "test.charge",
        next="done",
        request="pay_request",
        result="note",
        on_failed="declined",
        timeout="20s",
        attempts=7,
        backoff="2s",
        max_backoff="1m",
        retry_on=(OrderGone, ConnectionError),
        result_schema={"type": "object", "required": ["charge_id"]},
        compensate="refund",
    )

    def pay_request(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"amount": state.get("amount", 0)}

    def note(self, state: dict[str, Any], outcome: Any, ctx: StepContext) -> dict[str, Any]:
        return state

    refund = wf.service("test.charge")

    @action()
    def release(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return state

    declined = wf.fail(reason="DECLINED")
    done = end()


PAYMENT_DOC = """
id: payment-doc
version: 1
contract: payment.doc
steps:
  hold: {kind: action, callback: tests.test_documents.PaymentDoc.hold, next: pay,
         compensate: release}
  pay:
    kind: service
    handler: test.charge
    next: done
    request: tests.test_documents.PaymentDoc.pay_request
    result: tests.test_documents.PaymentDoc.note
    on_failed: declined
    timeout: 20s
    attempts: 7
    backoff: 2s
    max_backoff: 1m
    retry_on: [tests.test_documents.OrderGone, ConnectionError]
    result_schema: {type: object, required: [charge_id]}
    compensate: refund
  refund: {kind: service, handler: test.charge}
  release: {kind: action, callback: tests.test_documents.PaymentDoc.release}
  declined: {kind: fail, reason: DECLINED}
  done: {kind: end}
"""


def test_a_service_step_and_compensations_have_their_document_form() -> None:
    code = PaymentDoc.plan()
    plan = compile_document(PAYMENT_DOC)
    assert plan.canonical() == code.canonical()
    assert plan.plan_hash == code.plan_hash
    spec = plan.steps["pay"].service
    assert spec is not None and spec.retry_on == (OrderGone, ConnectionError)
    assert spec.request is not None and spec.request({"amount": 3}, None) == {"amount": 3}


def test_a_service_document_naming_an_unknown_exception_points_at_it() -> None:
    text = PAYMENT_DOC.replace("tests.test_documents.OrderGone", "no.such.Error")
    with pytest.raises(DocumentError, match=r"unknown exception class 'no\.such\.Error'") as caught:
        compile_document(text)
    assert "retry_on" in str(caught.value)
