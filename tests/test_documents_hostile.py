"""Bad and hostile workflow documents: each refused with a DocumentError at its path and line.

No database: compiling is pure. The hypothesis tests feed random text,
bytes and structures (and mutations of a valid document) and accept exactly
two outcomes: a plan, or a ``DocumentError``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vertique_workflow.definitions import Plan
from vertique_workflow.definitions.documents import MAX_DEPTH, DocumentError, compile_document
from vertique_workflow.exceptions import WorkflowDefinitionError

ORDER = (Path(__file__).parent / "documents" / "order.yaml").read_text("utf-8")
FLOWS = "tests.flows.workflows"

# A minimal valid document; tests below break it one way at a time.
VALID = f"""\
id: small
version: 1
steps:
  route:
    kind: decision
    callback: {FLOWS}.OrderFlow.route
    targets: [await_payment, done]
  await_payment:
    kind: timer
    duration: 1h
    next: done
  done:
    kind: end
"""


def refused(text: str, **kwargs: Any) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        compile_document(text, **kwargs)
    return caught.value


def test_the_valid_base_document_compiles() -> None:
    assert isinstance(compile_document(VALID), Plan)


def test_a_document_error_is_a_definition_error_with_source_line_and_path() -> None:
    error = refused(VALID.replace("next: done", "next: shipp"), source="orders.yaml")
    assert isinstance(error, WorkflowDefinitionError)
    assert (error.source, error.line, error.path) == ("orders.yaml", 11, "steps.await_payment.next")
    assert str(error) == "orders.yaml:11: steps.await_payment.next: unknown step 'shipp'"
    assert (error.definition_id, error.detail) == ("small", "unknown step 'shipp'")


def test_an_unknown_decision_target_names_its_index() -> None:
    error = refused(
        VALID.replace("targets: [await_payment, done]", "targets:\n      - done\n      - shipp")
    )
    assert (error.path, error.line) == ("steps.route.targets[1]", 9)


# -- hostile YAML ------------------------------------------------------------------------

ALIAS_BOMB = """\
id: bomb
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]
"""


def test_an_alias_bomb_is_refused_at_its_first_anchor() -> None:
    error = refused(ALIAS_BOMB)
    assert error.line == 2
    assert "anchors are not allowed" in error.detail


def test_an_alias_is_refused_at_its_line() -> None:
    text = VALID + "    extra: *nothing\n"
    assert refused(text).line == 14
    anchored = VALID.replace("  done:\n", "  done: &d\n")
    assert refused(anchored).line == 12


@pytest.mark.parametrize("format", ["yaml", "json"])
def test_nesting_deeper_than_the_bound_is_refused(format: str) -> None:
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    text = f'{{"id": "deep",\n "version": 1,\n "steps": {deep}}}'
    error = refused(text, format=format)
    assert error.line == 3
    assert f"nested deeper than {MAX_DEPTH}" in error.detail
    just_deep_enough = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    shallow = refused(f'{{"id": "deep", "version": 1, "steps": {just_deep_enough}}}', format=format)
    assert "nested deeper" not in shallow.detail, "depth 64 parses; the shape check refuses it"


def test_a_python_object_tag_is_refused_and_never_constructed() -> None:
    text = VALID + "x: !!python/object/apply:os.system ['touch /tmp/pwned-by-document']\n"
    error = refused(text)
    assert (error.line, error.path) == (14, "x")
    assert "is not allowed" in error.detail
    assert not Path("/tmp/pwned-by-document").exists()


@pytest.mark.parametrize(
    "tagged", ["!!binary aGk=", "!!timestamp 2024-01-01", "!custom x", "!!set {a}"]
)
def test_tags_other_than_the_core_ones_are_refused(tagged: str) -> None:
    error = refused(VALID.replace("id: small", f"id: {tagged}"))
    assert (error.line, error.path) == (1, "id")


def test_yaml_1_1_booleans_and_timestamps_stay_strings() -> None:
    text = """\
id: 2024-01-01
version: 1
signals: {on: null, yes: null}
steps:
  hold:
    kind: wait
    signals: [on, yes]
    on: {on: done, yes: done}
  done: {kind: end}
