"""The engine's work per branch of a fan-out must not grow with the fan-out's width.

A fan-out over ``items`` gave every branch its own copy of the state, the
list included (now the field is empty in a branch's copy: the branch has its
item in ``ctx.branch_item``), and logs a ``BRANCH_DECISION`` with a JSON patch per branch
step. The patch is computed by ``jsonpatch.make_patch`` over the branch's
whole state (``engine/decision_log.decision_entries``), which compares the
unchanged ``items`` list element by element (a ``json.dumps`` per element),
and ``payloads.json_copy`` walks the whole state once per branch run: the
work per branch is proportional to the width, the fan-out's to its square.
``benchmarks/fanout_benchmark.py`` shows it: a 1000-branch fan-out's one
segment took ~21 s on a loaded 2-core machine (485 branches/s at width 100,
48 at width 1000), close to the default ``SEGMENT_DEADLINE_MS`` of 30 s, so
a few thousand items pass the deadline on every attempt and never finish.

Counted, not timed: the Python function calls of the segment (cProfile's
total), which a linear engine keeps within a constant factor of the width.
"""

from __future__ import annotations

import cProfile
import pstats

import pytest

import vertique_workflow as wf
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def calls_to_drain(width: int, key: str) -> int:
    ref = wf.start("fan", {"items": list(range(width))}, idempotency_key=key)
    profile = cProfile.Profile()
    profile.enable()
    run_until_idle()
    profile.disable()
    assert wf.get(ref.id).status == "COMPLETED"
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def test_a_fan_out_costs_work_proportional_to_its_width_not_its_square():
    narrow = calls_to_drain(30, "narrow")
    wide = calls_to_drain(300, "wide")
    # ten times the branches: a linear engine makes about ten times the calls
    assert wide <= 15 * narrow, f"{wide} calls for 300 branches, {narrow} for 30"


def calls_to_signal_every_branch(width: int, key: str) -> tuple[int, int]:
    """(Python calls, token rows read) to drain one branch signal per branch of a fan-out."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from vertique_workflow import tables

    ref = wf.start("signalled-fan", {"items": list(range(width))}, idempotency_key=key)
    run_until_idle()
    for n in range(width):
        wf.signal(ref.id, "go", None, dedup_key=f"{key}-{n}", branch=("spread", str(n)))
    profile = cProfile.Profile()
    with CaptureQueriesContext(connection) as captured:
        profile.enable()
        run_until_idle()
        profile.disable()
    assert wf.get(ref.id).status == "COMPLETED"
    full_reads = [
        q["sql"]
        for q in captured.captured_queries
        if tables.BRANCH_TOKENS in q["sql"]
        and q["sql"].lstrip().startswith("SELECT")
        and "RECURSIVE" not in q["sql"]
    ]
    return pstats.Stats(profile).total_calls, len(full_reads)  # type: ignore[attr-defined]


def test_a_branch_signal_reads_its_own_branch_not_every_token_of_the_fan_out():
    narrow, narrow_reads = calls_to_signal_every_branch(20, "narrow")
    wide, wide_reads = calls_to_signal_every_branch(200, "wide")
    # every token is read once: when the last signal's branch decides the join
    assert (narrow_reads, wide_reads) == (1, 1)
    # ten times the signals: about ten times the calls, not a hundred
    assert wide <= 15 * narrow, f"{wide} calls for 200 signals, {narrow} for 20"
