"""The startup evaluation of scope rows and the starts a node refuses from it.

Every non-retired DOCUMENT row of a scope other than default is evaluated on
this node: ``NAME_BINDING_UNRESOLVED`` when a class its name binding names
does not import here, ``STATE_TYPE_NOT_EXTENDED`` when its state type is not
the default scope's state class (or a subclass). The verdict is written to
``failure_reason`` (or cleared), and a start of a failing row is refused by
this node's own verdict, never by the column.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import vertique_workflow as wf
from vertique_workflow import document_plans, registry, scope_rules
from vertique_workflow.exceptions import DefinitionUnavailable, WorkflowConflict
from vertique_workflow.models import WorkflowDefinition, WorkflowInstance
from vertique_workflow.store import definitions as store
from vertique_workflow.store import documents

from .conftest import table_counts
from .test_registry import FakePlan, new_id


class Parcel:
    """The default scope's state class."""


class EuParcel(Parcel):
    """A scope's state class that extends it."""


class Unrelated:
    """A scope's state class that does not."""


PARCEL = f"{__name__}.Parcel"
EU_PARCEL = f"{__name__}.EuParcel"
UNRELATED = f"{__name__}.Unrelated"
LATER = f"{__name__}.Later"  # not defined (yet): the class does not import here


@dataclasses.dataclass(frozen=True)
class TypedPlan(FakePlan):
    """A plan whose state type is bound by name (the binding the hash used)."""

    name_binding: dict[str, str] = dataclasses.field(default_factory=dict)


def typed(definition_id: str, version: int, state: str | None) -> TypedPlan:
    if state is None:
        return TypedPlan(definition_id, version)  # a dict state binds no class
    return TypedPlan(definition_id, version, state_type_name=state, name_binding={state: state})


def default_row(definition_id: str, state: str | None) -> None:
    store.upsert_code(typed(definition_id, 1, state))


def scope_row(
    definition_id: str, state: str | None, version: int = 1, status: str = "AVAILABLE"
) -> None:
    documents.insert_candidate("eu", typed(definition_id, version, state), "t", "yaml")
    WorkflowDefinition.objects.filter(
        scope_key="eu", definition_id=definition_id, definition_version=version
    ).update(status=status)
    if status == "AVAILABLE":  # new starts in eu run it (not the default activation)
        store.put_activation("eu", definition_id, "eu", version)


def failure(definition_id: str, version: int = 1) -> str | None:
    record = store.find_definition("eu", definition_id, version)
    assert record is not None
    return record.failure_reason


def start_in_eu(definition_id: str) -> wf.InstanceRef:
    return wf.start(definition_id, {}, idempotency_key=f"k-{new_id()}", scope="eu")


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> Iterator[None]:
    scope_rules._reset()
    document_plans._reset()
    yield
    scope_rules._reset()
    document_plans._reset()


@pytest.mark.django_db
def test_a_scope_state_type_that_does_not_extend_the_default_class_is_marked_and_refused():
    unrelated, extended, dict_state, dict_default = (new_id() for _ in range(4))
    for definition_id in (unrelated, extended, dict_state):
        default_row(definition_id, PARCEL)
    default_row(dict_default, None)
    scope_row(unrelated, UNRELATED)
    scope_row(unrelated, UNRELATED, version=2, status="RETIRED")
    scope_row(extended, EU_PARCEL)
    scope_row(dict_state, None)
    scope_row(dict_default, EU_PARCEL)

    verdicts = scope_rules.evaluate_scope_rows()
    assert {key: verdicts[key] for key in verdicts if key[1] in (unrelated, extended)} == {
        ("eu", unrelated, 1): "STATE_TYPE_NOT_EXTENDED",
        ("eu", extended, 1): None,
    }  # the RETIRED version is not evaluated
    assert verdicts[("eu", dict_state, 1)] == "STATE_TYPE_NOT_EXTENDED"  # a dict extends no class
    assert verdicts[("eu", dict_default, 1)] is None  # a dict default names no class
    record = store.find_definition("eu", unrelated, 1)
    assert record is not None and record.failure is not None
    assert (record.failure.reason, record.failure.detail) == (
        "STATE_TYPE_NOT_EXTENDED",
        store.FAILURE_DESCRIPTIONS["STATE_TYPE_NOT_EXTENDED"],
    )
    assert failure(unrelated, 2) is None and failure(extended) is None
    assert store.find_definition("default", unrelated, 1).failure_reason is None

    before = table_counts()
    with pytest.raises(DefinitionUnavailable) as refused:
        start_in_eu(unrelated)
    assert isinstance(refused.value, WorkflowConflict)
    assert str(refused.value) == (
        f"workflow definition eu/{unrelated} v1 cannot be started on this node: "
        f"STATE_TYPE_NOT_EXTENDED ({store.FAILURE_DESCRIPTIONS['STATE_TYPE_NOT_EXTENDED']})"
    )
    assert refused.value.definition_id == unrelated
    assert table_counts() == before  # nothing written
    ref = start_in_eu(extended)
    assert WorkflowInstance.objects.get(id=ref.id).definition_scope_key == "eu"


