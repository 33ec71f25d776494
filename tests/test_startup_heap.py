"""The executor keeps what start-up loaded out of the cyclic collector while it runs.

``executor/startup_heap.py``: frozen for the run, given back at its end, a
host's own freeze left alone; the command runs its executor inside it.
"""

from __future__ import annotations

import gc
import logging

import pytest
from django.core.management import call_command

import vertique_workflow as wf
from vertique_workflow.executor.startup_heap import kept_from_collector


def test_what_is_alive_at_entry_is_frozen_for_the_body_and_given_back_after():
    assert gc.get_freeze_count() == 0
    before = object.__new__(type("Before", (), {}))  # a tracked object alive at entry
    with kept_from_collector() as frozen:
        # frozen objects freed since (by reference counting) leave the count
        assert frozen >= gc.get_freeze_count() > 0
        # frozen objects are outside every generation the collector walks
        assert not any(found is before for found in gc.get_objects())
        during = object.__new__(type("During", (), {}))
        assert any(found is during for found in gc.get_objects())
    assert gc.get_freeze_count() == 0
    assert any(found is before for found in gc.get_objects())


def test_a_process_that_froze_objects_itself_is_left_as_it_is():
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        assert held > 0
        with kept_from_collector() as frozen:
            assert frozen == 0
            assert gc.get_freeze_count() == held
        assert gc.get_freeze_count() == held  # not unfrozen by us
    finally:
        gc.unfreeze()


@pytest.mark.django_db(transaction=True)
def test_the_command_runs_its_executor_with_the_start_up_heap_frozen(monkeypatch, caplog):
    from vertique_workflow.executor import daemon

    seen: list[int] = []
    real_run = daemon.Executor.run

    def run(self, *args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(daemon.Executor, "run", run)
    ref = wf.start("order", {"amount": 0}, idempotency_key="heap")
    # the command sets the package logger's level from its verbosity: restored after
    package_logger = logging.getLogger("vertique_workflow")
    previous = package_logger.level
    try:
        with caplog.at_level(logging.DEBUG, logger="vertique_workflow.executor"):
            call_command("workflow_executor", "--until-idle", "--concurrency", "1", verbosity=3)
    finally:
        package_logger.setLevel(previous)
    assert wf.get(ref.id).status == "COMPLETED"
    assert len(seen) == 1 and seen[0] > 0
    assert gc.get_freeze_count() == 0  # the test process has its heap back
    suffix = " start-up objects kept out of the cyclic garbage collector"
    logged = [m for m in (r.getMessage() for r in caplog.records) if m.endswith(suffix)]
    # the count at the freeze; frozen objects freed since (by reference counting) leave it
    assert len(logged) == 1 and int(logged[0].removesuffix(suffix)) >= seen[0]