"""
    plan = compile_document(text)
    assert plan.id == "2024-01-01"
    assert plan.steps["hold"].on_signal == {"on": "done", "yes": "done"}


def test_a_non_string_key_is_refused_at_its_line() -> None:
    error = refused(
        VALID.replace("  done:\n    kind: end\n", "  done:\n    kind: end\n  1: {kind: end}\n")
    )
    assert (error.line, error.path) == (14, "steps")
    assert "keys must be strings" in error.detail


@pytest.mark.parametrize("format", ["yaml", "json"])
def test_a_duplicate_key_is_refused_at_the_second_occurrence(format: str) -> None:
    if format == "yaml":
        text = VALID.replace("    next: done\n", "    next: done\n    next: route\n")
        where = (12, "steps.await_payment")
    else:
        text = '{"id": "x",\n "version": 1,\n "steps": {"a": {"kind": "end"},\n  "a": {}}}'
        where = (4, "steps")
    error = refused(text, format=format)
    assert (error.line, error.path) == where
    assert "duplicate key" in error.detail


def test_malformed_yaml_names_the_line() -> None:
    error = refused("id: x\nversion: 1\nsteps:\n  a: [unclosed\n  b: c: d\n")
    assert error.line is not None and error.line >= 4
    assert error.detail.startswith("malformed YAML")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('{"id": "x",\n "version": 1,\n "steps": {"a": tru}}', 3),
        ('{"id": "x",\n "version": NaN}', 2),
        ('{"id": "x"}\n{"again": 1}', 2),
        ('{"id": "x",\n\n "version": "\\ud800"}', 3),
        ('{"id": "x", "version": 1e999}', 1),
    ],
)
def test_malformed_json_names_the_line(text: str, line: int) -> None:
    error = refused(text, format="json")
    assert error.line == line
    assert error.detail.startswith("malformed JSON")


# -- size ------------------------------------------------------------------------------


def test_an_oversized_document_is_refused_before_parsing_with_the_counts() -> None:
    text = "id: x\n" + "#" * 300 + "\n" + ALIAS_BOMB
    error = refused(text, limit=100, source="big.yaml")
    size = len(text.encode("utf-8"))
    assert error.detail.startswith(
        f"the document is {size} bytes of UTF-8, over the input limit of 100"
    )
    assert (error.line, error.path, error.source) == (None, None, "big.yaml")


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    text = VALID.replace("id: small", "id: " + "é" * 40)
    characters, size = len(text), len(text.encode("utf-8"))
    assert characters < size
    with pytest.raises(DocumentError, match=f"is {size} bytes"):
        compile_document(text, limit=characters)
    assert compile_document(text, limit=size).id == "é" * 40


def test_the_default_limit_is_the_setting() -> None:
    from vertique_workflow.conf import DEFAULTS

    assert DEFAULTS["DOCUMENT_INPUT_LIMIT"].value == 262144
    size = len(VALID.encode("utf-8"))
    with (
        override_settings(VERTIQUE_WORKFLOW={"DOCUMENT_INPUT_LIMIT": size - 1}),
        pytest.raises(DocumentError, match=f"over the input limit of {size - 1} bytes"),
    ):
        compile_document(VALID)
    with override_settings(VERTIQUE_WORKFLOW={"DOCUMENT_INPUT_LIMIT": size}):
        assert compile_document(VALID).id == "small"


# -- shape -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "line", "path", "detail"),
    [
        (
            "    next: done\n",
            "    next: done\n    nxet: done\n",
            12,
            "steps.await_payment.nxet",
            "unknown key 'nxet'",
        ),
        ("id: small\n", "id: small\ncolour: red\n", 2, "colour", "unknown key 'colour'"),
        (
            "    kind: timer\n",
            "    kind: sleep\n",
            9,
            "steps.await_payment.kind",
            "unknown step kind 'sleep'",
        ),
        ("version: 1\n", "version: '1'\n", 2, "version", "must be an integer, not a string"),
        ("version: 1\n", "version: 0\n", 2, "version", "must be at least 1"),
        (
            "targets: [await_payment, done]",
            "targets: done",
            7,
            "steps.route.targets",
            "must be a list",
        ),
        (
            "    duration: 1h\n",
            "    duration: 90\n",
            10,
            "steps.await_payment.duration",
            "must be a string",
        ),
        (
            "    duration: 1h\n",
            "    duration: 1m1h\n",
            10,
            "steps.await_payment.duration",
            "invalid duration '1m1h'",
        ),
        (
            "    kind: end\n",
            "    kind: end\n    reason: X\n",
            14,
            "steps.done.reason",
            "unknown key 'reason'",
        ),
        (
            "    kind: timer\n    duration: 1h\n",
            "    kind: timer\n",
            8,
            "steps.await_payment",
            "a timer needs exactly one of",
        ),
        (
            "    callback: tests.flows.workflows.OrderFlow.route\n",
            "",
            4,
            "steps.route",
            "missing key 'callback'",
        ),
    ],
)
def test_a_bad_shape_is_refused_at_the_key(
    old: str, new: str, line: int, path: str, detail: str
) -> None:
    text = VALID.replace(old, new, 1)
    assert text != VALID
    error = refused(text)
    assert (error.line, error.path) == (line, path)
    assert error.detail.startswith(detail), error.detail


def test_a_root_that_is_not_a_mapping_is_refused() -> None:
    for text, format in (("- a\n- b\n", "yaml"), ("42", "json"), ("just text", "yaml")):
        error = refused(text, format=format)
        assert error.line == 1 and error.path is None
        assert error.detail.startswith("must be a mapping")


# -- names and semantics -----------------------------------------------------------------


def test_an_unknown_callback_name_is_refused_at_its_line() -> None:
    error = refused(VALID.replace("OrderFlow.route", "OrderFlow.rout"))
    assert (error.line, error.path) == (6, "steps.route.callback")
    assert "unknown callable 'tests.flows.workflows.OrderFlow.rout'" in error.detail


def test_a_module_function_is_not_importable_by_name() -> None:
    error = refused(VALID.replace(f"{FLOWS}.OrderFlow.route", "os.system"))
    assert (error.line, error.path) == (6, "steps.route.callback")
    assert "unknown callable 'os.system'" in error.detail


def test_an_unknown_state_type_and_exception_class_are_refused() -> None:
    error = refused(VALID.replace("version: 1\n", "version: 1\nstate: myapp.Missing\n"))
    assert (error.line, error.path) == (3, "state")
    text = VALID.replace(
        "    next: done\n", "    next: done\n    retry:\n      never: [os.Nope]\n", 1
    )
    error = refused(text)
    assert (error.line, error.path) == (13, "steps.await_payment.retry.never[0]")


def test_a_cycle_without_a_wait_is_refused_at_its_step() -> None:
    text = f"""\
