"""The flat public API: ``import vertique_workflow as wf`` resolves its names lazily, once."""

from __future__ import annotations

import pytest

import vertique_workflow as wf
from vertique_workflow import operations


def test_a_public_name_is_the_implementation_and_is_resolved_once():
    assert wf.start is operations.start
    # cached on the package: a start in a loop reads an attribute, not the importer
    assert vars(wf)["start"] is operations.start


def test_every_exported_name_resolves():
    for name in wf.__all__:
        assert getattr(wf, name) is not None


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no attribute 'strat'"):
        wf.strat  # noqa: B018
