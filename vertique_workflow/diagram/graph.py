"""The edges a diagram draws: the plan's transitions, merged per pair of steps, with labels.

Edges come from :func:`vertique_workflow.definitions.validation.transitions`
(the one enumeration of where a step can go), so the picture and the
validation never disagree about a plan's graph. Two transitions between the
same pair of steps (``approve`` and a timeout both leading to ``done``) are
one drawn edge whose label names both: parallel arrows would lie on top of
each other.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from ..definitions.plan import Plan, Step
from ..definitions.validation import Transition, transitions

__all__ = ["Edge", "format_duration", "plan_edges", "transition_label"]


@dataclass(frozen=True)
class Edge:
    """One drawn edge: the step pair, the kinds of the transitions it stands for, its label."""

    source: str
    target: str
    kinds: tuple[str, ...]
    label: str


_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(value: datetime.timedelta | None) -> str:
    """``1d12h`` for 36 hours: the spelling ``parse_duration`` reads, largest unit first."""
    if value is None:
        return ""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def transition_label(step: Step, transition: Transition) -> str:
    """The text an edge shows for one transition ("" for a plain next or a decision's target).

    A wait's ``next`` is labelled with the signals that take it (those
    without an ``on`` route of their own), a timer's with its delay, a
    fork's first steps with the branch id or the fan-out's list.
    """
    kind = transition.kind
    if kind in ("signal", "decision", "branch"):
        return str(transition.key)
    if kind == "timeout":
        return f"timeout {format_duration(step.timeout)}"
    if kind == "due":
        due = step.task.due if step.task is not None else None
        return f"due {format_duration(due)}"
    if kind == "on_failed":
        return "failed"
    if kind == "on_completed":
        return "completed"
    if kind == "each":
        fork = step.fork
        each = fork.each if fork is not None else None
        name = each if isinstance(each, str) else (fork.each_name if fork is not None else None)
        return f"each {str(name).rsplit('.', 1)[-1]}" if name else "each"
    if kind == "next" and step.kind == "wait":
        return ", ".join(name for name in step.signals if name not in step.on_signal)
    if kind == "next" and step.kind == "timer":
        return f"after {format_duration(step.delay)}" if step.delay is not None else "until"
    return ""


def plan_edges(plan: Plan) -> list[Edge]:
    """Every transition of ``plan`` as drawn edges, in declaration order of steps and fields."""
    merged: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for step in plan.steps.values():
        for transition in transitions(step):
            kinds, labels = merged.setdefault((step.id, transition.target), ([], []))
            if transition.kind not in kinds:
                kinds.append(transition.kind)
            label = transition_label(step, transition)
            if label and label not in labels:
                labels.append(label)
    return [
        Edge(source, target, tuple(kinds), " / ".join(labels))
        for (source, target), (kinds, labels) in merged.items()
    ]
