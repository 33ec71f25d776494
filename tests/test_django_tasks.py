"""The Django Tasks recorder: service calls enqueued on commit through Django's Tasks (issue 12)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

import vertique_workflow as wf
from tests.conftest import history_events
from tests.flows.models import HandlerCall
from vertique_workflow.engine.effects import RecordSideEffect
from vertique_workflow.executor.backoff import JITTER_MIN
from vertique_workflow.models import WorkflowServiceCall
from vertique_workflow.side_effects import RecordBatch
from vertique_workflow.side_effects import django_tasks as recorder_module
from vertique_workflow.side_effects.django_tasks import DjangoTasksRecorder, framework
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

FRAMEWORK = framework()
if FRAMEWORK is None:  # tox installs the backport on Django 5.2; Django 6 ships django.tasks
    raise ImproperlyConfigured(recorder_module.MISSING_FRAMEWORK)
BACKENDS = FRAMEWORK.__name__ + ".backends"
IMMEDIATE = {"default": {"BACKEND": f"{BACKENDS}.immediate.ImmediateBackend"}}
DUMMY = {"default": {"BACKEND": f"{BACKENDS}.dummy.DummyBackend"}}
RECORDER = "vertique_workflow.side_effects.django_tasks.DjangoTasksRecorder"


@pytest.fixture
def tasks_recorder(settings: Any) -> None:
    """The Django Tasks recorder is the ``service`` recorder (no outbox)."""
    settings.VERTIQUE_WORKFLOW = {**settings.VERTIQUE_WORKFLOW, "RECORDERS": [RECORDER]}


@pytest.fixture
def immediate(settings: Any, tasks_recorder: None) -> None:
    settings.TASKS = IMMEDIATE


@pytest.fixture
def dummy(settings: Any, tasks_recorder: None) -> Any:
    """A backend that keeps what was enqueued (and can defer); returns it."""
    settings.TASKS = DUMMY
    backend = FRAMEWORK.task_backends["default"]
    backend.results.clear()
    return backend


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The inline backoffs the task waited (recorded instead of slept)."""
    waited: list[float] = []
    monkeypatch.setattr(recorder_module, "sleep", waited.append)
    return waited


def calls() -> list[int]:
    return list(HandlerCall.objects.filter(handler="charge").values_list("attempt", flat=True))


def start(payload: Any, key: str = "k1") -> Any:
    return wf.start("svc-charge", payload, idempotency_key=key).id


def test_with_the_immediate_backend_the_workflow_advances_exactly_once(immediate, sleeps):
    instance = start({"amount": 7})
    run_until_idle(services=False)
    view = wf.get(instance)
    assert view.status == "COMPLETED"
    assert view.state["charge"] == {"charge_id": "ch-7", "calls": 1}
    assert calls() == [1]
    assert history_events(instance).count("SERVICE_RESULT") == 1
    assert not WorkflowServiceCall.objects.exists(), "the outbox is not used"
    assert sleeps == []


def test_the_dispatch_is_enqueued_on_commit_with_plain_json_arguments(dummy):
    instance = start({"amount": 4})
    run_until_idle(services=False)
    [result] = dummy.results
    kwargs = result.kwargs
    assert result.task.name == "deliver_service_call"
    assert (kwargs["workflow_id"], kwargs["step_id"], kwargs["handler"]) == (
        str(instance),
        "pay",
        "test.charge",
    )
    assert kwargs["request"] == {"amount": 4}
    assert kwargs["policy"]["attempts"] == 3
    assert kwargs["dispatch_key"].startswith(f"vertique.service:{instance}:")
    assert calls() == [], "enqueued, not run: the dummy backend runs nothing"
    assert wf.get(instance).current_step == "pay"


def _batch() -> RecordBatch:
    effect = RecordSideEffect(
        "service",
        "pay",
        "key-1",
        {"handler": "test.charge", "request": {}, "policy": {"attempts": 1}},
    )
    return RecordBatch("service", uuid.uuid4(), None, "svc-charge", 1, (effect,))


def test_nothing_is_enqueued_when_the_recording_transaction_rolls_back(dummy):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        DjangoTasksRecorder().record(_batch())
        raise Rollback
    assert dummy.results == []
    with transaction.atomic():
        DjangoTasksRecorder().record(_batch())
        assert dummy.results == [], "not before the commit"
    assert [r.kwargs["dispatch_key"] for r in dummy.results] == ["key-1"]


def test_a_duplicate_delivery_is_absorbed(dummy):
    instance = start({"amount": 2})
    run_until_idle(services=False)
    [result] = dummy.results
    assert result.task.call(*result.args, **result.kwargs) == "DELIVERED"
    assert result.task.call(*result.args, **result.kwargs) == "DUPLICATE"
    run_until_idle(services=False)
    assert calls() == [1, 1], "called at least once: the duplicate calls again"
    assert wf.get(instance).status == "COMPLETED"
    assert history_events(instance).count("SERVICE_RESULT") == 1


def test_retries_honour_the_policy_inline_when_the_backend_cannot_defer(immediate, sleeps):
    instance = start({"amount": 3, "fail_times": 2})
    run_until_idle(services=False)
    assert calls() == [1, 2, 3]
    assert wf.get(instance).status == "COMPLETED"
    # backoff 10 ms doubling to max_backoff 20 ms, with the executor's jitter
    assert len(sleeps) == 2
    assert 0.010 * JITTER_MIN <= sleeps[0] <= 0.010
    assert 0.020 * JITTER_MIN <= sleeps[1] <= 0.020


def test_spent_attempts_take_the_failure_path_with_the_reason(immediate, sleeps):
    instance = start({"amount": 3, "fail_times": 5})
    run_until_idle(services=False)
    view = wf.get(instance)
    assert calls() == [1, 2, 3], "attempts=3 bounds the calls"
    assert (view.status, view.current_step) == ("COMPLETED", "declined")
    assert view.state["error"].startswith("ATTEMPTS_EXHAUSTED: attempt 3 of 3")


def test_an_error_retry_on_does_not_name_is_not_retried(immediate, sleeps):
    instance = start({"amount": 3, "refuse": True})
    run_until_idle(services=False)
    assert calls() == [1]
    assert sleeps == []
    assert wf.get(instance).state["error"].startswith("HANDLER_FAILED: attempt 1 of 3: Refused")


def test_a_backend_that_defers_gets_the_retry_enqueued_with_run_after(dummy, sleeps):
    from django.utils import timezone

    instance = start({"amount": 3, "fail_times": 1})
    run_until_idle(services=False)
    [first] = dummy.results
    before = timezone.now()
    assert first.task.call(*first.args, **first.kwargs) == "DEFERRED"
    [_, retry] = dummy.results
    assert retry.kwargs["attempt"] == 2
    assert retry.task.run_after is not None and retry.task.run_after > before
    assert sleeps == [], "no inline wait when the backend defers"
    assert retry.task.call(*retry.args, **retry.kwargs) == "DELIVERED"
    run_until_idle(services=False)
    assert calls() == [1, 2]
    assert wf.get(instance).state["charge"]["calls"] == 2


def test_without_the_framework_the_recorder_is_refused_with_a_check(monkeypatch, tasks_recorder):
    from vertique_workflow.checks import check_service_handlers
    from vertique_workflow.side_effects import reset_recorders

    monkeypatch.setattr(recorder_module, "deliver_service_call", None)
    with pytest.raises(ImproperlyConfigured, match="Tasks framework"):
        DjangoTasksRecorder()
    reset_recorders()
    try:
        ids = [error.id for error in check_service_handlers()]
    finally:
        reset_recorders()
    assert "vertique_workflow.E022" in ids
