"""The decision log's state patch: jsonpatch's own patch, read off directly where that is safe."""

from __future__ import annotations

import copy
import json

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from vertique_workflow.engine import decision_log
from vertique_workflow.engine.decision_log import state_patch

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
# keys that need escaping in a JSON pointer, and the empty key, come up often
keys = st.sampled_from(["a", "b", "", "x/y", "t~1", "~", "/"]) | st.text(max_size=4)
states = st.dictionaries(keys, values, max_size=5)


@st.composite
def steps(draw):
    """A state and the state a step leaves: keys set, added, sometimes removed or nested changes."""
    before = draw(states)
    after = copy.deepcopy(before)  # the drive's states are JSON copies: nothing is shared
    for key in draw(st.lists(keys, max_size=4)):
        after[key] = draw(values if draw(st.booleans()) else scalars)
    if before and draw(st.integers(0, 4)) == 0:
        after.pop(draw(st.sampled_from(sorted(before))), None)
    return before, after


@settings(max_examples=400, deadline=None)
@given(steps())
def test_the_patch_is_the_one_jsonpatch_makes(step):
    before, after = step
    patch = state_patch(before, after)
    assert patch == jsonpatch.make_patch(before, after).patch
    assert jsonpatch.apply_patch(before, patch) == after
    # and equal as JSON text, where == would take 1, 1.0 and true for one another
    applied = jsonpatch.apply_patch(before, patch)
    assert json.dumps(applied, sort_keys=True) == json.dumps(after, sort_keys=True)


def test_a_top_level_change_is_read_off_without_jsonpatch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("jsonpatch was asked")

    monkeypatch.setattr(decision_log.jsonpatch, "make_patch", refuse)
    before = {"a": 1, "items": [1, {"k": "v"}], "x/y": "old"}
    after = {"a": 2, "items": [1, {"k": "v"}], "x/y": "new", "c": {"d": []}}
    assert state_patch(before, after) == [
        {"op": "add", "path": "/c", "value": {"d": []}},
        {"op": "replace", "path": "/a", "value": 2},
        {"op": "replace", "path": "/x~1y", "value": "new"},
    ]
    assert state_patch(before, copy.deepcopy(before)) == []


def test_values_equal_in_python_but_not_in_json_are_a_change():
    for old, new in [(1, True), (1, 1.0), (0.0, -0.0), (0, False)]:
        replace = [{"op": "replace", "path": "/v", "value": new}]
        assert state_patch({"v": old}, {"v": new}) == replace
        nested = state_patch({"v": [old]}, {"v": [new]})
        assert nested == jsonpatch.make_patch({"v": [old]}, {"v": [new]}).patch != []


def test_a_removed_key_or_a_changed_list_goes_to_jsonpatch(monkeypatch):
    asked = []
    real = jsonpatch.make_patch
    monkeypatch.setattr(
        decision_log.jsonpatch, "make_patch", lambda b, a: asked.append(1) or real(b, a)
    )
    removed = ({"a": 1, "b": 2}, {"b": 2, "c": 1})
    assert state_patch(*removed) == real(*removed).patch
    changed_list = ({"l": [1, 2]}, {"l": [1, 3]})
    assert state_patch(*changed_list) == [{"op": "replace", "path": "/l/1", "value": 3}]
    assert len(asked) == 2
