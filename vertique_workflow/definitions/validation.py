"""The rules every plan obeys, checked once when the plan is built.

A definition error found here fails at import/startup with a message naming
the workflow, the step and the rule, instead of stranding instances at run
time. Rules are checked in a fixed order and the first one broken is raised.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from ..exceptions import WorkflowDefinitionError
from .plan import STEP_KINDS, Step
from .tasks import MAX_PERSON_NAME_LENGTH, TaskDecision, TaskSpec, state_arity

if TYPE_CHECKING:
    from .plan import Plan

from .retry import RetryPolicy

__all__ = ["MAX_NAME_LENGTH", "MAX_REASON_LENGTH", "validate"]

MAX_NAME_LENGTH = 255  # ids and names are stored in VARCHAR(255) columns
MAX_REASON_LENGTH = 128  # a fail reason is stored as error_type VARCHAR(128)

# Which optional Step fields each kind may set; the rest must stay empty.
_ALLOWED_FIELDS: dict[str, frozenset[str]] = {
    "action": frozenset({"next", "callback", "retry"}),
    "decision": frozenset({"callback", "targets", "retry"}),
    "wait": frozenset({"next", "signals", "on_signal", "apply", "retry", "timeout", "on_timeout"}),
    "timer": frozenset({"next", "delay", "until", "retry"}),
    "task": frozenset({"task", "retry"}),
    "end": frozenset(),
    "fail": frozenset({"reason"}),
}
_OPTIONAL_FIELDS = (
    "next",
    "callback",
    "targets",
    "signals",
    "on_signal",
    "apply",
    "reason",
    "retry",
    "delay",
    "until",
    "timeout",
    "on_timeout",
    "task",
)


def _fail(plan: Plan, step_id: Any, rule: str) -> NoReturn:
    where = f"workflow {plan.id!r}"
    if step_id is not None:
        where += f" step {step_id!r}"
    definition_id = plan.id if isinstance(plan.id, str) else None
    step = step_id if isinstance(step_id, str) else None
    raise WorkflowDefinitionError(f"{where}: {rule}", definition_id=definition_id, step_id=step)


def _is_name(value: Any) -> bool:
    return (
        isinstance(value, str)
        and bool(value)
        and len(value) <= MAX_NAME_LENGTH
        and value == value.strip()
    )


_NAME_RULE = f"a non-empty string of at most {MAX_NAME_LENGTH} characters without outer spaces"


def validate(plan: Plan) -> None:
    """Raise ``WorkflowDefinitionError`` for the first rule ``plan`` breaks."""
    _check_header(plan)
    _check_schemas(plan)
    if not isinstance(plan.steps, Mapping) or not plan.steps:
        _fail(plan, None, "a workflow needs at least one step")
    for key, step in plan.steps.items():
        if not isinstance(step, Step):
            _fail(plan, key, f"is a {type(step).__name__}, not a Step")
        if key != step.id:
            _fail(plan, key, f"is keyed under a different id than its own ({step.id!r})")
        if not _is_name(step.id):
            _fail(plan, step.id, f"a step id must be {_NAME_RULE}")
    for step in plan.steps.values():
        _check_step(plan, step)
    if plan.start not in plan.steps:
        _fail(plan, plan.start, "the start step does not exist")
    _check_reachable(plan)


def _check_header(plan: Plan) -> None:
    if not _is_name(plan.id):
        _fail(plan, None, f"id must be {_NAME_RULE}")
    if isinstance(plan.version, bool) or not isinstance(plan.version, int) or plan.version < 1:
        _fail(plan, None, "version must be a positive integer")
    if not _is_name(plan.contract):
        _fail(plan, None, f"contract must be {_NAME_RULE}")
    if not _is_name(plan.start):
        _fail(plan, None, f"start must be a step id, {_NAME_RULE}")
    state_type = plan.state_type
    if state_type is None:
        if plan.state_type_name != "dict":
            _fail(plan, None, "a dict state must be named 'dict'")
    elif not (isinstance(state_type, type) and dataclasses.is_dataclass(state_type)):
        _fail(plan, None, "the state type must be dict or a dataclass")
    if not _is_name(plan.state_type_name):
        _fail(plan, None, f"the state type name must be {_NAME_RULE}")


def _check_schema(plan: Plan, schema: Any, what: str, step_id: str | None = None) -> None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if schema is None:
        return
    if not isinstance(schema, dict):
        _fail(plan, step_id, f"{what} must be a JSON Schema object or None")
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError):
        _fail(plan, step_id, f"{what} is not JSON")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(part) for part in exc.path) or "(root)"
        _fail(
            plan, step_id, f"{what} is not a valid JSON Schema: {exc.validator!r} fails at {path}"
        )


def _check_schemas(plan: Plan) -> None:
    if not isinstance(plan.signals, Mapping):
        _fail(plan, None, "signals must map signal names to payload schemas")
    for name, schema in plan.signals.items():
        if not _is_name(name):
            _fail(plan, None, f"signal name {name!r} must be {_NAME_RULE}")
        _check_schema(plan, schema, f"payload schema of signal {name!r}")
    _check_schema(plan, plan.start_schema, "start_schema")


def _check_step(plan: Plan, step: Step) -> None:
    if step.kind not in STEP_KINDS:
        _fail(plan, step.id, f"unknown step kind {step.kind!r} (known: {sorted(STEP_KINDS)})")
    allowed = _ALLOWED_FIELDS[step.kind]
    if step.retry is not None and not isinstance(step.retry, RetryPolicy):
        _fail(plan, step.id, "retry must be a policy built with Retry(...)")
    for name in _OPTIONAL_FIELDS:
        if name not in allowed and getattr(step, name):
            _fail(plan, step.id, f"{step.kind} steps take no {name}")
    for name, target in _transitions(step):
        if not _is_name(target) or target not in plan.steps:
            _fail(plan, step.id, f"{name} names unknown step {target!r}")
    _KIND_CHECKS[step.kind](plan, step)


def _transitions(step: Step) -> Iterator[tuple[str, Any]]:
    """Every (field, step id) edge leaving ``step``."""
    if step.next is not None:
        yield "next", step.next
    for target in step.targets:
        yield "targets", target
    for signal, target in step.on_signal.items():
        yield f"on_signal[{signal!r}]", target
    if step.on_timeout is not None:
        yield "on_timeout", step.on_timeout
    task = step.task
    if isinstance(task, TaskSpec):
        for name, decision in task.decisions.items():
            if isinstance(decision, TaskDecision):
                yield f"decision {name!r}", decision.next
        if task.on_due is not None:
            yield "on_due", task.on_due


def _check_action(plan: Plan, step: Step) -> None:
    if step.callback is None:
        _fail(plan, step.id, "an action needs a callback")
    if step.next is None:
        _fail(plan, step.id, "an action needs next: actions must say where they go")
    _check_callback_name(plan, step)


def _check_decision(plan: Plan, step: Step) -> None:
    if step.callback is None:
        _fail(plan, step.id, "a decision needs a callback")
    if not step.targets:
        _fail(plan, step.id, "a decision must declare the step ids it may return (targets)")
    if len(set(step.targets)) != len(step.targets):
        _fail(plan, step.id, "a decision declares a target twice")
    _check_callback_name(plan, step)


def _check_wait(plan: Plan, step: Step) -> None:
    if not step.signals:
        _fail(plan, step.id, "a wait needs at least one signal")
    if len(set(step.signals)) != len(step.signals):
        _fail(plan, step.id, "a wait names a signal twice")
    for signal in step.signals:
        if signal not in plan.signals:
            _fail(plan, step.id, f"waits for signal {signal!r} the workflow does not declare")
        if step.next is None and signal not in step.on_signal:
            _fail(plan, step.id, f"has no next step for signal {signal!r} (give next or on)")
    for signal in step.on_signal:
        if signal not in step.signals:
            _fail(plan, step.id, f"on_signal names signal {signal!r} the step does not wait for")
    if step.apply is not None and not callable(step.apply):
        _fail(plan, step.id, "apply is not callable")
    if (step.timeout is None) != (step.on_timeout is None):
        _fail(plan, step.id, "timeout and on_timeout go together: give both or neither")
    _check_seconds(plan, step, step.timeout, "timeout")


def _check_seconds(plan: Plan, step: Step, value: Any, what: str) -> None:
    """Durations are stored and hashed as whole seconds: refuse what that would round."""
    if value is None:
        return
    if not isinstance(value, datetime.timedelta) or value <= datetime.timedelta(0):
        _fail(plan, step.id, f"{what} must be a positive duration")
    if value % datetime.timedelta(seconds=1):
        _fail(plan, step.id, f"{what} must be a whole number of seconds")


def _check_state_callable(plan: Plan, step: Step, func: Any, what: str) -> None:
    if not callable(func):
        _fail(plan, step.id, f"{what} is not callable")
    try:
        state_arity(func)
    except TypeError:
        _fail(plan, step.id, f"{what} must take (state) or (state, ctx)")


def _check_timer(plan: Plan, step: Step) -> None:
    if (step.delay is None) == (step.until is None):
        _fail(plan, step.id, "a timer needs exactly one of a duration or until")
    if step.next is None:
        _fail(plan, step.id, "a timer needs next: timers must say where they go")
    _check_seconds(plan, step, step.delay, "the timer's duration")
    if step.until is not None:
        _check_state_callable(plan, step, step.until, "until")
        if not step.until_name:
            _fail(plan, step.id, "until needs a name")


def _is_person(value: Any) -> bool:
    return _is_name(value) and len(value) <= MAX_PERSON_NAME_LENGTH


def _check_people(plan: Plan, step: Step, task: TaskSpec) -> None:
    if task.assignee is None and not task.candidate_users and not task.candidate_groups:
        _fail(
            plan,
            step.id,
            "a task needs an assignee, candidate_users or candidate_groups",
        )
    if task.assignee is not None:
        if callable(task.assignee):
            _check_state_callable(plan, step, task.assignee, "assignee")
        elif not _is_person(task.assignee):
            _fail(plan, step.id, f"assignee must be a user name, {_NAME_RULE}, or a callable")
    for what in ("candidate_users", "candidate_groups"):
        value = getattr(task, what)
        if callable(value):
            _check_state_callable(plan, step, value, what)
        elif value is not None:
            if not all(_is_person(name) for name in value):
                _fail(plan, step.id, f"each of {what} must be a name, {_NAME_RULE}")
            if len(set(value)) != len(value):
                _fail(plan, step.id, f"{what} names someone twice")


def _check_task(plan: Plan, step: Step) -> None:
    task = step.task
    if not isinstance(task, TaskSpec):
        _fail(plan, step.id, "a task step needs a task built with task(...) or TaskSpec(...)")
    if not _is_name(task.title):
        _fail(plan, step.id, f"the task title must be {_NAME_RULE}")
    _check_people(plan, step, task)
    if not task.decisions:
        _fail(plan, step.id, "a task needs at least one decision")
    for name, decision in task.decisions.items():
        if not _is_name(name):
            _fail(plan, step.id, f"decision name {str(name)[:64]!r} must be {_NAME_RULE}")
        if not isinstance(decision, TaskDecision):
            _fail(plan, step.id, f"decision {name!r} must be a step id or a TaskDecision(...)")
        _check_schema(plan, decision.schema, f"payload schema of decision {name!r}", step.id)
    if (task.due is None) != (task.on_due is None):
        _fail(plan, step.id, "due and on_due go together: give both or neither")
    _check_seconds(plan, step, task.due, "due")
    for index, reminder in enumerate(task.reminders):
        _check_seconds(plan, step, reminder, f"reminder {index + 1}")
        if task.due is not None and reminder >= task.due:
            _fail(
                plan,
                step.id,
                f"reminder {index + 1} must come before the due date: a reminder at or "
                "after due would fire on a task the due date has already moved on",
            )
    if len(set(task.reminders)) != len(task.reminders):
        _fail(plan, step.id, "a task declares the same reminder twice")
    if not isinstance(task.require_version_stability, bool):
        _fail(plan, step.id, "require_version_stability must be True or False")
    if task.subject_version is not None:
        _check_state_callable(plan, step, task.subject_version, "subject_version")
    elif task.require_version_stability:
        _fail(
            plan,
            step.id,
            "require_version_stability needs subject_version: a callable of the state "
            "returning the version of the subject under review",
        )


def _check_end(plan: Plan, step: Step) -> None:
    return None


def _check_fail(plan: Plan, step: Step) -> None:
    reason = step.reason
    if not (isinstance(reason, str) and reason.strip() and len(reason) <= MAX_REASON_LENGTH):
        _fail(
            plan,
            step.id,
            f"a fail step needs a reason code of at most {MAX_REASON_LENGTH} characters",
        )


_KIND_CHECKS = {
    "action": _check_action,
    "decision": _check_decision,
    "wait": _check_wait,
    "timer": _check_timer,
    "task": _check_task,
    "end": _check_end,
    "fail": _check_fail,
}


def _check_callback_name(plan: Plan, step: Step) -> None:
    if not callable(step.callback):
        _fail(plan, step.id, "the callback is not callable")
    if not step.callback_name:
        _fail(plan, step.id, "the callback needs a name")


def _check_reachable(plan: Plan) -> None:
    seen = {plan.start}
    queue = deque([plan.start])
    while queue:
        for _, target in _transitions(plan.steps[queue.popleft()]):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    for step_id in plan.steps:
        if step_id not in seen:
            _fail(plan, step_id, f"is unreachable from the start step {plan.start!r}")
