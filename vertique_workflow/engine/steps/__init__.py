"""One module per step kind; ``KINDS`` maps a plan step's ``kind`` to its module.

A kind answers two questions (``shared/DESIGN.md`` 5a): what happens when a
token *enters* a step of this kind (run code and name the next step, or
halt -- wait or end -- with effects), and which events it *accepts* while a
token waits there (``refusal`` returns None for an accepted event;
``accept`` applies it and names the next step or halts again). A kind that
never waits accepts nothing. ``engine/drive.py`` is the loop and never names
a kind; adding one is a module here, a DSL constructor and a document form.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import action, call, decision, end, fail, fork, join, service, task, timer, wait

__all__ = ["KINDS", "StepKind"]


@dataclass(frozen=True)
class StepKind:
    """The engine's view of a step kind (see the module docstring)."""

    name: str
    enter: Callable[..., Any]
    refusal: Callable[..., Any] | None = None
    accept: Callable[..., Any] | None = None


KINDS: dict[str, StepKind] = {
    module.NAME: StepKind(
        module.NAME,
        module.enter,
        getattr(module, "refusal", None),
        getattr(module, "accept", None),
    )
    for module in (action, decision, wait, timer, task, fork, join, call, service, end, fail)
}
