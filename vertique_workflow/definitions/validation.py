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
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from ..exceptions import WorkflowDefinitionError
from .branches import (
    BRANCH_ID_RULE,
    DEFAULT_MAX_BRANCHES,
    MAX_BRANCHES_LIMIT,
    CallSpec,
    ForkSpec,
    JoinSpec,
    is_branch_id,
)
from .plan import STEP_KINDS, Step
from .services import MAX_SERVICE_ATTEMPTS, ServiceSpec
from .tasks import MAX_PERSON_NAME_LENGTH, TaskDecision, TaskSpec, state_arity

if TYPE_CHECKING:
    from .plan import Plan

from .retry import RetryPolicy

__all__ = ["MAX_NAME_LENGTH", "MAX_REASON_LENGTH", "Transition", "transitions", "validate"]

MAX_NAME_LENGTH = 255  # ids and names are stored in VARCHAR(255) columns
MAX_REASON_LENGTH = 128  # a fail reason is stored as error_type VARCHAR(128)

# Which optional Step fields each kind may set; the rest must stay empty.
_ALLOWED_FIELDS: dict[str, frozenset[str]] = {
    "action": frozenset({"next", "callback", "retry", "compensate"}),
    "decision": frozenset({"callback", "targets", "retry"}),
    "wait": frozenset({"next", "signals", "on_signal", "apply", "retry", "timeout", "on_timeout"}),
    "timer": frozenset({"next", "delay", "until", "retry"}),
    "task": frozenset({"task", "retry"}),
    "fork": frozenset({"fork", "retry"}),
    "join": frozenset({"next", "join", "retry"}),
    "call": frozenset({"call", "retry"}),
    "service": frozenset({"next", "service", "retry", "compensate"}),
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
    "fork",
    "join",
    "call",
    "service",
    "compensate",
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
    _check_compensations(plan)
    _check_fork_joins(plan)
    _check_reachable(plan)
    _check_branch_paths(plan)
    _check_cycles(plan)


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


class Transition(NamedTuple):
    """One edge leaving a step: the one enumeration of "where a step can go".

    ``field`` names the edge as validation messages do (``next``,
    ``on_signal['paid']``, ``decision 'approve'``, ``branch 'a'``, ...);
    ``kind`` is its sort -- ``next``, ``target`` (a decision's), ``signal``,
    ``timeout``, ``decision`` (a task's), ``due``, ``branch`` (a fixed
    fork's first step), ``each`` (a fan-out's first step), ``join`` (a fork
    to its join), ``on_failed``, ``on_completed`` -- and ``key`` the signal,
    decision or branch name it belongs to (None otherwise). Validation and
    the diagram both read it, so a new kind of edge cannot be checked but
    not drawn (or the other way round).
    """

    field: str
    target: Any
    kind: str
    key: str | None = None


def transitions(step: Step) -> list[Transition]:
    """Every edge leaving ``step``, in declaration order (targets unchecked)."""
    found: list[Transition] = []
    if step.next is not None:
        found.append(Transition("next", step.next, "next"))
    for target in step.targets:
        found.append(Transition("targets", target, "target"))
    for signal, target in step.on_signal.items():
        found.append(Transition(f"on_signal[{signal!r}]", target, "signal", signal))
    if step.on_timeout is not None:
        found.append(Transition("on_timeout", step.on_timeout, "timeout"))
    task = step.task
    if isinstance(task, TaskSpec):
        for name, decision in task.decisions.items():
            if isinstance(decision, TaskDecision):
                found.append(Transition(f"decision {name!r}", decision.next, "decision", name))
        if task.on_due is not None:
            found.append(Transition("on_due", task.on_due, "due"))
    fork = step.fork
    if isinstance(fork, ForkSpec):
        if fork.fan_out:
            if fork.start is not None:
                found.append(Transition("start", fork.start, "each"))
        else:
            for branch, first in fork.branches.items():
                found.append(Transition(f"branch {branch!r}", first, "branch", branch))
        found.append(Transition("join", fork.join, "join"))
    join = step.join
    if isinstance(join, JoinSpec) and join.on_failed is not None:
        found.append(Transition("on_failed", join.on_failed, "on_failed"))
    call = step.call
    if isinstance(call, CallSpec):
        if call.on_completed is not None:
            found.append(Transition("on_completed", call.on_completed, "on_completed"))
        if call.on_failed is not None:
            found.append(Transition("on_failed", call.on_failed, "on_failed"))
    service = step.service
    if isinstance(service, ServiceSpec) and service.on_failed is not None:
        found.append(Transition("on_failed", service.on_failed, "on_failed"))
    return found


def _transitions(step: Step) -> Iterator[tuple[str, Any]]:
    """Every (field, step id) edge leaving ``step``."""
    for transition in transitions(step):
        yield transition.field, transition.target


def _check_action(plan: Plan, step: Step) -> None:
    if step.callback is None:
        _fail(plan, step.id, "an action needs a callback")
    if step.next is None and step.id not in plan.compensation_steps:
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


def _check_fork(plan: Plan, step: Step) -> None:
    spec = step.fork
    if not isinstance(spec, ForkSpec):
        _fail(plan, step.id, "a fork step needs a fork built with fork(...) or ForkSpec(...)")
    if plan.steps[spec.join].kind != "join":
        _fail(plan, step.id, f"join names step {spec.join!r}, which is not a join step")
    if bool(spec.branches) == (spec.each is not None):
        _fail(plan, step.id, "a fork needs exactly one of branches (fixed) or each (a fan-out)")
    if not spec.fan_out:
        for what, value in (("start", spec.start), ("key", spec.key)):
            if value is not None:
                _fail(plan, step.id, f"{what} goes with each: fixed branches take no {what}")
        if spec.max_branches != DEFAULT_MAX_BRANCHES:
            _fail(plan, step.id, "max_branches goes with each: fixed branches take none")
        for branch in spec.branches:
            if not is_branch_id(branch):
                _fail(plan, step.id, f"branch id {str(branch)[:64]!r} must be {BRANCH_ID_RULE}")
        return
    if spec.start is None:
        _fail(plan, step.id, "a fan-out needs start: the first step of every branch")
    if isinstance(spec.each, str):
        if not _is_name(spec.each):
            _fail(plan, step.id, f"each must name a state field, {_NAME_RULE}, or be a callable")
        state_type = plan.state_type
        if state_type is not None and spec.each not in {
            f.name for f in dataclasses.fields(state_type)
        }:
            _fail(
                plan,
                step.id,
                f"each names field {spec.each!r} the state type {plan.state_type_name} "
                "does not declare",
            )
    else:
        _check_state_callable(plan, step, spec.each, "each")
        if not spec.each_name:
            _fail(plan, step.id, "each needs a name")
    if spec.key is not None:
        if not callable(spec.key):
            _fail(plan, step.id, "key is not callable")
        if not spec.key_name:
            _fail(plan, step.id, "key needs a name")
    limit = spec.max_branches
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_BRANCHES_LIMIT
    ):
        _fail(plan, step.id, f"max_branches must be an integer from 1 to {MAX_BRANCHES_LIMIT}")


