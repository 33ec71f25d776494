"""Timers, signal timeouts and human tasks, end to end through the command log."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from django.db import connection

import vertique_workflow as wf
from tests.conftest import history_events
from vertique_workflow.models import WorkflowCommand, WorkflowTimer
from vertique_workflow.testing import advance_time, run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def db_clock() -> datetime.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def start(definition: str, payload: Any = None, key: str = "k1") -> Any:
    ref = wf.start(definition, payload or {}, idempotency_key=key)
    run_until_idle()
    return ref.id


def test_a_timer_step_waits_then_fires_once_at_its_time():
    before = db_clock()
    instance = start("nap")
    assert wf.get(instance).status == "WAITING"
    timer = WorkflowTimer.objects.get(workflow_id=instance)
    command = WorkflowCommand.objects.get(pk=timer.command_id)
    assert (timer.status, timer.purpose, command.kind, command.timer_kind) == (
        "SCHEDULED", "STEP", "TIMER", "FIRE"
    )
    assert timer.fire_at == command.fire_at == command.available_at
    assert timer.fire_at >= before + datetime.timedelta(hours=1)
    assert run_until_idle().outcomes == [], "not before its time"
    assert advance_time("1h") == 1
    assert run_until_idle().outcomes == ["COMPLETED"]
    view = wf.get(instance)
    assert (view.status, view.state["woke"]) == ("COMPLETED", True)
    timer.refresh_from_db()
    assert timer.status == "FIRED"
    assert history_events(instance).count("TIMER_FIRED") == 1
