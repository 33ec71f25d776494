"""Payload hygiene: what start and signal refuse before writing, and what the executor
fails at once instead of retrying (issue 7, defects 5 and 6)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import vertique_workflow as wf
from tests.conftest import table_counts
from tests.flows.workflows import GrowingFlow, Ticket, TicketFlow
from vertique_workflow import operations, payloads, pins
from vertique_workflow.conf import workflow_settings
from vertique_workflow.definitions import catalog
from vertique_workflow.engine.drive import STEP_ATTRIBUTE, RunFacts, Snapshot, drive
from vertique_workflow.engine.events import Signal, Start
from vertique_workflow.exceptions import NonRetryable, WorkflowValidationError
from vertique_workflow.models import WorkflowCommand
from vertique_workflow.testing import run_until_idle

SECRET = "s3cr3t-value"


def limit(max_bytes: int) -> override_settings:
    return override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "MAX_PAYLOAD_BYTES": max_bytes}
    )


def started_two_waits() -> Any:
    """An instance waiting for anything "two-waits" declares (schemas None)."""
    return wf.start("two-waits", {}, idempotency_key=f"k-{uuid.uuid4()}")


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the WorkflowValidationError ``call`` raises; proves nothing was written."""
    before = table_counts()
    with pytest.raises(WorkflowValidationError) as info:
        call(*args, **kwargs)
    assert table_counts() == before
    message = str(info.value)
    assert SECRET not in message
    return message


# -- the walk (no database) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"items": [{}, {}, {}, {"name": f"a\x00{SECRET}"}]}, "$.items[3].name holds a NUL"),
        ({"a": {f"k\x00{SECRET}": 1}}, "a key of $.a holds a NUL"),
        ({"odd key": [f"\ud800{SECRET}"]}, '$["odd key"][0] holds a lone surrogate'),
        ({"when": datetime.datetime(2024, 1, 1)}, "$.when holds a datetime"),
        ({"tags": {SECRET}}, "$.tags holds a set"),
        ({"raw": SECRET.encode()}, "$.raw holds a bytes"),
        ({"obj": object()}, "$.obj holds a object"),
        ({"n": float("nan")}, "$.n holds a non-finite float"),
        ({"n": [float("-inf")]}, "$.n[0] holds a non-finite float"),
        ({"m": {1: SECRET}}, "$.m has a int key"),
        ({"big": 10**5000}, "$.big holds an integer too large"),
        ({"ticket": Ticket(SECRET)}, "$.ticket holds a Ticket"),
    ],
)
def test_check_names_the_json_path_never_the_value(value: Any, fragment: str) -> None:
    with pytest.raises(WorkflowValidationError) as info:
        payloads.check(value, "the payload", max_bytes=None)
    assert fragment in str(info.value)
    assert str(info.value).startswith("the payload is refused: ")
    assert SECRET not in str(info.value)


def test_hostile_nesting_is_refused_without_a_recursion_error() -> None:
    deep: Any = SECRET
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(WorkflowValidationError, match="nested deeper than 100 levels"):
        payloads.check(deep, "the payload", max_bytes=None)
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(WorkflowValidationError, match="nested deeper than 100 levels"):
        payloads.check(cyclic, "the payload", max_bytes=None)
    fine: Any = 1
    for _ in range(payloads.MAX_DEPTH):
        fine = [fine]
    payloads.check(fine, "the payload", max_bytes=None)


def test_size_is_the_compact_utf8_json_and_the_message_names_limit_and_size() -> None:
    value = {"a": ["é", 1, None]}
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    assert payloads.json_size(value) == size == 19
    payloads.check(value, "the payload", max_bytes=size)
    with pytest.raises(WorkflowValidationError) as info:
        payloads.check(value, "the payload", max_bytes=size - 1)
    assert str(info.value) == (
        "the payload is 19 bytes of JSON, over the limit of 18 bytes (MAX_PAYLOAD_BYTES)"
    )


def test_states_follow_the_same_rules_as_type_errors() -> None:
    with pytest.raises(TypeError, match=r"state\.notes\[0\] holds a NUL character"):
        TicketFlow.plan().state_to_json(Ticket("t", notes=[f"\x00{SECRET}"]))


# -- start and signal refuse before any read or write -------------------------------------

on_db = pytest.mark.django_db


@on_db
def test_nul_in_a_nested_string_or_key_of_a_start_payload_is_refused_naming_the_path():
    message = refused(
        wf.start, "order", {"lines": [{"sku": f"A\x00{SECRET}"}]}, idempotency_key="k1"
    )
    assert message.startswith("the start payload is refused: $.lines[0].sku holds a NUL")
    message = refused(wf.start, "order", {"lines": {f"x\x00{SECRET}": 1}}, idempotency_key="k1")
    assert "a key of $.lines holds a NUL" in message


