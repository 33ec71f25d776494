"""The benchmark's workflows: three actions, start → wait → signal → end, and a timer."""

from __future__ import annotations

from typing import Any

from vertique_workflow.definitions import StepContext, Workflow, action, end, timer, wait


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
