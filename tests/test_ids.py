"""Instance, timer, task and branch-token ids are time-ordered UUIDs (version 7).

A random id puts each new row on a random leaf page of every index keyed by
it; a version 7 id begins with its millisecond, so new rows share the last
pages (docs/performance.md, "Time-ordered instance ids").
"""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

import vertique_workflow as wf
from vertique_workflow.ids import compose, uuid7
from vertique_workflow.models import WorkflowBranchToken, WorkflowTask, WorkflowTimer
from vertique_workflow.testing import run_until_idle


def _millis(value: uuid.UUID) -> int:
    return value.int >> 80


@given(millis=st.integers(0, 2**48 - 1), random=st.binary(min_size=10, max_size=10))
def test_compose_lays_out_version_variant_milliseconds_and_74_random_bits(
    millis: int, random: bytes
) -> None:
    value = compose(millis, random)
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert _millis(value) == millis
    bits = int.from_bytes(random, "big")
    assert (value.int >> 64) & 0xFFF == (bits >> 62) & 0xFFF  # rand_a: 12 bits
    assert value.int & (2**62 - 1) == bits & (2**62 - 1)  # rand_b: 62 bits


def test_a_later_millisecond_sorts_after_whatever_the_random_bits() -> None:
    early = compose(1_000, b"\xff" * 10)
    late = compose(1_001, b"\x00" * 10)
    assert early < late
    assert str(early) < str(late)  # as text too, as PostgreSQL's uuid order is bytewise


def test_uuid7_carries_the_millisecond_it_was_made_and_never_repeats() -> None:
    before = time.time_ns() // 1_000_000
    made = [uuid7() for _ in range(10_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(made)) == len(made)
    assert all(m.version == 7 and before <= _millis(m) <= after for m in made)


@pytest.mark.django_db(transaction=True)
def test_started_instances_get_version_7_ids_in_the_order_of_their_milliseconds() -> None:
    first = wf.start("parallel", {}, idempotency_key="ids-1").id
    second = wf.start("parallel", {}, idempotency_key="ids-2").id
    assert (first.version, second.version) == (7, 7)
    assert _millis(first) <= _millis(second)


@pytest.mark.django_db(transaction=True)
def test_branch_tokens_tasks_and_timers_get_version_7_ids() -> None:
    forked = wf.start("parallel", {}, idempotency_key="ids-fork").id
    review = wf.start("review", {"manager": "ann"}, idempotency_key="ids-review").id
    nap = wf.start("nap", {}, idempotency_key="ids-nap").id
    run_until_idle()
    tokens = list(WorkflowBranchToken.objects.filter(workflow_id=forked))
    tasks = list(WorkflowTask.objects.filter(workflow_id=review))
    due = list(WorkflowTimer.objects.filter(workflow_id=review))  # the task's due timer
    step = list(WorkflowTimer.objects.filter(workflow_id=nap))  # a timer step's
    assert tokens and tasks and due and step
    assert {row.id.version for row in [*tokens, *tasks, *due, *step]} == {7}
