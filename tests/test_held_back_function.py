"""The held-back rule as a function (0011) judges every timer as the inline rule did.

Until 0011 the rule was two ``EXISTS`` written into every eligibility statement;
``OLD_RULE`` is that text. Each case below is an instance of its own holding
one timer and at most one other command, so a verdict depends on that pair
only; the function and the old text must agree on every timer, and both
verdicts must occur.
"""

from __future__ import annotations

import itertools
import json
import uuid

import pytest
from django.db import connection

from vertique_workflow import tables
from vertique_workflow.store.eligibility import ACTIVE_STATES, held_back

pytestmark = pytest.mark.django_db

T = tables.sql_names()

OLD_RULE = f"""(c.kind = 'TIMER' AND (
    (c.timer_kind IN ('DUE', 'REMINDER') AND EXISTS (
        SELECT 1 FROM {T["tasks"]} ht WHERE ht.id = c.task_id AND ht.status = 'COMPLETING'))
    OR (c.timer_kind = 'TIMEOUT' AND EXISTS (
        SELECT 1 FROM {T["commands"]} hs
        WHERE hs.workflow_id = c.workflow_id AND hs.kind IN ('SIGNAL', 'COMPLETION')
          AND hs.state IN {ACTIVE_STATES} AND hs.recorded_at < c.fire_at
          AND (c.target_json IS NULL
               OR (hs.kind = 'SIGNAL'
                   AND (c.target_json -> 'signalNames') ? (hs.target_json ->> 'name')
                   AND (hs.target_json ->> 'branchId') IS NOT DISTINCT FROM
                       (c.target_json ->> 'branchId'))
               OR (hs.kind = 'COMPLETION' AND hs.task_id = c.task_id))))))"""

TARGETS = [
    None,
    {"signalNames": ["go"]},
    {"signalNames": ["go"], "branchId": "b1"},
    {"signalNames": ["other"]},
]
# (kind, target_json, same task as the timeout's)
OTHERS = [
    ("SIGNAL", {"name": "go"}, False),
    ("SIGNAL", {"name": "go", "branchId": "b1"}, False),
    ("SIGNAL", {"name": "other"}, False),
    ("COMPLETION", None, True),
    ("COMPLETION", None, False),
]
STATES = ["PENDING", "DEFERRED", "CLAIMED", "PARKED", "COMPLETE"]
TASK_STATUSES = ["OPEN", "COMPLETING", "COMPLETED", None]


def instance(cur) -> uuid.UUID:
    workflow_id = uuid.uuid4()
    cur.execute(
        f"INSERT INTO {T['instances']} (id, definition_id, definition_version, plan_hash, status)"
        " VALUES (%s, 'd', 1, 'h', 'RUNNING')",
        [workflow_id],
    )
    return workflow_id


def task(cur, workflow_id: uuid.UUID, status: str | None) -> uuid.UUID | None:
    if status is None:
        return None
    task_id = uuid.uuid4()
    cur.execute(
        f"INSERT INTO {T['tasks']} (id, workflow_id, step_id, name, status)"
        " VALUES (%s, %s, 's', 'n', %s)",
        [task_id, workflow_id, status],
    )
    return task_id


def command(
    cur,
    workflow_id,
    seq,
    kind,
    state,
    *,
    timer_kind=None,
    task_id=None,
    target=None,
    recorded="now()",
    fire_at=None,
) -> None:
    cur.execute(
        f"INSERT INTO {T['commands']} (workflow_id, seq, kind, state, timer_kind, task_id,"
        f" target_json, recorded_at, fire_at, available_at) VALUES (%s, %s, %s, %s, %s, %s,"
        f" %s::jsonb, {recorded}, %s, now())",
        [
            workflow_id,
            seq,
            kind,
            state,
            timer_kind,
            task_id,
            None if target is None else json.dumps(target),
            fire_at,
        ],
    )


def test_the_function_judges_every_timer_as_the_inline_rule_did():
    with connection.cursor() as cur:
        cur.execute("SELECT now() + interval '1 hour'")
        (fire_at,) = cur.fetchone()
        for timer_kind, status in itertools.product(["DUE", "REMINDER", "FIRE"], TASK_STATUSES):
            workflow_id = instance(cur)
            command(
                cur,
                workflow_id,
                1,
                "TIMER",
                "PENDING",
                timer_kind=timer_kind,
                task_id=task(cur, workflow_id, status),
                fire_at=fire_at,
            )
        for target, (kind, other_target, same_task), state, recorded in itertools.product(
            TARGETS, OTHERS, STATES, ["now()", "now() + interval '2 hours'"]
        ):
            workflow_id = instance(cur)
            task_id = task(cur, workflow_id, "OPEN")
            other_task = task_id if same_task else task(cur, workflow_id, "OPEN")
            command(
                cur,
                workflow_id,
                1,
                kind,
                state,
                target=other_target,
                task_id=other_task if kind == "COMPLETION" else None,
                recorded=recorded,
            )
            command(
                cur,
                workflow_id,
                2,
                "TIMER",
                "PENDING",
                timer_kind="TIMEOUT",
                task_id=task_id,
                target=target,
                fire_at=fire_at,
            )
        cur.execute(
            f"SELECT c.id, {OLD_RULE}, {held_back('c')} FROM {T['commands']} c"
            " WHERE c.kind = 'TIMER' ORDER BY c.id"
        )
        verdicts = cur.fetchall()
    assert len(verdicts) == 3 * len(TASK_STATUSES) + len(TARGETS) * len(OTHERS) * len(STATES) * 2
    assert [(id_, old) for id_, old, _ in verdicts] == [(id_, new) for id_, _, new in verdicts]
    assert {old for _, old, _ in verdicts} == {True, False}
