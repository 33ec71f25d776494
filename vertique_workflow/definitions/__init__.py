"""Workflow definitions: the plan model, the code DSL, the catalog and durations.

Write workflows with ``Workflow`` and the step declarations ``action``,
``decision``, ``wait``, ``end`` and ``fail``; every definition compiles to a
validated ``Plan``, which is all the engine reads. See docs/definitions.md.
"""

from __future__ import annotations

from .catalog import Catalog, autodiscover, catalog, register
from .context import StepContext
from .dsl import StepSpec, Workflow, action, decision, end, fail, wait
from .durations import parse_duration
from .plan import STEP_KINDS, Plan, Step, StepKind, callable_name
from .retry import Retry, RetryPolicy
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
    "Workflow",
    "action",
    "autodiscover",
    "callable_name",
    "catalog",
    "decision",
    "end",
    "fail",
    "parse_duration",
    "register",
    "validate",
    "wait",
]
