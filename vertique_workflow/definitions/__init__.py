"""Workflow definitions: the plan model, the code DSL, the catalog and durations.

Write workflows with ``Workflow`` and the step declarations ``action``,
``decision``, ``wait``, ``timer``, ``task``, ``end`` and ``fail``; every definition compiles to a
validated ``Plan``, which is all the engine reads. See docs/definitions.md.
"""

from __future__ import annotations

from .catalog import Catalog, autodiscover, catalog, register
from .context import StepContext
from .dsl import StepSpec, Workflow, action, decision, end, fail, task, timer, wait
from .durations import parse_duration
from .plan import STEP_KINDS, Plan, Step, StepKind, TimerFire, callable_name
from .retry import Retry, RetryPolicy
from .tasks import TaskDecision, TaskSpec, decision_to, resolve_people
from .validation import validate

__all__ = [
    "STEP_KINDS",
    "Catalog",
    "Plan",
    "Retry",
    "RetryPolicy",
    "Step",
    "StepContext",
    "StepKind",
    "StepSpec",
    "TaskDecision",
    "TaskSpec",
    "TimerFire",
    "Workflow",
    "action",
    "autodiscover",
    "callable_name",
    "catalog",
    "decision",
    "decision_to",
    "end",
    "fail",
    "parse_duration",
    "register",
    "resolve_people",
    "task",
    "timer",
    "validate",
    "wait",
]
