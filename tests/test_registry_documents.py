"""DOCUMENT rows of the registry: storage, publication, packaged documents, document plans.

Everything runs against the real PostgreSQL of the suite. The registry
tests are about storage and lifecycle, not the document format: a
``documents`` fixture stands in for the compiler (each document text maps to
a plan built from code), so the tests choose exactly the plan a text
compiles to on "this node" -- including a node whose catalog disagrees.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

import vertique_workflow as wf
from vertique_workflow import document_plans, registry, tables
from vertique_workflow.definitions import Plan, StepContext, Workflow, action, end, wait
from vertique_workflow.exceptions import (
    ContractMismatch,
    DocumentDrift,
    DocumentTooLarge,
    WorkflowConflict,
    WorkflowDefinitionError,
    WorkflowPersistenceError,
    WorkflowValidationError,
)
from vertique_workflow.models import WorkflowDefinition, WorkflowInstance
from vertique_workflow.store import definitions as store
from vertique_workflow.store import documents
from vertique_workflow.testing import run_until_idle

from .conftest import connect, run_manage
from .test_registry import (
    FakePlan,
    activation,
    finish,
    hold,
    lock_timeout,
    new_id,
    pinned_instance,
    release_when_all_wait,
    row,
    row_versions,
    rows,
    run_threads,
    waiting_advisory_locks,
)

T = tables.sql_names()
STATUSES = ("CANDIDATE", "PUBLISHING", "AVAILABLE", "DEPRECATED", "RETIRED")
ALLOWED = {("AVAILABLE", "DEPRECATED"), ("DEPRECATED", "AVAILABLE"), ("RETIRED", "AVAILABLE")}


# --------------------------------------------------------------------------
# Plans built from code, and a stand-in compiler
# --------------------------------------------------------------------------


class DocFlow(Workflow[dict]):
    """What document version 1 compiles to: marks the version, waits for "go"."""

    id, version, contract = "doc-flow", 1, "doc-flow.v1"
    signals = {"go": None}

    @action(start=True, next="wait_go")
    def begin(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "ran": "v1"}

    wait_go = wait("go", next="done")
    done = end()


class DocFlowV2(Workflow[dict]):
    """Version 2: another action, same contract."""

    id, version, contract = "doc-flow", 2, "doc-flow.v1"
    signals = {"go": None}

    @action(start=True, next="wait_go")
    def begin(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "ran": "v2"}

    wait_go = wait("go", next="done")
    done = end()


def doc_plan(definition_id: str, version: int = 1, **fields: Any) -> Plan:
    """A real plan of ``definition_id`` (DocFlow's steps; v2 runs DocFlowV2's action)."""
    base = DocFlowV2.plan() if version >= 2 else DocFlow.plan()
    return dataclasses.replace(base, id=definition_id, version=version, **fields)


class Documents:
    """Document texts and the plans they compile to on this node."""

    def __init__(self) -> None:
        self.plans: dict[str, Any] = {}
        self.compiled: list[str] = []

    def text(self, plan: Any, note: str = "") -> str:
        text = f"# {plan.id} v{plan.version} {plan.plan_hash}{note}\nid: {plan.id}\n"
        self.plans[text] = plan
        return text

    def compile(self, text: str, *, document_format: str, source: str | None = None) -> Any:
        self.compiled.append(text)
        if text not in self.plans:
            raise WorkflowDefinitionError("the stand-in compiler does not know this text")
        return self.plans[text]


@pytest.fixture
def docs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Documents]:
    found = Documents()
    monkeypatch.setattr(document_plans, "compile_text", found.compile)
    document_plans._reset()
    yield found
    document_plans._reset()


def store_document(plan: Any, docs: Documents, scope: str = "eu", status: str = "AVAILABLE") -> str:
    """A DOCUMENT row of ``plan`` in ``status`` (written as a candidate, then moved in SQL)."""
    text = docs.text(plan)
    documents.insert_candidate(scope, plan, text, "yaml", "docs/flow.yaml")
    if status != "CANDIDATE":
        token = uuid.uuid4() if status == "PUBLISHING" else None
        WorkflowDefinition.objects.filter(
            scope_key=scope, definition_id=plan.id, definition_version=plan.version
        ).update(status=status, publish_token=token)
    return text


def tamper(scope: str, definition_id: str, version: int, sql_set: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {T['definitions']} SET {sql_set} "
            "WHERE scope_key = %s AND definition_id = %s AND definition_version = %s",
            [*params, scope, definition_id, version],
        )


# --------------------------------------------------------------------------
# insert_candidate
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_candidate_is_written_with_its_digest_binding_and_schemas(django_assert_num_queries):
    plan = FakePlan(new_id(), 1, signals={"go": None})
    text = "id: x\nnote: caf\u00e9 \u2603\n"
    record = documents.insert_candidate("eu", plan, text, "yaml", "docs/x.yaml")
    assert (record.scope_key, record.kind, record.status) == ("eu", "DOCUMENT", "CANDIDATE")
    assert record.document_digest == documents.digest(text)
    assert record.document_digest == record.document_digest.lower()
    stored = row(plan.id, 1, "eu")
    assert stored.document_text == text
    assert (stored.document_format, stored.source_location) == ("yaml", "docs/x.yaml")
    assert stored.plan_hash == plan.plan_hash
    assert stored.signal_names_json == {"go": None}
    assert stored.name_binding == {}
    assert stored.publish_token is None
    found = documents.find_document("eu", plan.id, 1)
    assert found is not None and found.text == text and found.record == record
    # a second load of the version writes nothing
    before = row_versions(plan.id)
    with pytest.raises(WorkflowConflict, match="already exists"):
        documents.insert_candidate("eu", plan, text, "yaml")
    assert row_versions(plan.id) == before


@dataclasses.dataclass(frozen=True)
class BoundPlan(FakePlan):
    """A plan naming a class by its binary name."""

    name_binding: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"app.models.Thing": "app.Thing"}
    )


@pytest.mark.django_db
def test_a_candidate_writes_the_name_binding_with_the_hash():
    plan = BoundPlan(new_id(), 1, state_type_name="app.Thing")
    documents.insert_candidate("eu", plan, "t", "json")
    stored = row(plan.id, 1, "eu")
    assert stored.name_binding == {"app.models.Thing": "app.Thing"}
    assert (stored.plan_hash, stored.document_format) == (plan.plan_hash, "json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "document_format", "error"),
    [
        ("a\x00b", "yaml", "NUL"),
        ("bad \ud800", "yaml", "lone surrogate"),
        ("fine", "toml", "not one of yaml, json"),
    ],
)
def test_bad_text_is_refused_before_any_statement(
    text, document_format, error, django_assert_num_queries
):
    with django_assert_num_queries(0), pytest.raises(WorkflowValidationError, match=error):
        documents.insert_candidate("eu", FakePlan(new_id(), 1), text, document_format)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("changed", "rule"),
    [
        ({"contract": "other.v1"}, store.CONTRACT_RULE),
        ({"state_type_name": "T"}, store.STATE_TYPE_RULE),
    ],
)
def test_candidates_follow_the_contract_and_state_type_rules_of_their_scope(changed, rule):
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "v1", "yaml")
    before = row_versions(definition_id)
    with pytest.raises(WorkflowDefinitionError, match=rule) as refused:
        documents.insert_candidate("eu", FakePlan(definition_id, 2, **changed), "v2", "yaml")
    assert not isinstance(refused.value, ContractMismatch)
    assert f"eu/{definition_id} v2" in str(refused.value)
    assert row_versions(definition_id) == before
    # other scopes and retired versions take no part
    documents.insert_candidate("us", FakePlan(definition_id, 2, **changed), "v2", "yaml")
    store.retire("eu", definition_id, 1)
    documents.insert_candidate("eu", FakePlan(definition_id, 2, **changed), "v2", "yaml")
    assert rows(definition_id) == [
        ("eu", 1, "RETIRED"),
        ("eu", 2, "CANDIDATE"),
        ("us", 2, "CANDIDATE"),
    ]


@pytest.mark.django_db
def test_the_default_scope_contract_rule_for_a_scopes_first_row():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1, contract="thing.v1"))
    store.remove_activation("default", definition_id)
    store.transition("default", definition_id, 1, "AVAILABLE", "DEPRECATED")
    store.retire("default", definition_id, 1)
    before = row_versions(definition_id)
    # the default scope holds the id (in any status, RETIRED here) under another contract
    with pytest.raises(ContractMismatch, match=r"thing\.v1"):
        documents.insert_candidate("eu", FakePlan(definition_id, 1, contract="eu.v1"), "t", "yaml")
    assert row_versions(definition_id) == before
    # the same contract is accepted ...
    documents.insert_candidate("eu", FakePlan(definition_id, 1, contract="thing.v1"), "t", "yaml")
    # ... and once the scope holds a row of the id (any status) the rule no longer applies
    store.retire("eu", definition_id, 1)
    documents.insert_candidate("eu", FakePlan(definition_id, 2, contract="eu.v1"), "t", "yaml")
    # a default-scope insert is never refused for the rows of other scopes
    documents.insert_candidate("default", FakePlan(definition_id, 7, contract="x.v9"), "t", "yaml")
    assert rows(definition_id) == [
        ("default", 1, "RETIRED"),
        ("default", 7, "CANDIDATE"),
        ("eu", 1, "RETIRED"),
        ("eu", 2, "CANDIDATE"),
    ]


@pytest.mark.django_db
def test_a_code_row_under_the_key_refuses_the_candidate_and_the_other_way_round():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    with pytest.raises(WorkflowConflict, match="already exists \\(CODE"):
        documents.insert_candidate("default", FakePlan(definition_id, 1), "t", "yaml")
    with pytest.raises(WorkflowDefinitionError, match="CODE row"):
        documents.upsert_document("default", FakePlan(definition_id, 1), "t", "yaml")
    documents.insert_candidate("default", FakePlan(definition_id, 2), "t", "yaml")
    with pytest.raises(WorkflowDefinitionError, match="DOCUMENT"):
        store.upsert_code(FakePlan(definition_id, 2))


# --------------------------------------------------------------------------
# upsert_document (packaged documents)
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_upsert_document_outcomes_and_drift():
    definition_id = new_id()
    v1 = FakePlan(definition_id, 1)
    assert documents.upsert_document("default", v1, "v1 text", "yaml", "d/v1.yaml") == "INSERTED"
    assert row(definition_id, 1).status == "AVAILABLE"
    assert row(definition_id, 1).kind == "DOCUMENT"
    assert activation(definition_id) == ("default", 1)
    before = row_versions(definition_id)
    assert documents.upsert_document("default", v1, "v1 text", "yaml") == "UNCHANGED"
    # the same plan hash with another text: drift, nothing written
    with pytest.raises(DocumentDrift, match="drift") as drift:
        documents.upsert_document("default", v1, "v1 text, edited", "yaml")
    assert "edited" not in str(drift.value)
    # another plan under the version: a conflict, nothing written
    with pytest.raises(WorkflowDefinitionError, match="another plan hash"):
        documents.upsert_document("default", FakePlan(definition_id, 1, structure="b"), "x", "yaml")
    assert row_versions(definition_id) == before
    # a higher version moves the record, a lower one never does
    documents.upsert_document("default", FakePlan(definition_id, 3), "v3", "yaml")
    assert activation(definition_id) == ("default", 3)
    assert documents.upsert_document("default", FakePlan(definition_id, 2), "v2", "yaml") == (
        "INSERTED"
    )
    assert activation(definition_id) == ("default", 3)
    # a restart (UNCHANGED) never undoes an operator's choice
    store.put_activation("default", definition_id, "default", 1)
    assert documents.upsert_document("default", FakePlan(definition_id, 3), "v3", "yaml") == (
        "UNCHANGED"
    )
    assert activation(definition_id) == ("default", 1)


@pytest.mark.django_db
def test_upsert_document_without_activation_and_in_another_scope():
    definition_id = new_id()
    plan = FakePlan(definition_id, 1)
    documents.upsert_document("default", plan, "t", "json", activate_default=False)
    assert activation(definition_id) is None
    documents.upsert_document("eu", FakePlan(definition_id, 2), "t2", "yaml")
    assert row(definition_id, 2, "eu").status == "AVAILABLE"
    assert activation(definition_id) is None
    assert activation(definition_id, "eu") is None
    with pytest.raises(WorkflowDefinitionError, match=store.CONTRACT_RULE):
        documents.upsert_document("eu", FakePlan(definition_id, 3, contract="z.v1"), "t3", "yaml")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("orders", [((1, 2), (2, 1)), ((2, 1), (1, 2))])
def test_concurrent_first_boots_with_documents_activate_the_highest_once(holder, orders):
    definition_id = new_id()
    plans = {version: FakePlan(definition_id, version) for version in (1, 2)}

    def boot(node: int) -> list[str]:
        return [
            documents.upsert_document("default", plans[v], f"v{v}", "yaml") for v in orders[node]
        ]

    hold(holder, definition_id)
    with lock_timeout(120_000):
        threads, results, errors = run_threads(2, boot)
        release_when_all_wait(holder, 2)
        finish(threads)
    assert errors == []
    assert sorted(outcome for node in results for outcome in node) == [
        "INSERTED",
        "INSERTED",
        "UNCHANGED",
        "UNCHANGED",
    ]
    assert rows(definition_id) == [("default", 1, "AVAILABLE"), ("default", 2, "AVAILABLE")]
    assert activation(definition_id) == ("default", 2)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {T['definition_activations']} WHERE definition_id = %s",
            [definition_id],
        )
        assert cursor.fetchone() == (1,)


# --------------------------------------------------------------------------
# Publication
# --------------------------------------------------------------------------


def publishing(definition_id: str, scope: str = "eu") -> tuple[str, Any, Any]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT status, publish_token, publish_claimed_at FROM {T['definitions']} "
            "WHERE scope_key = %s AND definition_id = %s AND definition_version = 1",
            [scope, definition_id],
        )
        return cursor.fetchone()


def age_claim(definition_id: str, seconds: int) -> None:
    """Make the claim ``seconds`` old by the database clock (no sleeping)."""
    tamper(
        "eu",
        definition_id,
        1,
        "publish_claimed_at = clock_timestamp() - make_interval(secs => %s)",
        [seconds],
    )


@pytest.mark.django_db
def test_claim_complete_and_obsolete_completion():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    token = documents.claim_publication("eu", definition_id, 1)
    assert isinstance(token, uuid.UUID)
    status, stored_token, claimed_at = publishing(definition_id)
    assert (status, stored_token) == ("PUBLISHING", token)
    assert claimed_at is not None
    with pytest.raises(WorkflowConflict, match=r"INVALID_TRANSITION.*another claim"):
        documents.claim_publication("eu", definition_id, 1)
    with pytest.raises(WorkflowConflict, match="obsolete"):
        documents.complete_publication("eu", definition_id, 1, uuid.uuid4())
    record = documents.complete_publication("eu", definition_id, 1, token)
    assert record.status == "AVAILABLE"
    assert publishing(definition_id) == ("AVAILABLE", None, None)
    with pytest.raises(WorkflowConflict, match="obsolete"):
        documents.complete_publication("eu", definition_id, 1, token)
    with pytest.raises(WorkflowConflict, match="is AVAILABLE, not CANDIDATE"):
        documents.claim_publication("eu", definition_id, 1)
    assert documents.release_publication("eu", definition_id, 1, token) is False
    assert publishing(definition_id)[0] == "AVAILABLE"


@pytest.mark.django_db
def test_release_returns_the_row_to_candidate_and_an_obsolete_release_is_a_no_op():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    token = documents.claim_publication("eu", definition_id, 1)
    assert documents.release_publication("eu", definition_id, 1, token) is True
    assert publishing(definition_id) == ("CANDIDATE", None, None)
    before = row_versions(definition_id)
    assert documents.release_publication("eu", definition_id, 1, token) is False
    assert row_versions(definition_id) == before
    again = documents.claim_publication("eu", definition_id, 1)
    assert again != token
    assert documents.release_publication("eu", definition_id, 1, token) is False
    assert publishing(definition_id)[:2] == ("PUBLISHING", again)


@pytest.mark.django_db
def test_a_stale_claim_is_claimed_again_by_the_database_clock():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    first = documents.claim_publication("eu", definition_id, 1)
    age_claim(definition_id, 30)  # younger than the 60 s default: still held
    with pytest.raises(WorkflowConflict, match="another claim"):
        documents.claim_publication("eu", definition_id, 1)
    age_claim(definition_id, 60)  # "at least" the timeout: stale
    second = documents.claim_publication("eu", definition_id, 1)
    assert second != first
    assert publishing(definition_id)[:2] == ("PUBLISHING", second)
    # the first publisher's completion is obsolete; its release changes nothing
    with pytest.raises(WorkflowConflict, match="obsolete"):
        documents.complete_publication("eu", definition_id, 1, first)
    assert documents.release_publication("eu", definition_id, 1, first) is False
    assert publishing(definition_id)[:2] == ("PUBLISHING", second)
    assert documents.complete_publication("eu", definition_id, 1, second).status == "AVAILABLE"


@pytest.mark.django_db
def test_the_stale_age_is_the_setting():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    documents.claim_publication("eu", definition_id, 1)
    age_claim(definition_id, 10)
    options = {**settings.VERTIQUE_WORKFLOW, "PUBLICATION_CLAIM_TIMEOUT_SECONDS": 5}
    with override_settings(VERTIQUE_WORKFLOW=options):
        documents.claim_publication("eu", definition_id, 1)


@pytest.mark.django_db
def test_claims_refuse_missing_and_code_rows():
    definition_id = new_id()
    with pytest.raises(WorkflowConflict, match="does not exist"):
        documents.claim_publication("eu", definition_id, 1)
    store.upsert_code(FakePlan(definition_id, 1))
    with pytest.raises(WorkflowConflict, match="CODE row"):
        documents.claim_publication("default", definition_id, 1)


@pytest.mark.django_db(transaction=True)
def test_a_claim_waits_for_the_id_lock_and_times_out_retryably(holder):
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    hold(holder, definition_id)
    with lock_timeout(100), pytest.raises(WorkflowPersistenceError) as failed:
        documents.claim_publication("eu", definition_id, 1)
    assert failed.value.retryable is True
    assert failed.value.definition_id == definition_id
    assert publishing(definition_id)[0] == "CANDIDATE"


@pytest.mark.django_db
def test_load_and_publish_register_the_plan_here(docs):
    plan = doc_plan(new_id())
    text = docs.text(plan)
    record = registry.load_document(text, format="yaml", scope="eu", source="eu/flow.yaml")
    assert (record.status, record.source_location) == ("CANDIDATE", "eu/flow.yaml")
    assert document_plans.cached("eu", plan.id, 1) is None
    published = registry.publish(plan.id, 1, scope="eu")
    assert published.status == "AVAILABLE"
    assert publishing(plan.id) == ("AVAILABLE", None, None)
    assert document_plans.cached("eu", plan.id, 1) is plan
    assert ("eu", plan.id, 1) in document_plans.resident_pins()


@pytest.mark.django_db
def test_a_bad_document_writes_nothing(docs):
    with pytest.raises(WorkflowDefinitionError, match="stand-in compiler"):
        registry.load_document("not a known text", format="yaml", scope="eu")
    assert not WorkflowDefinition.objects.filter(scope_key="eu").exists()


@pytest.mark.django_db
def test_a_failed_publication_releases_its_claim(docs):
    plan = doc_plan(new_id())
    text = docs.text(plan)
    registry.load_document(text, format="yaml", scope="eu")
    # this node's catalog compiles the stored text to another plan hash
    docs.plans[text] = doc_plan(plan.id, 1, contract="elsewhere.v1")
    with pytest.raises(DocumentDrift, match="compiles on this node"):
        registry.publish(plan.id, 1, scope="eu")
    assert publishing(plan.id) == ("CANDIDATE", None, None)
    assert document_plans.cached("eu", plan.id, 1) is None
    docs.plans[text] = plan
    assert registry.publish(plan.id, 1, scope="eu").status == "AVAILABLE"


# --------------------------------------------------------------------------
# The guarded read: digest and size envelope
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_altered_text_fails_as_drift_and_is_never_returned(docs, caplog):
    plan = doc_plan(new_id())
    store_document(plan, docs)
    tamper("eu", plan.id, 1, "document_text = document_text || %s", ["# injected\n"])
    with pytest.raises(DocumentDrift, match="does not match its document_digest") as drift:
        documents.find_document("eu", plan.id, 1)
    assert "injected" not in str(drift.value)
    # on a node, the pin has no plan: logged once, compiled never
    with caplog.at_level(logging.WARNING, logger="vertique_workflow.registry"):
        assert wf_pins().resident_plan(plan.id, 1, scope="eu") is None
        assert wf_pins().resident_plan(plan.id, 1, scope="eu") is None
    warnings = [r for r in caplog.records if "cannot be used on this node" in r.getMessage()]
    assert len(warnings) == 1
    assert "DocumentDrift" in warnings[0].getMessage()
    assert docs.compiled == []


def wf_pins() -> Any:
    from vertique_workflow import pins

    return pins


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "byte_length", "char_length"),
    [
        # over the byte bound floor(3L/2) = 393216, inside the code-point bound
        ("\u00e9" * 196609, 393218, 196609),
        # over the code-point bound L = 262144, inside the byte bound
        ("a" * 262145, 262145, 262145),
    ],
)
def test_an_oversized_document_returns_counts_only_and_fails(body, byte_length, char_length):
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "small", "yaml")
    # stored by another writer, with a matching digest: a size refusal, not drift
    tamper(
        "eu",
        definition_id,
        1,
        "document_text = %s, document_digest = %s",
        [body, documents.digest(body)],
    )
    with pytest.raises(DocumentTooLarge) as refused:
        documents.find_document("eu", definition_id, 1)
    error = refused.value
    assert (error.byte_length, error.char_length, error.limit) == (byte_length, char_length, 262144)
    message = str(error)
    assert f"eu/{definition_id} v1" in message and "262144" in message
    assert body[:16] not in message
    assert len(message) < 400
    # it is not absent: the listing still has it
    assert store.find_definition("eu", definition_id, 1) is not None


@pytest.mark.django_db
def test_a_document_exactly_at_the_envelope_is_read():
    definition_id = new_id()
    body = "\u00e9" * 196608  # 393216 bytes, the byte bound itself
    documents.insert_candidate("eu", FakePlan(definition_id, 1), body, "yaml")
    found = documents.find_document("eu", definition_id, 1)
    assert found is not None and found.text == body


@pytest.mark.django_db
def test_an_oversized_document_is_refused_on_write(django_assert_num_queries):
    definition_id = new_id()
    with django_assert_num_queries(0), pytest.raises(DocumentTooLarge, match="at most"):
        documents.insert_candidate("eu", FakePlan(definition_id, 1), "a" * 262145, "yaml")


@pytest.mark.django_db
def test_find_document_of_a_code_row_or_no_row_is_none():
    definition_id = new_id()
    assert documents.find_document("default", definition_id, 1) is None
    store.upsert_code(FakePlan(definition_id, 1))
    assert documents.find_document("default", definition_id, 1) is None


@pytest.mark.django_db
def test_listing_never_selects_the_body(django_assert_num_queries):
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "secret body", "yaml")
    with django_assert_num_queries(1) as captured:
        listed = store.list_definitions(definition_id=definition_id)
    assert [r.document_digest for r in listed] == [documents.digest("secret body")]
    assert "document_text" not in captured.captured_queries[0]["sql"]


# --------------------------------------------------------------------------
# Server encoding
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_encoding_check_asks_once_and_caches_only_success(django_assert_num_queries):
    documents._forget_utf8()
    with django_assert_num_queries(1) as captured:
        documents.require_utf8()
    assert "server_encoding" in captured.captured_queries[0]["sql"]
    with django_assert_num_queries(0):
        documents.require_utf8()
    # metadata reads never ask
    documents._forget_utf8()
    with django_assert_num_queries(1) as captured:
        store.list_definitions(definition_id="x")
    assert "server_encoding" not in captured.captured_queries[0]["sql"]


@pytest.mark.django_db(transaction=True)
def test_a_database_that_is_not_utf8_is_refused_before_any_body_read(django_db_blocker):
    name = f"vw_latin1_{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock(), connect("postgres", autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'LATIN1' "
            "LOCALE_PROVIDER libc LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    try:
        script = (
            "from vertique_workflow.store import documents\n"
            "for attempt in range(2):\n"
            "    try:\n"
            "        documents.find_document('eu', 'x', 1)\n"
            "    except Exception as exc:\n"
            "        print(type(exc).__name__, exc)\n"
        )
        result = run_manage("shell", "-c", script, dbname=name)
        lines = [line for line in result.stdout.splitlines() if "Error" in line]
        # refused each time: a failed check is not cached
        assert len(lines) == 2
        for line in lines:
            assert line.startswith("WorkflowPersistenceError")
            assert "server_encoding is UTF8" in line and "LATIN1" in line
    finally:
        with django_db_blocker.unblock(), connect("postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------
# Failure marks
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_failure_marks_touch_only_live_document_rows_of_other_scopes():
    definition_id = new_id()
    store.upsert_code(FakePlan(definition_id, 1))
    documents.insert_candidate("default", FakePlan(definition_id, 2), "d", "yaml")
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "e1", "yaml")
    documents.insert_candidate("eu", FakePlan(definition_id, 2), "e2", "yaml")
    store.retire("eu", definition_id, 2)
    reason = "STATE_TYPE_NOT_EXTENDED"
    assert documents.record_failure("default", definition_id, 1, reason) is False  # CODE
    assert documents.record_failure("default", definition_id, 2, reason) is False  # default
    assert documents.record_failure("eu", definition_id, 2, reason) is False  # RETIRED
    assert documents.record_failure("eu", definition_id, 1, reason) is True
    assert documents.record_failure("eu", definition_id, 1, reason) is False  # already
    marked = store.find_definition("eu", definition_id, 1)
    assert marked.failure_reason == reason
    assert marked.failure.detail == store.FAILURE_DESCRIPTIONS[reason]
    assert [r.failure_reason for r in store.list_definitions(definition_id=definition_id)] == [
        None,
        None,
        reason,
        None,
    ]
    assert documents.record_failure("eu", definition_id, 1, None) is True
    assert store.find_definition("eu", definition_id, 1).failure is None
    with pytest.raises(WorkflowValidationError, match="NAME_BINDING_UNRESOLVED"):
        documents.record_failure("eu", definition_id, 1, "SOMETHING_ELSE")
    # a reason this release does not know reads as no failure
    tamper("eu", definition_id, 1, "failure_reason = %s", ["FROM_A_NEWER_RELEASE"])
    assert store.find_definition("eu", definition_id, 1).failure_reason is None


# --------------------------------------------------------------------------
# Every status pair of a DOCUMENT row
# --------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("from_status", STATUSES)
@pytest.mark.parametrize("to_status", STATUSES)
def test_every_transition_pair_of_a_document_row(from_status, to_status, django_assert_num_queries):
    definition_id = new_id()
    plan = FakePlan(definition_id, 1)
    documents.insert_candidate("eu", plan, "t", "yaml")
    token = uuid.uuid4() if from_status == "PUBLISHING" else None
    WorkflowDefinition.objects.filter(definition_id=definition_id).update(
        status=from_status, publish_token=token
    )
    if (from_status, to_status) in ALLOWED:
        store.transition("eu", definition_id, 1, from_status, to_status)
        assert row(definition_id, 1, "eu").status == to_status
        return
    with django_assert_num_queries(0), pytest.raises(WorkflowConflict, match="INVALID_TRANSITION"):
        store.transition("eu", definition_id, 1, from_status, to_status)
    assert row(definition_id, 1, "eu").status == from_status


@pytest.mark.django_db
def test_a_stale_expected_status_is_refused():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    with pytest.raises(WorkflowConflict, match="is CANDIDATE, not AVAILABLE"):
        store.transition("eu", definition_id, 1, "AVAILABLE", "DEPRECATED")


@pytest.mark.django_db
def test_reinstating_a_document_needs_its_stored_text_to_build_here(docs):
    plan = doc_plan(new_id())
    store_document(plan, docs, status="DEPRECATED")
    tamper("eu", plan.id, 1, "document_text = %s", ["changed"])
    with pytest.raises(DocumentDrift):
        registry.reinstate(plan.id, 1, scope="eu")
    assert row(plan.id, 1, "eu").status == "DEPRECATED"
    tamper("eu", plan.id, 1, "document_text = %s", [docs.text(plan)])
    registry.reinstate(plan.id, 1, scope="eu")
    assert row(plan.id, 1, "eu").status == "AVAILABLE"


@pytest.mark.django_db
def test_retire_of_a_document_row_waits_for_its_pinned_instances():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "t", "yaml")
    WorkflowDefinition.objects.filter(definition_id=definition_id).update(status="DEPRECATED")
    waiting = pinned_instance(definition_id, 1, "WAITING", scope="eu")
    with pytest.raises(WorkflowConflict, match="still pins 1 unfinished"):
        registry.retire(definition_id, 1, scope="eu")
    WorkflowInstance.objects.filter(pk=waiting.pk).update(status="COMPLETED")
    registry.retire(definition_id, 1, scope="eu")
    assert row(definition_id, 1, "eu").status == "RETIRED"


# --------------------------------------------------------------------------
# Races
# --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_a_deprecate_racing_an_activation_never_leaves_it_on_a_deprecated_target(holder, round_):
    definition_id = new_id()
    documents.upsert_document("default", FakePlan(definition_id, 1), "v1", "yaml")
    documents.upsert_document("default", FakePlan(definition_id, 2), "v2", "yaml")
    store.put_activation("default", definition_id, "default", 1)
    steps = [
        lambda: store.put_activation("default", definition_id, "default", 2),
        lambda: store.transition("default", definition_id, 2, "AVAILABLE", "DEPRECATED"),
    ]
    if round_ % 2:
        steps.reverse()
    hold(holder, definition_id)
    with lock_timeout(120_000):
        threads, _results, errors = run_threads(2, lambda index: steps[index]())
        release_when_all_wait(holder, 2)
        finish(threads)
    # the two serialize on the id lock: exactly one of them is refused
    assert len(errors) == 1 and isinstance(errors[0], WorkflowConflict)
    target = activation(definition_id)
    assert row(definition_id, target[1]).status == "AVAILABLE"
    if target == ("default", 2):
        assert "current default version" in str(errors[0])
    else:
        assert target == ("default", 1) and "is DEPRECATED, not AVAILABLE" in str(errors[0])


def start_in(definition_id: str, scope: str, key: str, version: int | None = None) -> Any:
    return wf.start(definition_id, {}, idempotency_key=key, scope=scope, version=version)


@pytest.mark.django_db(transaction=True)
def test_a_start_admitted_before_a_retirement_blocks_it(docs, holder):
    plan = doc_plan(new_id())
    store_document(plan, docs)
    started, finish_start = threading.Event(), threading.Event()

    def start_and_hold() -> Any:
        with transaction.atomic():
            ref = start_in(plan.id, "eu", "k-before", version=1)
            started.set()
            assert finish_start.wait(60)
        return ref

    def deprecate_then_retire() -> Any:
        registry.deprecate(plan.id, 1, scope="eu")
        return registry.retire(plan.id, 1, scope="eu")

    with lock_timeout(120_000):
        starter, start_results, start_errors = run_threads(1, lambda _: start_and_hold())
        assert started.wait(60)
        retirer, _r, retire_errors = run_threads(1, lambda _: deprecate_then_retire())
        deadline = time.monotonic() + 60  # a hang guard, not a timing assumption
        while waiting_advisory_locks(holder) < 1:  # the deprecation queues behind the start
            assert time.monotonic() < deadline
            time.sleep(0.02)
        finish_start.set()
        finish(starter + retirer)
    assert start_errors == [] and len(start_results) == 1
    assert len(retire_errors) == 1 and "still pins 1 unfinished" in str(retire_errors[0])
    assert row(plan.id, 1, "eu").status == "DEPRECATED"
    instance = WorkflowInstance.objects.get(pk=start_results[0].id)
    assert (instance.definition_scope_key, instance.definition_version) == ("eu", 1)


@pytest.mark.django_db(transaction=True)
def test_a_start_after_a_retirement_is_refused(docs):
    plan = doc_plan(new_id())
    store_document(plan, docs)
    registry.deprecate(plan.id, 1, scope="eu")
    registry.retire(plan.id, 1, scope="eu")
    with pytest.raises(WorkflowConflict, match="RETIRED"):
        start_in(plan.id, "eu", "k-after", version=1)
    assert not WorkflowInstance.objects.filter(definition_id=plan.id).exists()


# --------------------------------------------------------------------------
# Document plans on every node: scopes end to end
# --------------------------------------------------------------------------


def pin_of(ref: Any) -> tuple[str, int]:
    instance = WorkflowInstance.objects.get(pk=ref.id)
    return instance.definition_scope_key, instance.definition_version


@pytest.mark.django_db(transaction=True)
def test_a_scope_activation_routes_new_starts_of_that_scope_only(docs):
    definition_id = new_id()
    v1, v2 = doc_plan(definition_id, 1), doc_plan(definition_id, 2)
    assert documents.upsert_document("default", v1, docs.text(v1), "yaml") == "INSERTED"
    old_eu = start_in(definition_id, "eu", "eu-old")
    assert pin_of(old_eu) == ("default", 1)  # eu follows the default activation

    registry.load_document(docs.text(v2), format="yaml", scope="eu")
    # a candidate is not startable; publishing it makes it AVAILABLE in eu only
    assert pin_of(start_in(definition_id, "eu", "eu-candidate")) == ("default", 1)
    registry.publish(definition_id, 2, scope="eu")
    registry.activate(definition_id, 2, scope="eu")
    new_eu = start_in(definition_id, "eu", "eu-new")
    new_default = start_in(definition_id, "default", "default-new")
    assert pin_of(new_eu) == ("eu", 2)
    assert pin_of(new_default) == ("default", 1)

    # another node: nothing compiled yet, every plan is rebuilt from its row
    document_plans._reset()
    run_until_idle()
    for ref in (old_eu, new_eu, new_default):
        wf.signal(ref.id, "go", {}, dedup_key=f"go-{ref.id}")
    run_until_idle()
    assert wf.get(old_eu.id).status == "COMPLETED"
    assert wf.get(old_eu.id).state["ran"] == "v1"
    assert wf.get(new_eu.id).state["ran"] == "v2"
    assert wf.get(new_default.id).state["ran"] == "v1"
    assert wf.get(new_eu.id).status == wf.get(new_default.id).status == "COMPLETED"
    assert set(document_plans.resident_pins()) >= {("eu", definition_id, 2)}


@pytest.mark.django_db(transaction=True)
def test_a_scope_document_runs_under_the_executor(docs):
    from vertique_workflow.executor.daemon import Executor, ExecutorOptions

    plan = doc_plan(new_id())
    store_document(plan, docs, scope="eu")
    ref = start_in(plan.id, "eu", "k1")
    document_plans._reset()
    options = ExecutorOptions(
        concurrency=2, poll_interval=0.05, until_idle=True, stats_interval=60, grace_seconds=10
    )
    assert Executor(options).run() == 0
    assert wf.get(ref.id).status == "WAITING"
    wf.signal(ref.id, "go", {}, dedup_key="go")
    assert Executor(options).run() == 0
    view = wf.get(ref.id)
    assert (view.status, view.state["ran"]) == ("COMPLETED", "v1")


@pytest.mark.django_db(transaction=True)
def test_a_document_that_cannot_be_rebuilt_here_defers_its_commands(docs):
    plan = doc_plan(new_id())
    store_document(plan, docs, scope="eu")
    ref = start_in(plan.id, "eu", "k1")
    document_plans._reset()
    tamper("eu", plan.id, 1, "document_text = %s", ["altered"])
    report = run_until_idle()
    assert "DEFERRED" in report.outcomes
    view = wf.get(ref.id)
    assert view.status == "PENDING"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT state, last_error FROM {T['commands']} WHERE workflow_id = %s", [ref.id]
        )
        state, last_error = cursor.fetchone()
    assert state == "DEFERRED"
    assert "no plan" in last_error


# --------------------------------------------------------------------------
# Packaged documents at startup
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_packaged_documents_are_recorded_at_startup(docs, tmp_path, caplog):
    definition_id = new_id()
    v1, v2 = doc_plan(definition_id, 1), doc_plan(definition_id, 2)
    (tmp_path / "flow-v1.yaml").write_text(docs.text(v1), encoding="utf-8")
    (tmp_path / "flow-v2.json").write_text(docs.text(v2), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a document", encoding="utf-8")
    options = {**settings.VERTIQUE_WORKFLOW, "DOCUMENT_DIRS": [str(tmp_path)]}
    with override_settings(VERTIQUE_WORKFLOW=options), caplog.at_level(logging.INFO):
        assert registry.sync_document_definitions() == {
            (definition_id, 1): "INSERTED",
            (definition_id, 2): "INSERTED",
        }
        assert registry.sync_document_definitions() == {
            (definition_id, 1): "UNCHANGED",
            (definition_id, 2): "UNCHANGED",
        }
    assert rows(definition_id) == [("default", 1, "AVAILABLE"), ("default", 2, "AVAILABLE")]
    assert row(definition_id, 2).document_format == "json"
    assert row(definition_id, 1).source_location == str(tmp_path / "flow-v1.yaml")
    assert activation(definition_id) == ("default", 2)
    assert document_plans.cached("default", definition_id, 2) is v2
    assert any("flow-v2.json): INSERTED" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_activate_on_deploy_false_records_without_activating(docs, tmp_path):
    definition_id = new_id()
    (tmp_path / "flow.yml").write_text(docs.text(doc_plan(definition_id)), encoding="utf-8")
    code = FakePlan(new_id(), 1)
    options = {
        **settings.VERTIQUE_WORKFLOW,
        "DOCUMENT_DIRS": [str(tmp_path)],
        "ACTIVATE_ON_DEPLOY": False,
    }
    with override_settings(VERTIQUE_WORKFLOW=options):
        registry.sync_document_definitions()
        registry.sync_code_definitions([code])
    assert row(definition_id, 1).status == "AVAILABLE"
    assert activation(definition_id) is None
    assert activation(code.id) is None


@pytest.mark.django_db
def test_a_packaged_document_that_drifted_fails_the_sync(docs, tmp_path):
    plan = doc_plan(new_id())
    path = tmp_path / "flow.yaml"
    path.write_text(docs.text(plan), encoding="utf-8")
    registry.sync_document_definitions([tmp_path])
    before = row_versions(plan.id)
    path.write_text(docs.text(plan, note=" edited"), encoding="utf-8")
    with pytest.raises(DocumentDrift):
        registry.sync_document_definitions([tmp_path])
    assert row_versions(plan.id) == before


@pytest.mark.django_db
def test_bad_packaged_folders_and_files_are_clear_errors(docs, tmp_path):
    with pytest.raises(WorkflowDefinitionError, match="not a folder"):
        registry.sync_document_definitions([tmp_path / "missing"])
    (tmp_path / "latin1.yaml").write_bytes(b"id: caf\xe9\n")
    with pytest.raises(WorkflowDefinitionError, match="not UTF-8"):
        registry.sync_document_definitions([tmp_path])


@pytest.mark.django_db
def test_restore_compiles_available_documents_of_every_scope(docs):
    good, drifted = doc_plan(new_id()), doc_plan(new_id())
    candidate = doc_plan(new_id())
    store_document(good, docs, scope="eu")
    store_document(drifted, docs, scope="us", status="DEPRECATED")
    store_document(candidate, docs, scope="eu", status="CANDIDATE")
    tamper("us", drifted.id, 1, "document_text = %s", ["altered"])
    document_plans._reset()
    restored = registry.restore_documents()
    assert ("eu", good.id, 1) in restored
    assert ("us", drifted.id, 1) not in restored
    assert ("eu", candidate.id, 1) not in restored
    assert document_plans.cached("eu", good.id, 1) is good


@pytest.mark.django_db
def test_restore_fails_the_startup_for_an_oversized_stored_document(docs):
    plan = doc_plan(new_id())
    store_document(plan, docs, scope="eu")
    body = "a" * 262145
    tamper(
        "eu", plan.id, 1, "document_text = %s, document_digest = %s", [body, documents.digest(body)]
    )
    document_plans._reset()
    with pytest.raises(DocumentTooLarge):
        registry.restore_documents()


# --------------------------------------------------------------------------
# Real documents (the compiler of vertique_workflow.definitions.documents)
# --------------------------------------------------------------------------


def real_document(definition_id: str, version: int) -> str:
    """DocFlow (v1) or DocFlowV2 (v2) of this module, written as a YAML document."""
    cls = "DocFlow" if version == 1 else "DocFlowV2"
    return (
        f"id: {definition_id}\n"
        f"version: {version}\n"
        "contract: doc-flow.v1\n"
        "signals: {go: null}\n"
        "start: begin\n"
        "steps:\n"
        "  begin:\n"
        "    kind: action\n"
        f"    callback: tests.test_registry_documents.{cls}.begin\n"
        "    next: wait_go\n"
        "  wait_go: {kind: wait, signals: [go], next: done}\n"
        "  done: {kind: end}\n"
    )


@pytest.mark.django_db(transaction=True)
def test_a_document_version_from_load_to_retirement(tmp_path):
    """Written as a document, published, activated for one scope, used by new starts
    there while old instances finish on their pin, then deprecated and retired."""
    definition_id = new_id()
    document_plans._reset()
    (tmp_path / "flow.yaml").write_text(real_document(definition_id, 1), encoding="utf-8")
    assert registry.sync_document_definitions([tmp_path]) == {(definition_id, 1): "INSERTED"}
    # the document hashes like its code twin
    assert row(definition_id, 1).plan_hash == doc_plan(definition_id, 1).plan_hash
    old_eu = start_in(definition_id, "eu", "old")

    record = registry.load_document(
        real_document(definition_id, 2), format="yml", scope="eu", source="eu.yaml"
    )
    assert (record.status, record.document_format) == ("CANDIDATE", "yaml")
    registry.publish(definition_id, 2, scope="eu")
    registry.activate(definition_id, 2, scope="eu")
    new_eu = start_in(definition_id, "eu", "new")
    assert (pin_of(old_eu), pin_of(new_eu)) == (("default", 1), ("eu", 2))

    document_plans._reset()  # another node: both plans are rebuilt from their rows
    run_until_idle()
    for ref in (old_eu, new_eu):
        wf.signal(ref.id, "go", {}, dedup_key=f"go-{ref.id}")
    run_until_idle()
    assert [wf.get(ref.id).state["ran"] for ref in (old_eu, new_eu)] == ["v1", "v2"]
    assert {wf.get(ref.id).status for ref in (old_eu, new_eu)} == {"COMPLETED"}

    registry.deactivate(definition_id, scope="eu")
    registry.deprecate(definition_id, 2, scope="eu")
    registry.retire(definition_id, 2, scope="eu")
    assert row(definition_id, 2, "eu").status == "RETIRED"
    # eu follows the default scope again
    assert pin_of(start_in(definition_id, "eu", "after")) == ("default", 1)


@pytest.mark.django_db
def test_a_bad_real_document_writes_nothing():
    from vertique_workflow.definitions.documents import DocumentError

    text = real_document(new_id(), 1).replace("kind: action", "kind: action\n    bogus: 1")
    with pytest.raises(DocumentError) as refused:
        registry.load_document(text, format="yaml", scope="eu")
    assert refused.value.line is not None
    assert not WorkflowDefinition.objects.filter(scope_key="eu").exists()


@pytest.mark.django_db
def test_the_envelope_follows_the_input_limit_setting():
    definition_id = new_id()
    documents.insert_candidate("eu", FakePlan(definition_id, 1), "0123456789", "yaml")
    options = {**settings.VERTIQUE_WORKFLOW, "DOCUMENT_INPUT_LIMIT": 8}
    with override_settings(VERTIQUE_WORKFLOW=options):
        assert documents.envelope() == (12, 8)
        with pytest.raises(DocumentTooLarge, match="DOCUMENT_INPUT_LIMIT 8") as refused:
            documents.find_document("eu", definition_id, 1)
    assert (refused.value.byte_length, refused.value.char_length) == (10, 10)
    assert documents.find_document("eu", definition_id, 1).text == "0123456789"


# --------------------------------------------------------------------------
# Loading the same text again
# --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_loading_the_same_text_again_is_unchanged_even_concurrently(docs):
    from .conftest import in_threads, table_counts

    plan = doc_plan(new_id(), 2)
    text = docs.text(plan)
    outcomes = in_threads(
        *[lambda: registry.load_document_outcome(text, format="yaml", scope="eu")] * 2
    )
    assert sorted(outcome for _, outcome in outcomes) == ["INSERTED", "UNCHANGED"]
    assert outcomes[0][0] == outcomes[1][0]  # the one stored record
    before = table_counts()
    registry.publish(plan.id, 2, scope="eu")
    record, outcome = registry.load_document_outcome(text, format="yaml", scope="eu")
    assert (record.status, outcome) == ("AVAILABLE", "UNCHANGED")
    assert registry.load_document(text, format="yaml", scope="eu").status == "AVAILABLE"
    assert table_counts() == before
    # another text under the key (same plan here) stays refused, naming both digests
    other = docs.text(plan, note=" edited")
    with pytest.raises(
        WorkflowConflict,
        match=r"already exists \(DOCUMENT, AVAILABLE\) with "
        r"another text \(stored digest [0-9a-f]{12}, this one [0-9a-f]{12}\)",
    ):
        registry.load_document(other, format="yaml", scope="eu")
    assert table_counts() == before
