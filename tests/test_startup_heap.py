"""The executor keeps what start-up loaded out of the cyclic collector while it runs.

``executor/startup_heap.py``: frozen for the run; given back at its end
when nothing was frozen before (a fresh interpreter: run in a subprocess,
so the rule is checked against what that interpreter had frozen, none on
Python 3.11 and 3.13, a few hundred objects on 3.12), kept frozen when
something was (a host's own freeze); the command runs its executor inside it.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys

import pytest
from django.core.management import call_command

import vertique_workflow as wf
from vertique_workflow.executor.startup_heap import kept_from_collector


def test_what_is_alive_at_entry_is_frozen_for_the_body():
    before = object.__new__(type("Before", (), {}))  # a tracked object alive at entry
    held = gc.get_freeze_count()
    with kept_from_collector() as frozen:
        assert frozen > 0
        assert gc.get_freeze_count() > held
        # frozen objects are outside every generation the collector walks
        assert not any(found is before for found in gc.get_objects())
        during = object.__new__(type("During", (), {}))
        assert any(found is during for found in gc.get_objects())


# Run in a fresh interpreter: what it had frozen at start, what the body saw,
# what stays frozen after, and whether an object alive at entry is collectable again.
_PROBE = """
import gc, json
from vertique_workflow.executor.startup_heap import kept_from_collector
if HOST_FREEZES:
    gc.freeze()
held = gc.get_freeze_count()
before = object.__new__(type("Before", (), {}))
with kept_from_collector() as frozen:
    inside = gc.get_freeze_count()
after = gc.get_freeze_count()
back = any(found is before for found in gc.get_objects())
print(json.dumps({"held": held, "frozen": frozen, "inside": inside, "after": after, "back": back}))
"""


def _probe(host_freezes: bool) -> dict[str, int]:
    script = _PROBE.replace("HOST_FREEZES", str(host_freezes))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_heap_is_given_back_after_the_body_when_nothing_was_frozen_before():
    seen = _probe(host_freezes=False)
    assert seen["frozen"] > 0 and seen["inside"] > seen["held"]
    if seen["held"] == 0:  # Python 3.11, 3.13: the interpreter froze nothing
        assert seen["after"] == 0 and seen["back"], seen
    else:  # Python 3.12 freezes a few hundred objects at start-up: ours stay frozen too
        assert seen["after"] >= seen["held"] and not seen["back"], seen


def test_a_freeze_made_before_is_never_undone():
    seen = _probe(host_freezes=True)
    assert seen["held"] > 0 and seen["frozen"] > 0
    assert seen["after"] >= seen["held"] and not seen["back"], seen


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
    held = gc.get_freeze_count()
    # the command sets the package logger's level from its verbosity: restored after
    package_logger = logging.getLogger("vertique_workflow")
    previous = package_logger.level
    try:
        with caplog.at_level(logging.DEBUG, logger="vertique_workflow.executor"):
            call_command("workflow_executor", "--until-idle", "--concurrency", "1", verbosity=3)
    finally:
        package_logger.setLevel(previous)
    assert wf.get(ref.id).status == "COMPLETED"
    assert len(seen) == 1 and seen[0] > held
    if held == 0:
        assert gc.get_freeze_count() == 0  # the test process has its heap back
    suffix = " start-up objects kept out of the cyclic garbage collector"
    logged = [m for m in (r.getMessage() for r in caplog.records) if m.endswith(suffix)]
    assert len(logged) == 1 and int(logged[0].removesuffix(suffix)) > 0