@on_db
def test_nul_in_a_nested_string_or_key_of_a_signal_payload_is_refused_naming_the_path():
    ref = started_two_waits()
    message = refused(
        wf.signal, ref.id, "extra", {"a": [1, {"b": f"\x00{SECRET}"}]}, dedup_key="s1"
    )
    assert message.startswith("the signal payload is refused: $.a[1].b holds a NUL")
    message = refused(wf.signal, ref.id, "extra", {f"\x00{SECRET}": 1}, dedup_key="s1")
    assert "a key of $ holds a NUL" in message
    message = refused(wf.signal, ref.id, "extra", f"{SECRET}\x00", dedup_key="s1")
    assert "$ holds a NUL" in message


@on_db
def test_non_json_values_are_refused_on_start_and_signal():
    refused(wf.start, "order", {"at": datetime.date(2024, 1, 1)}, idempotency_key="k1")
    refused(wf.start, "order", {"n": float("nan")}, idempotency_key="k1")
    refused(wf.start, "order", {}, idempotency_key="k1", subject={"ref": f"\x00{SECRET}"})
    ref = started_two_waits()
    assert "$.tags holds a set" in refused(
        wf.signal, ref.id, "extra", {"tags": {SECRET}}, dedup_key="s1"
    )
    assert "$ holds a bytes" in refused(wf.signal, ref.id, "extra", b"raw", dedup_key="s1")


@on_db
def test_nul_in_a_key_argument_is_refused_instead_of_a_database_error():
    refused(wf.start, "order", {}, idempotency_key="k\x00")
    refused(wf.start, "order", {}, idempotency_key="k1", business_key="b\x00")
    ref = started_two_waits()
    refused(wf.signal, ref.id, "extra", None, dedup_key="d\x00")


@on_db
def test_payloads_over_max_payload_bytes_are_refused_naming_limit_and_size():
    ref = started_two_waits()
    with limit(100):
        at_limit = {"p": "x" * (100 - len('{"p":""}'))}
        assert payloads.json_size(at_limit) == 100
        wf.start("order", at_limit, idempotency_key="k-at-limit")
        wf.signal(ref.id, "extra", at_limit, dedup_key="s-at-limit")
        over = {"p": at_limit["p"] + "x"}
        message = refused(wf.start, "order", over, idempotency_key="k-over")
        assert message == (
            "the start payload is 101 bytes of JSON, over the limit of 100 bytes "
            "(MAX_PAYLOAD_BYTES)"
        )
        message = refused(wf.signal, ref.id, "extra", over, dedup_key="s-over")
        assert message.startswith("the signal payload is 101 bytes of JSON")


@on_db
def test_the_default_limit_is_one_mebibyte():
    assert workflow_settings.MAX_PAYLOAD_BYTES == 1048576
    ref = started_two_waits()
    big = "x" * (1 << 20)  # 1 MiB of text is more than 1 MiB of JSON
    message = refused(wf.signal, ref.id, "extra", big, dedup_key="s1")
    assert "over the limit of 1048576 bytes" in message


# -- hostile input: never a database error ------------------------------------------------