def _check_join(plan: Plan, step: Step) -> None:
    spec = step.join
    if not isinstance(spec, JoinSpec):
        _fail(plan, step.id, "a join step needs a join built with join(...) or JoinSpec(...)")
    if step.next is None:
        _fail(plan, step.id, "a join needs next: where the instance goes once the join decides")
    policy = spec.policy
    if isinstance(policy, bool) or not (
        policy in ("all", "any") or (isinstance(policy, int) and policy >= 1)
    ):
        _fail(plan, step.id, "policy must be 'all', 'any' or a number of branches (at least 1)")
    if spec.merge is not None:
        if not callable(spec.merge):
            _fail(plan, step.id, "merge is not callable")
        if not spec.merge_name:
            _fail(plan, step.id, "merge needs a name")


def _check_call(plan: Plan, step: Step) -> None:
    spec = step.call
    if not isinstance(spec, CallSpec):
        _fail(plan, step.id, "a call step needs a call built with call(...) or CallSpec(...)")
    if not _is_name(spec.workflow):
        _fail(plan, step.id, f"workflow must be a definition id, {_NAME_RULE}")
    version = spec.version
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        _fail(plan, step.id, "version must be None (the latest) or a positive integer")
    if spec.on_completed is None:
        _fail(
            plan,
            step.id,
            "a call needs on_completed: where the parent goes when the child completes",
        )
    if spec.payload is not None:
        _check_state_callable(plan, step, spec.payload, "payload")
        if not spec.payload_name:
            _fail(plan, step.id, "payload needs a name")
    if spec.result is not None:
        if not callable(spec.result):
            _fail(plan, step.id, "result is not callable")
        if not spec.result_name:
            _fail(plan, step.id, "result needs a name")


