"""The scale benchmark's seeder writes rows the engine's own reads accept.

benchmarks/scale_seed.py mimics what real runs leave behind; if the schema
or the engine's rows change and the seeder does not follow, the million-row
figures would measure tables the app never has. These tests seed a few
hundred instances and read them back through the public API.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

import vertique_workflow as wf
from benchmarks.scale_seed import DEFINITIONS, HISTORY_PER_INSTANCE, KIND_STATUS, expected_mix, seed
from vertique_workflow import probe
from vertique_workflow.models import (
    WorkflowCommand,
    WorkflowCommandQueue,
    WorkflowHistory,
    WorkflowInstance,
    WorkflowTask,
    WorkflowTimer,
)
from vertique_workflow.tables import sql_names

pytestmark = pytest.mark.django_db

COUNT = 200


T = sql_names()


@pytest.fixture
def seeded() -> dict[str, int]:
    report = seed(COUNT)
    assert report.count == COUNT
    return expected_mix(COUNT)


def test_the_counts_per_status_match_the_mix(seeded: dict[str, int]) -> None:
    statuses = Counter(WorkflowInstance.objects.values_list("status", flat=True))
    wanted: Counter[str] = Counter()
    for kind, n in seeded.items():
        wanted[KIND_STATUS[kind]] += n
    assert statuses == wanted
    assert sum(seeded.values()) == COUNT
    assert WorkflowInstance.objects.filter(archived_at__isnull=False).count() == seeded["archived"]
    assert WorkflowTask.objects.filter(status="OPEN").count() == seeded["task"]
    assert WorkflowTimer.objects.filter(status="SCHEDULED").count() == seeded["timer"]
    scopes = Counter(WorkflowInstance.objects.values_list("scope_key", flat=True))
    assert set(scopes) == {"default", "tenant-a", "tenant-b"}


def test_every_instance_has_its_history_commands_and_queue_row(seeded: dict[str, int]) -> None:
    assert WorkflowHistory.objects.count() == COUNT * HISTORY_PER_INSTANCE
    assert WorkflowCommandQueue.objects.count() == COUNT
    with connection.cursor() as cursor:
        # sequences 1..5 without gaps, queue next_seq one past the last command
        cursor.execute(
            f"""
            SELECT count(*) FROM {T["instances"]} i
            WHERE (SELECT array_agg(h.sequence ORDER BY h.sequence) FROM {T["history"]} h
                   WHERE h.workflow_id = i.id) <> ARRAY[1, 2, 3, 4, 5]::bigint[]
               OR (SELECT q.next_seq FROM {T["command_queues"]} q WHERE q.workflow_id = i.id)
                  <> 1 + (SELECT max(c.seq) FROM {T["commands"]} c WHERE c.workflow_id = i.id)
            """
        )
        assert cursor.fetchone()[0] == 0
        # every pin is a registered definition
        cursor.execute(
            f"""
            SELECT count(*) FROM {T["instances"]} i WHERE NOT EXISTS (
                SELECT 1 FROM {T["definitions"]} d
                WHERE (d.scope_key, d.definition_id, d.definition_version, d.plan_hash)
                    = (i.definition_scope_key, i.definition_id, i.definition_version, i.plan_hash))
            """
        )
        assert cursor.fetchone()[0] == 0
    pins = set(WorkflowInstance.objects.values_list("definition_id", "definition_version"))
    assert pins == {(d, v) for d, v, _ in DEFINITIONS}
    assert WorkflowCommand.objects.filter(kind="START").count() == COUNT
    assert WorkflowCommand.objects.filter(state="DEAD").count() == seeded["failed"]
    timer_commands = WorkflowCommand.objects.filter(kind="TIMER", state="PENDING")
    assert timer_commands.count() == seeded["timer"]
    assert set(WorkflowTimer.objects.values_list("command_id", flat=True)) == set(
        timer_commands.values_list("id", flat=True)
    )


def test_seeded_instances_read_back_through_the_api(seeded: dict[str, int]) -> None:
    for status in ("COMPLETED", "FAILED", "WAITING"):
        row = WorkflowInstance.objects.filter(status=status, archived_at__isnull=True).first()
        assert row is not None
        view = wf.get(row.id)
        assert view.status == status
        # the decision log replays to the stored state
        page = wf.history(row.id, limit=50)
        assert [e.sequence for e in page.entries] == [1, 2, 3, 4, 5]
        assert page.state_at(5) == row.state_json
        if status == "FAILED":
            assert view.dead_commands == 1
            assert view.last_failure is not None
            assert view.last_failure.reason_code == "ATTEMPTS_EXHAUSTED"
            assert [c.state for c in page.open_commands] == ["DEAD"]
        elif status == "COMPLETED":
            assert view.dead_commands == 0
            assert page.open_commands == []


def test_the_probe_reports_idle_and_the_list_hides_archived_rows(seeded: dict[str, int]) -> None:
    # nothing seeded is claimable: ended instances settled, timers fire in 30 days
    assert probe.is_idle(on_caller_connection=True)

    def listed(**filters: object) -> int:
        total, cursor = 0, None
        while True:
            page = wf.instances(limit=50, cursor=cursor, **filters)
            total += len(page.items)
            cursor = page.next_cursor
            if cursor is None:
                return total

    assert listed() == COUNT - seeded["archived"]
    assert listed(include_archived=True) == COUNT
    assert listed(status="FAILED") == seeded["failed"]
    assert listed(status="WAITING") == seeded["task"] + seeded["timer"]
    assert wf.count_non_terminal("scale-approval", 1) == seeded["task"]