# surrogates excluded explicitly: some Hypothesis versions drop their default
# exclusion of category Cs once any other exclusion is given
clean_text = st.text(
    alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12
)
clean_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(clean_text, children, max_size=4)
    ),
    max_leaves=16,
)
# a NUL character (or a lone surrogate) hidden in a string or a key, at any depth
bad_text = st.builds(
    lambda head, bad, tail: f"{head}{bad}{tail}{SECRET}",
    clean_text,
    st.sampled_from(["\x00", "\ud800", "\udfff"]),
    clean_text,
)
poisoned = st.recursive(
    bad_text | st.tuples(bad_text, clean_json).map(lambda kv: {kv[0]: kv[1]}),
    lambda children: (
        st.tuples(st.lists(clean_json, max_size=3), children, st.integers(0, 3)).map(
            lambda t: [*t[0][: t[2]], t[1], *t[0][t[2] :]]
        )
        | st.tuples(st.dictionaries(clean_text, clean_json, max_size=3), clean_text, children).map(
            lambda t: {**t[0], t[1]: t[2]}
        )
    ),
    max_leaves=8,
)
hypothesis_db = hypothesis_settings(
    max_examples=60,
    deadline=None,  # CI shares its cores: no wall-clock bound
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@on_db
@hypothesis_db
@given(value=poisoned)
def test_any_payload_hiding_a_nul_or_a_surrogate_is_refused_by_start_and_signal(value: Any):
    ref = started_two_waits()
    message = refused(wf.start, "order", {"v": value}, idempotency_key=f"k-{uuid.uuid4()}")
    assert message.startswith("the start payload is refused: ")
    message = refused(wf.signal, ref.id, "extra", value, dedup_key=f"s-{uuid.uuid4()}")
    assert message.startswith("the signal payload is refused: ")


@on_db
@hypothesis_db
@given(value=clean_json)
def test_any_clean_json_payload_is_recorded_as_given(value: Any):
    ref = started_two_waits()
    receipt = wf.signal(ref.id, "extra", value, dedup_key=f"s-{uuid.uuid4()}")
    stored = WorkflowCommand.objects.get(id=receipt.command_id).payload_json
    assert same_json(stored, value)
    started = wf.start("order", {"v": value}, idempotency_key=f"k-{uuid.uuid4()}")
    assert same_json(WorkflowCommand.objects.get(workflow_id=started.id).payload_json, {"v": value})


def same_json(stored: Any, given: Any) -> bool:
    """Equal as JSON: jsonb keeps numbers as numeric, so 6.2e+16 reads back as an int."""
    if isinstance(given, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == given.keys()
            and all(same_json(stored[k], v) for k, v in given.items())
        )
    if isinstance(given, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(given)
            and all(same_json(a, b) for a, b in zip(stored, given, strict=True))
        )
    if (
        isinstance(given, float)
        and isinstance(stored, int | float)
        and not isinstance(stored, bool)
    ):
        return float(stored) == given
    return type(stored) is type(given) and stored == given


# -- record time: a resident plan refuses what would not fit ------------------------------


@on_db
def test_signal_refuses_a_payload_the_default_merge_could_not_apply():
    ref = wf.start("ticket", {"title": "t"}, idempotency_key="k1")
    message = refused(wf.signal, ref.id, "update", {"status": "x", "bogus": SECRET}, dedup_key="s")
    assert "payload of signal 'update' has fields tests.flows.workflows.Ticket" in message
    assert "'bogus'" in message
    message = refused(wf.signal, ref.id, "update", [SECRET], dedup_key="s")
    assert "must be a JSON object to merge" in message
    two = started_two_waits()  # a dict state: any object merges, nothing else does
    assert "must be a JSON object to merge" in refused(
        wf.signal, two.id, "first", SECRET, dedup_key="s"
    )
    wf.signal(two.id, "first", {"any": "keys"}, dedup_key="s-ok")
    wf.signal(two.id, "extra", SECRET, dedup_key="s-extra")  # no wait applies "extra"
    wf.signal(ref.id, "update", {"status": "closed"}, dedup_key="s-ok")
    wf.signal(ref.id, "update", None, dedup_key="s-none")


@on_db
def test_signal_accepts_any_json_when_a_wait_accepting_it_has_its_own_apply():
    ticket = wf.start("ticket", {"title": "t"}, idempotency_key="k1")
    wf.signal(ticket.id, "both", ["not", "an", "object"], dedup_key="s1")
    expense = wf.start("expense-approval", {"amount": 500}, idempotency_key="k2")
    wf.signal(expense.id, "reject", 42, dedup_key="s2")


@on_db
def test_start_refuses_a_payload_the_state_type_cannot_be_built_from():
    message = refused(wf.start, "ticket", {"title": "t", "bogus": SECRET}, idempotency_key="k1")
    assert "does not declare: 'bogus'" in message
    message = refused(wf.start, "ticket", {"status": SECRET}, idempotency_key="k1")
    assert "lacks required fields of tests.flows.workflows.Ticket: 'title'" in message
    assert wf.start("ticket", {"title": "t"}, idempotency_key="k1").created


# -- the executor: deterministic errors fail at the first attempt -------------------------


def failed_at_once(ref: Any, code: str, step: str) -> None:
    command = WorkflowCommand.objects.filter(workflow_id=ref.id).order_by("-seq").first()
    assert command is not None
    assert (command.state, command.attempts) == ("FAILED", 1)
    assert command.last_error.startswith(f"{code}: ")
    assert f"step {step!r}" in command.last_error
    instance = wf.get(ref.id)
    assert (instance.status, instance.error_type) == ("FAILED", code)
    for text in (command.last_error, instance.error_message):
        assert SECRET not in text


def record_without_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record as a node that lacks the plan: only the registry's schemas are checked."""
    real = pins.resolve_start_pin

    def pin_without_plan(*args: Any) -> pins.Pin:
        return dataclasses.replace(real(*args), plan=None)

    def declared_only(row: Any, declaration: Any = None) -> pins.SignalSchemas:
        declared = dict(catalog.get(row.definition_id, 1).signals)
        return pins.SignalSchemas(row.definition_id, None, declared)

    monkeypatch.setattr(operations, "resolve_start_pin", pin_without_plan)
    monkeypatch.setattr(operations, "signal_schema_source", declared_only)


@pytest.mark.django_db(transaction=True)
def test_a_signal_the_merge_refuses_fails_payload_invalid_at_the_first_attempt(monkeypatch):
    ref = wf.start("ticket", {"title": "t"}, idempotency_key="k1")
    run_until_idle()
    with monkeypatch.context() as patch:
        record_without_the_plan(patch)
        wf.signal(ref.id, "update", {"bogus": SECRET}, dedup_key="s1")
    assert run_until_idle().outcomes == ["FAILED"]
    failed_at_once(ref, "PAYLOAD_INVALID", "triage")


@pytest.mark.django_db(transaction=True)
def test_a_start_payload_the_state_refuses_fails_payload_invalid_at_the_first_attempt(
    monkeypatch,
):
    with monkeypatch.context() as patch:
        record_without_the_plan(patch)
        ref = wf.start("ticket", {"title": SECRET, "bogus": SECRET}, idempotency_key="k1")
    assert run_until_idle().outcomes == ["FAILED"]
    failed_at_once(ref, "PAYLOAD_INVALID", "open_ticket")


@pytest.mark.django_db(transaction=True)
def test_a_state_growing_over_the_limit_fails_state_too_large_at_the_first_attempt():
    with limit(1000):
        ok = wf.start("growing", {"size": 100}, idempotency_key="k-ok")
        assert run_until_idle().outcomes == ["COMPLETED"]
        wf.signal(ok.id, "more", None, dedup_key="s1")
        big = wf.start("growing", {"size": 2000}, idempotency_key="k-big")
        assert sorted(run_until_idle().outcomes) == ["COMPLETED", "FAILED"]
        failed_at_once(big, "STATE_TOO_LARGE", "grow")
        assert wf.get(ok.id).status == "COMPLETED"
        assert "blob" not in (wf.get(big.id).state or {})  # the grown state was not stored
        grows_later = wf.start("growing", {"size": 600}, idempotency_key="k-later")
        run_until_idle()
        wf.signal(grows_later.id, "more", None, dedup_key="s2")
        assert run_until_idle().outcomes == ["FAILED"]
        failed_at_once(grows_later, "STATE_TOO_LARGE", "grow_again")
        assert len(wf.get(grows_later.id).state["blob"]) == 600  # the waiting state stays


# -- the engine (no database) -------------------------------------------------------------


def facts(**extra: Any) -> RunFacts:
    return RunFacts(
        instance_id=uuid.uuid4(),
        definition_id="ticket",
        definition_version=1,
        business_key=None,
        scope="default",
        command_id=1,
        command_kind="SIGNAL",
        **extra,
    )


def drive_start(plan: Any, payload: Any, run_facts: RunFacts) -> Any:
    return drive(plan, Snapshot("PENDING", None, None), Start(payload), run_facts)


def drive_signal(
    plan: Any, state: Any, step: str, name: str, payload: Any, run_facts: RunFacts
) -> Any:
    return drive(plan, Snapshot("WAITING", step, state), Signal(name, payload), run_facts)


def test_the_engine_raises_non_retryable_codes_marked_with_the_step() -> None:
    plan = TicketFlow.plan()
    with pytest.raises(NonRetryable) as info:
        drive_start(plan, {"title": "t", "bogus": SECRET}, facts())
    assert info.value.reason_code == "PAYLOAD_INVALID"
    assert getattr(info.value, STEP_ATTRIBUTE) == "open_ticket"
    with pytest.raises(NonRetryable) as info:
        drive_signal(plan, {"title": "t", "gone": 1}, "triage", "update", None, facts())
    assert info.value.reason_code == "STATE_INVALID"
    assert getattr(info.value, STEP_ATTRIBUTE) == "triage"
    with pytest.raises(NonRetryable) as info:
        drive_signal(plan, {"title": "t"}, "triage", "update", [SECRET], facts())
    assert info.value.reason_code == "PAYLOAD_INVALID"
    assert SECRET not in str(info.value)


def test_the_state_size_is_checked_only_when_the_segment_gives_a_limit() -> None:
    plan = GrowingFlow.plan()
    payload = {"size": 50}
    result = drive_start(plan, payload, facts())
    size = payloads.json_size(result.state)
    for max_state_bytes in (None, size):
        drive_start(plan, payload, facts(max_state_bytes=max_state_bytes))
    with pytest.raises(NonRetryable) as info:
        drive_start(plan, payload, facts(max_state_bytes=size - 1))
    assert info.value.reason_code == "STATE_TOO_LARGE"
    assert getattr(info.value, STEP_ATTRIBUTE) == "grow"