def _check_service(plan: Plan, step: Step) -> None:
    spec = step.service
    if not isinstance(spec, ServiceSpec):
        _fail(plan, step.id, "a service step needs a service built with service(...)")
    if not _is_name(spec.handler):
        _fail(plan, step.id, f"handler must be a registered handler name, {_NAME_RULE}")
    if step.next is None and step.id not in plan.compensation_steps:
        _fail(plan, step.id, "a service step needs next: where it goes when the call succeeded")
    attempts = spec.attempts
    if (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_SERVICE_ATTEMPTS
    ):
        _fail(plan, step.id, f"attempts must be an integer from 1 to {MAX_SERVICE_ATTEMPTS}")
    if spec.timeout.total_seconds() <= 0:  # type: ignore[union-attr]
        _fail(plan, step.id, "timeout must be positive: a handler call needs a bound")
    if spec.backoff > spec.max_backoff:  # type: ignore[operator]
        _fail(plan, step.id, "backoff must not exceed max_backoff")
    for cls in spec.retry_on:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            _fail(plan, step.id, "retry_on takes exception classes (subclasses of Exception)")
    if spec.request is not None:
        _check_state_callable(plan, step, spec.request, "request")
        if not spec.request_name:
            _fail(plan, step.id, "request needs a name")
    if spec.result is not None:
        if not callable(spec.result):
            _fail(plan, step.id, "result is not callable")
        if not spec.result_name:
            _fail(plan, step.id, "result needs a name")
    if spec.result_schema is not None:
        _check_result_schema(plan, step, spec.result_schema)


def _check_result_schema(plan: Plan, step: Step, schema: Any) -> None:
    import jsonschema

    if not isinstance(schema, Mapping):
        _fail(plan, step.id, "result_schema must be a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        _fail(plan, step.id, f"result_schema is not a valid JSON Schema: {exc.message[:200]}")


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
    "fork": _check_fork,
    "join": _check_join,
    "call": _check_call,
    "service": _check_service,
    "end": _check_end,
    "fail": _check_fail,
}


def _check_callback_name(plan: Plan, step: Step) -> None:
    if not callable(step.callback):
        _fail(plan, step.id, "the callback is not callable")
    if not step.callback_name:
        _fail(plan, step.id, "the callback needs a name")


def _check_compensations(plan: Plan) -> None:
    """``compensate`` names an action or service step run only as a compensation.

    A compensation step is reached by no transition and is not the start:
    the engine knows a token standing there is compensating by the step
    alone (a retry resumes the compensation there). It goes nowhere (no
    ``next``, no ``on_failed``: a compensation that fails for good fails the
    instance ``COMPENSATION_FAILED``) and compensates nothing itself.
    """
    targeted = {target for step in plan.steps.values() for _, target in _transitions(step)}
    for step in plan.steps.values():
        name = step.compensate
        if name is None:
            continue
        if not _is_name(name) or name not in plan.steps:
            _fail(plan, step.id, f"compensate names unknown step {name!r}")
        undo = plan.steps[name]
        if undo.kind not in ("action", "service"):
            _fail(
                plan,
                step.id,
                f"compensate names {undo.kind} step {name!r}: "
                "a compensation is an action or a service step",
            )
        if name == step.id:
            _fail(plan, step.id, "a step cannot compensate itself")
    for step_id in plan.compensation_steps:
        undo = plan.steps[step_id]
        if undo.compensate is not None:
            _fail(plan, step_id, "a compensation step compensates nothing itself (no compensate)")
        if step_id == plan.start or step_id in targeted:
            _fail(
                plan,
                step_id,
                "is a compensation step: it runs only as a compensation, "
                "so no step may go to it and it cannot be the start",
            )
        if undo.next is not None:
            _fail(plan, step_id, "a compensation step takes no next: it is never followed")
        if undo.service is not None and undo.service.on_failed is not None:
            _fail(
                plan,
                step_id,
                "a compensation step takes no on_failed: a failed compensation fails the "
                "instance COMPENSATION_FAILED",
            )