id: spin
version: 1
steps:
  reserve:
    kind: action
    callback: {FLOWS}.OrderFlow.reserve
    next: route
  route:
    kind: decision
    callback: {FLOWS}.OrderFlow.route
    targets: [reserve, done]
  done: {{kind: end}}
"""
    error = refused(text)
    assert (error.line, error.path) == (4, "steps.reserve")
    assert "'reserve' -> 'route' -> 'reserve' form a cycle without a wait" in error.detail
    broken = text.replace("targets: [reserve, done]", "targets: [pause, done]") + (
        "  pause: {kind: timer, duration: 1m, next: reserve}\n"
    )
    assert compile_document(broken).id == "spin", "a timer in the loop breaks it"


def test_a_plan_rule_is_reported_at_the_step_and_field_it_names() -> None:
    text = VALID.replace("targets: [await_payment, done]", "targets: [await_payment, done, done]")
    error = refused(text)
    assert (error.line, error.path) == (4, "steps.route")
    assert error.detail == "a decision declares a target twice"
    wait = VALID.replace(
        "    kind: timer\n    duration: 1h\n", "    kind: wait\n    signals: [paid]\n"
    )
    error = refused(wait)
    assert (error.line, error.path) == (8, "steps.await_payment")
    assert error.detail == "waits for signal 'paid' the workflow does not declare"


def test_a_header_rule_is_reported_at_its_key() -> None:
    error = refused(VALID.replace("version: 1\n", "version: 1\nsignals: {paid: {type: 12}}\n"))
    assert (error.line, error.path) == (3, "signals.paid")
    assert "payload schema of signal 'paid' is not a valid JSON Schema" in error.detail


def test_the_unreachable_step_is_named() -> None:
    error = refused(VALID + "  orphan: {kind: end}\n")
    assert (error.line, error.path) == (14, "steps.orphan")
    assert "unreachable" in error.detail


# -- hypothesis: nothing but a plan or a DocumentError -------------------------------------

HOSTILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(text: Any, format: str) -> None:
    try:
        result = compile_document(text, format=format, limit=8192)
    except DocumentError as exc:
        assert str(exc)
        return
    assert isinstance(result, Plan)


@HOSTILE
@given(text=st.text(max_size=400), format=st.sampled_from(["yaml", "json"]))
def test_random_text_only_ever_raises_document_error(text: str, format: str) -> None:
    outcome(text, format)


@HOSTILE
@given(raw=st.binary(max_size=400), format=st.sampled_from(["yaml", "json"]))
def test_random_bytes_only_ever_raise_document_error(raw: bytes, format: str) -> None:
    outcome(raw, format)


YAML_PIECES = st.sampled_from(
    [
        ":",
        "- ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&a ",
        "*a",
        "!!",
        "!x ",
        "|",
        ">",
        "'",
        '"',
        "#",
        "\n",
        "\n  ",
        "\t",
        "? ",
        "---",
        "...",
        "%YAML 1.1\n",
        "kind",
        "steps",
        "next",
        "~",
        "null",
        "true",
        "0x",
        "1e9",
        "\\u",
        "\ufeff",
        "\x00",
        "<<: ",
    ]
)


@HOSTILE
@given(pieces=st.lists(st.one_of(YAML_PIECES, st.text(max_size=5)), max_size=60))
def test_yaml_punctuation_soup_only_ever_raises_document_error(pieces: list[str]) -> None:
    outcome("".join(pieces), "yaml")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "version",
                    "steps",
                    "kind",
                    "next",
                    "callback",
                    "a",
                    "signals",
                    "targets",
                    "start",
                    "retry",
                    "each",
                    "join",
                    "branches",
                ]
            )
            | st.text(max_size=4),
            children,
            max_size=5,
        )
    ),
    max_leaves=40,
)


@HOSTILE
@given(value=JSON_VALUES, format=st.sampled_from(["yaml", "json"]))
def test_random_structures_only_ever_raise_document_error(value: Any, format: str) -> None:
    outcome(json.dumps(value), format)


@HOSTILE
@given(
    steps=st.dictionaries(
        st.text(min_size=1, max_size=6),
        st.dictionaries(
            st.sampled_from(
                [
                    "kind",
                    "next",
                    "callback",
                    "targets",
                    "signals",
                    "on",
                    "join",
                    "branches",
                    "each",
                    "start",
                    "policy",
                    "merge",
                    "decisions",
                    "duration",
                    "until",
                    "workflow",
                    "on_completed",
                    "reason",
                ]
            ),
            st.sampled_from(
                [
                    "action",
                    "decision",
                    "wait",
                    "timer",
                    "task",
                    "fork",
                    "join",
                    "call",
                    "end",
                    "fail",
                    "a",
                    "b",
                    "1h",
                    f"{FLOWS}.OrderFlow.ship",
                ]
            )
            | st.lists(st.sampled_from(["a", "b", "go"]), max_size=3)
            | st.dictionaries(
                st.sampled_from(["a", "b", "go"]), st.sampled_from(["a", "b"]), max_size=2
            )
            | st.integers(min_value=-1, max_value=3),
            max_size=5,
        ),
        min_size=1,
        max_size=5,
    ),
    format=st.sampled_from(["yaml", "json"]),
)
def test_random_step_graphs_only_ever_raise_document_error(
    steps: dict[str, Any], format: str
) -> None:
    document = {"id": "random", "version": 1, "signals": {"go": None}, "steps": steps}
    outcome(json.dumps(document), format)


@HOSTILE
@given(data=st.data())
def test_mutations_of_a_valid_document_only_ever_raise_document_error(data: Any) -> None:
    text = ORDER
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        start = data.draw(st.integers(min_value=0, max_value=len(text)))
        end = data.draw(st.integers(min_value=start, max_value=min(len(text), start + 12)))
        insert = data.draw(st.one_of(YAML_PIECES, st.text(max_size=6)))
        text = text[:start] + insert + text[end:]
    outcome(text, "yaml")