@pytest.mark.django_db
def test_an_unresolved_name_binding_is_marked_then_cleared_once_the_class_imports(monkeypatch):
    definition_id = new_id()
    scope_row(definition_id, LATER)
    registry.check_name_bindings()  # a scope row does not stop the node: it is evaluated
    assert scope_rules.evaluate_scope_rows()[("eu", definition_id, 1)] == (
        "NAME_BINDING_UNRESOLVED"
    )
    assert failure(definition_id) == "NAME_BINDING_UNRESOLVED"
    with pytest.raises(DefinitionUnavailable, match="NAME_BINDING_UNRESOLVED"):
        start_in_eu(definition_id)

    # this node's code now has the class (a deploy): the next evaluation clears the mark
    monkeypatch.setattr(sys.modules[__name__], "Later", type("Later", (), {}), raising=False)
    assert scope_rules.evaluate_scope_rows()[("eu", definition_id, 1)] is None
    assert failure(definition_id) is None
    assert start_in_eu(definition_id).definition_version == 1


@pytest.mark.django_db
def test_an_unresolved_binding_comes_before_the_state_type_rule():
    definition_id = new_id()
    default_row(definition_id, PARCEL)
    scope_row(definition_id, LATER)
    assert scope_rules.evaluate_scope_rows()[("eu", definition_id, 1)] == (
        "NAME_BINDING_UNRESOLVED"
    )


@pytest.mark.django_db
def test_the_refusal_is_this_nodes_own_verdict_not_the_stored_column():
    fits, breaks = new_id(), new_id()
    for definition_id in (fits, breaks):
        default_row(definition_id, PARCEL)
    scope_row(fits, EU_PARCEL)
    scope_row(breaks, UNRELATED)
    # another node (other code) marked the row that fits here; nobody marked the other yet
    documents.record_failure("eu", fits, 1, "STATE_TYPE_NOT_EXTENDED")

    # this process never ran the startup evaluation: the first start evaluates the row
    assert start_in_eu(fits).definition_version == 1
    assert failure(fits) == "STATE_TYPE_NOT_EXTENDED"  # a start writes no mark
    with pytest.raises(DefinitionUnavailable, match="STATE_TYPE_NOT_EXTENDED"):
        start_in_eu(breaks)
    assert failure(breaks) is None

    # the startup evaluation rewrites both columns with this node's verdicts
    scope_rules.evaluate_scope_rows()
    assert (failure(fits), failure(breaks)) == (None, "STATE_TYPE_NOT_EXTENDED")


@pytest.mark.django_db
def test_the_startup_sync_evaluates_the_scope_rows():
    definition_id = new_id()
    default_row(definition_id, PARCEL)
    scope_row(definition_id, UNRELATED)
    registry._reset_sync_state()
    try:
        assert registry.ensure_synced() is not None
    finally:
        registry._reset_sync_state()
    assert failure(definition_id) == "STATE_TYPE_NOT_EXTENDED"
    with pytest.raises(DefinitionUnavailable, match="STATE_TYPE_NOT_EXTENDED"):
        start_in_eu(definition_id)


def test_broken_rule_is_pure_and_reads_the_binding_the_hash_used():
    def rule_row(scope: str, state: str, binding: dict[str, Any]) -> store.RuleRow:
        return store.RuleRow(scope, "x", 1, "DOCUMENT", "AVAILABLE", state, "h", binding, None)

    base = rule_row("default", "parcel.state", {PARCEL: "parcel.state"})  # a logical name
    assert (
        scope_rules.broken_rule(rule_row("eu", "eu.state", {EU_PARCEL: "eu.state"}), [base]) is None
    )
    assert (
        scope_rules.broken_rule(rule_row("eu", "u.state", {UNRELATED: "u.state"}), [base])
        == "STATE_TYPE_NOT_EXTENDED"
    )
    # a state class that cannot be looked up by name binds nothing: nothing to compare
    assert scope_rules.broken_rule(rule_row("eu", "local.Thing", {}), [base]) is None
    assert scope_rules.broken_rule(rule_row("eu", EU_PARCEL, {EU_PARCEL: EU_PARCEL}), []) is None