def _check_reachable(plan: Plan) -> None:
    seen = {plan.start}
    queue = deque([plan.start])
    while queue:
        for _, target in _transitions(plan.steps[queue.popleft()]):
            if target not in seen:
                seen.add(target)
                queue.append(target)
    # a compensation step is reached as the compensation of a reachable step
    seen |= {plan.steps[s].compensate for s in list(seen) if plan.steps[s].compensate}  # type: ignore[misc]
    for step_id in plan.steps:
        if step_id not in seen:
            _fail(plan, step_id, f"is unreachable from the start step {plan.start!r}")


def _check_fork_joins(plan: Plan) -> None:
    """Each join belongs to exactly one fork; ``n`` of a fixed fork's join fits its branches."""
    owners: dict[str, list[Step]] = {}
    for step in plan.steps.values():
        if step.kind == "fork" and isinstance(step.fork, ForkSpec):
            owners.setdefault(step.fork.join, []).append(step)
    for step in plan.steps.values():
        if step.kind != "join":
            continue
        forks = owners.get(step.id, [])
        if not forks:
            _fail(
                plan, step.id, "no fork names this join: every join ends the branches of one fork"
            )
        if len(forks) > 1:
            names = ", ".join(repr(fork.id) for fork in sorted(forks, key=lambda f: f.id))
            _fail(plan, step.id, f"is named by more than one fork ({names}): a join ends one fork")
        fork = forks[0]
        assert isinstance(fork.fork, ForkSpec) and isinstance(step.join, JoinSpec)
        policy = step.join.policy
        if isinstance(policy, int) and not fork.fork.fan_out and policy > len(fork.fork.branches):
            _fail(
                plan,
                step.id,
                f"policy {policy} needs more branches than fork {fork.id!r} starts "
                f"({len(fork.fork.branches)})",
            )


def _successors(plan: Plan, step: Step) -> list[tuple[str, str]]:
    """Where a token at ``step`` goes next; a fork's token goes on at the fork's join."""
    if step.kind == "fork" and isinstance(step.fork, ForkSpec):
        return [("join", step.fork.join)]
    return list(_transitions(step))


def _walk(plan: Plan, first: str, fork: Step | None, what: str) -> dict[str, list[str]]:
    """Follow one token from ``first``: the steps it can stand at, with their successors.

    ``fork`` None walks the instance's own token (from the start step);
    otherwise a branch of ``fork``, which stops at the fork's join (arrived)
    and at ``fail`` steps. A nested fork is passed over to its join (its
    branches are walked on their own). A token may enter a join only from
    that join's fork, or, in a branch, arrive at its own join.
    """
    own_join = None if fork is None else fork.fork.join  # type: ignore[union-attr]
    if fork is not None and plan.steps[first].kind == "join":
        if first == own_join:
            _fail(plan, fork.id, f"{what} starts at its join: a branch needs a step of its own")
        _fail(plan, fork.id, f"{what} starts at join {first!r}, which ends another fork")
    edges: dict[str, list[str]] = {}
    queue = deque([first])
    while queue:
        step_id = queue.popleft()
        if step_id in edges or step_id == own_join:
            continue
        step = plan.steps[step_id]
        if fork is not None:
            if step_id == fork.id:
                _fail(plan, fork.id, f"{what} can reach the fork itself; a branch ends at its join")
            if step.kind == "end":
                _fail(
                    plan,
                    fork.id,
                    f"{what} can reach end step {step_id!r}; a branch ends at its join",
                )
            if step.kind == "fail":
                edges[step_id] = []
                continue
        successors = _successors(plan, step)
        for _, target in successors:
            if target == own_join or plan.steps[target].kind != "join" or step.kind == "fork":
                continue
            owner = plan.fork_of_join.get(target)
            if fork is None:
                _fail(
                    plan,
                    step_id,
                    f"goes to join {target!r} outside the branches of its fork {owner!r}",
                )
            _fail(
                plan,
                fork.id,
                f"{what} can reach join {target!r} of fork {owner!r} from step {step_id!r}; "
                f"a branch ends at its own join {own_join!r}",
            )
        edges[step_id] = [target for _, target in successors]
        queue.extend(edges[step_id])
    return edges


