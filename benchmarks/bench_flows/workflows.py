"""The benchmark's workflows: three actions, start → wait → signal → end, a timer, fan-outs."""

from __future__ import annotations

import os
import time
from typing import Any

from vertique_workflow.definitions import (
    StepContext,
    Workflow,
    action,
    end,
    fork,
    join,
    service,
    timer,
    wait,
)
from vertique_workflow.side_effects import service_handler

STAMPS = os.environ.get("VERTIQUE_PEERS_STAMPS")


class ThreeActions(Workflow[dict]):
    id, version, contract = "bench-three-actions", 1, "bench.three"

    @action(start=True, next="second")
    def first(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "a": 1}

    @action(next="third")
    def second(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "b": 2}

    @action(next="done")
    def third(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "c": 3}

    done = end()


class SignalRoundTrip(Workflow[dict]):
    id, version, contract = "bench-signal", 1, "bench.signal"
    signals = {"go": None}

    @action(start=True, next="wait_go")
    def begin(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "begun": True}

    wait_go = wait("go", next="done")
    done = end()


class TimerAt(Workflow[dict]):
    """start → a timer until the instant ``state["fire_at"]`` → end (timer lateness)."""

    id, version, contract = "bench-timer", 1, "bench.timer"

    sleep = timer(until="fire_at", next="done", start=True)

    def fire_at(self, state: dict[str, Any]) -> str:
        return str(state["fire_at"])

    done = end()


class FanOut(Workflow[dict]):
    """A fork over ``state["items"]``: each branch runs one action; joined (policy all)."""

    id, version, contract = "bench-fan", 1, "bench.fan"

    spread = fork(each="items", start="work", join="gathered")

    @action(next="gathered")
    def work(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": ctx.branch_item}

    gathered = join(policy="all", next="done")
    done = end()


class SignalledFanOut(Workflow[dict]):
    """A fork over ``state["items"]``: each branch waits for its own "go", runs one action.

    Every branch is a segment of its own: one branch-addressed signal each.
    """

    id, version, contract = "bench-fan-signal", 1, "bench.fan-signal"
    signals = {"go": None}

    spread = fork(each="items", start="wait_go", join="gathered")
    wait_go = wait("go", next="work")

    @action(next="gathered")
    def work(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        return {**state, "done": ctx.branch_item}

    gathered = join(policy="all", next="done")
    done = end()


@service_handler("bench.noop")
def _noop_handler(request: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"ok": True}


class OneService(Workflow[dict]):
    """start → service (a no-op handler through the outbox and the relay) → end."""

    id, version, contract = "bench-service", 1, "bench.service"

    call_out = service("bench.noop", start=True, next="done", timeout="10s")
    done = end()


class Stamp(Workflow[dict]):
    """One action that stores when it ran (host clock): commit returned -> first action runs.

    With ``VERTIQUE_PEERS_STAMPS`` set (the peers benchmark's latency run) it
    also appends ``<state["i"]> <time>`` to that file, as the Procrastinate
    peer's task does, so both systems are timed by the same file poll (a
    database poll right after the commit would compete with the executor for
    the machine's two cores while it is being timed).
    """

    id, version, contract = "bench-stamp", 1, "bench.stamp"

    @action(start=True, next="done")
    def stamp(self, state: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
        ran_at = time.time()
        if STAMPS:
            with open(STAMPS, "a") as stamps:
                stamps.write(f"{state.get('i')} {ran_at}\n")
        return {**state, "ran_at": ran_at}

    done = end()
