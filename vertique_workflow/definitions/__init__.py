"""Workflow definitions: the plan model, the code DSL, the catalog and durations.

Write workflows with ``Workflow`` and the step declarations ``action``,
``decision``, ``wait``, ``timer``, ``task``, ``fork``, ``join``, ``call``,
``service``, ``end`` and ``fail``;
every definition compiles to a validated ``Plan``, which is all the engine reads. See
docs/definitions.md.
"""

from __future__ import annotations

from .branches import (
    BranchListError,
    BranchResult,
    CallSpec,
    ChildResult,
    ForkSpec,
    JoinSpec,
    branches_of,
    call_payload,
    join_outcome,
)
from .catalog import Catalog, autodiscover, catalog, register
from .context import StepContext
from .dsl import (
    StepSpec,
    Workflow,
    action,
    call,
    decision,
    end,
    fail,
    fork,
    join,
    service,
    task,
    timer,
    wait,
)
from .durations import parse_duration
from .plan import STEP_KINDS, Plan, Step, StepKind, TimerFire, callable_name
from .retry import Retry, RetryPolicy
from .services import ServiceOutcome, ServiceSpec
from .tasks import TaskDecision, TaskSpec, decision_to, resolve_people
from .validation import validate

__all__ = [
    "STEP_KINDS",
    "BranchListError",
    "BranchResult",
    "CallSpec",
    "Catalog",
    "ChildResult",
    "ForkSpec",
    "JoinSpec",
    "Plan",
    "Retry",
    "RetryPolicy",
    "ServiceOutcome",
    "ServiceSpec",
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
    "branches_of",
    "call",
    "call_payload",
    "callable_name",
    "catalog",
    "decision",
    "decision_to",
    "end",
    "fail",
    "fork",
    "join",
    "join_outcome",
    "parse_duration",
    "register",
    "resolve_people",
    "service",
    "task",
    "timer",
    "validate",
    "wait",
]