def _check_branch_paths(plan: Plan) -> None:
    """Every branch of every fork ends at that fork's join or at a fail step.

    The instance's own token may reach a join only through its fork. In a
    branch, no path may lead to an ``end`` step, back to the fork, or to
    another fork's join (a nested fork's join is passed through its fork),
    and from every step the branch can stand at, the join or a ``fail``
    step must remain reachable.
    """
    _walk(plan, plan.start, None, "the instance")
    for fork in plan.steps.values():
        if fork.kind != "fork" or not isinstance(fork.fork, ForkSpec):
            continue
        join = fork.fork.join
        for what, first in fork.fork.first_steps():
            label = what if what.startswith("branch") else "a branch"
            edges = _walk(plan, first, fork, f"{label} of fork {fork.id!r}")
            for step_id in edges:
                if plan.steps[step_id].compensate is not None:
                    _fail(
                        plan,
                        step_id,
                        f"declares compensate but {label} of fork {fork.id!r} can run it: "
                        "only steps of the instance's own token are compensated",
                    )
            done = {join} | {sid for sid, targets in edges.items() if not targets}
            grown = True
            while grown:
                grown = False
                for step_id, targets in edges.items():
                    if step_id not in done and any(t in done for t in targets):
                        done.add(step_id)
                        grown = True
            stuck = [step_id for step_id in edges if step_id not in done]
            if stuck:
                _fail(
                    plan,
                    fork.id,
                    f"{label} of fork {fork.id!r} can stand at step {stuck[0]!r}, "
                    f"from which its join {join!r} is never reached",
                )


# Steps a token passes through within one segment; every other kind stops the
# token (wait, timer, task, fork, join, call) or ends it (end, fail).
_PASS_THROUGH = frozenset({"action", "decision"})


def _check_cycles(plan: Plan) -> None:
    """No cycle of actions and decisions only: a loop must pass a step that waits.

    A token in such a cycle would run step after step in one segment and
    never stop (the engine fails the segment after ``MAX_STEPS_PER_SEGMENT``
    steps). A loop through a wait, a timer, a task, a fork or a call is
    fine: each of those ends the segment. Checked by depth-first search in
    declaration order, so the same plan always reports the same cycle.
    """
    edges = {
        step.id: [target for _, target in _transitions(step) if target in plan.steps]
        for step in plan.steps.values()
        if step.kind in _PASS_THROUGH
    }
    done: set[str] = set()
    for first in edges:
        if first in done:
            continue
        path: list[str] = [first]
        on_path = {first}
        stack = [iter(edges[first])]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if target in on_path:
                cycle = [*path[path.index(target) :], target]
                shown = " -> ".join(repr(step_id) for step_id in cycle)
                _fail(
                    plan,
                    target,
                    f"steps {shown} form a cycle without a wait: a token entering it would "
                    "never stop; let a wait, timer, task, fork or call break the loop",
                )
            if target in done or target not in edges:
                continue
            path.append(target)
            on_path.add(target)
            stack.append(iter(edges[target]))
