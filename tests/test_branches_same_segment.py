"""A join decided in the fork's own segment: found while building the orders example.

When a branch fails (or completes, under ``any``) during the segment that
forks, the join decides there and supersedes the branches that segment just
created; persisting their new tokens as SUPERSEDED is refused by the branch
store refused (``a branch cannot be written as 'SUPERSEDED'``), so the START
command raised and was retried until it gave up. The store now creates such
tokens superseded.
"""

from __future__ import annotations

import pytest

import vertique_workflow as wf
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_branch_failing_in_the_fork_segment_takes_the_join_on_failed():
    ref = wf.start("eager-fail", {}, idempotency_key="k1")
    run_until_idle(timeout=5)
    view = wf.get(ref.id)
    assert (view.status, view.error_type) == ("FAILED", "GAVE_UP")
    assert {b.branch_id: b.status for b in wf.branches(ref.id)} == {
        "a": "SUPERSEDED",
        "b": "FAILED",
    }
