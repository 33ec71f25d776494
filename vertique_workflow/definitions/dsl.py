"""The code DSL: a workflow class whose steps read top to bottom like the diagram.

Each step is a named attribute (``done = end()``) or a decorated method
(``@action(next="route")``); transitions name steps by attribute name. The
class compiles to a ``Plan`` -- the same data a document compiles to -- on
the first call of ``plan()``, so an abstract base class is never built.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast, get_args, get_origin, overload

from ..exceptions import WorkflowDefinitionError
from .branches import DEFAULT_MAX_BRANCHES, CallSpec, ForkSpec, JoinPolicy, JoinSpec
from .plan import Plan, Step
from .retry import Retry, RetryPolicy
from .services import (
    DEFAULT_SERVICE_ATTEMPTS,
    DEFAULT_SERVICE_BACKOFF,
    DEFAULT_SERVICE_MAX_BACKOFF,
    DEFAULT_SERVICE_TIMEOUT,
    ServiceSpec,
)
from .tasks import TaskDecision, TaskSpec, decision_to

__all__ = [
    "Retry",
    "StepSpec",
    "TaskDecision",
    "Workflow",
    "action",
    "call",
    "decision",
    "decision_to",
    "end",
    "fail",
    "fork",
    "join",
    "service",
    "task",
    "timer",
    "wait",
]

Duration = str | datetime.timedelta

S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])

# Serialises plan builds so every caller of ``plan()`` gets the same object.
_BUILD_LOCK = threading.RLock()

# Class attributes with a meaning of their own: a step may not take these names.
_RESERVED = frozenset({"id", "version", "contract", "signals", "start_schema", "plan"})


@dataclass(frozen=True, eq=False)
class StepSpec:
    """A step as declared in a class body, before the class is compiled.

    As a decorated method it still behaves as the method on instances, so
    a step can be unit-tested by calling it directly.
    """

    kind: str
    start: bool = False
    next: str | None = None
    targets: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    on: Mapping[str, str] | None = None
    apply: Callable[..., Any] | str | None = None
    reason: str | None = None
    func: Callable[..., Any] | None = None
    retry: RetryPolicy | None = None
    delay: Duration | None = None
    until: Callable[..., Any] | str | None = None
    timeout: Duration | None = None
    on_timeout: str | None = None
    task: Mapping[str, Any] | None = None
    fork: Mapping[str, Any] | None = None
    join: Mapping[str, Any] | None = None
    call: Mapping[str, Any] | None = None
    service: Mapping[str, Any] | None = None
    compensate: str | None = None

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None or self.func is None:
            return self
        return self.func.__get__(instance, owner)


@dataclass(frozen=True)
class _StepDecorator:
    """What ``action(...)``/``decision(...)`` return before they decorate a method."""

    kind: str
    start: bool
    next: str | None = None
    targets: tuple[str, ...] = ()
    retry: RetryPolicy | None = None
    compensate: str | None = None

    def __call__(self, func: F) -> F:
        if not inspect.isfunction(func):
            raise WorkflowDefinitionError(
                f"@{self.kind} decorates a plain method, not {type(func).__name__}"
            )
        spec = StepSpec(
            self.kind,
            start=self.start,
            next=self.next,
            targets=self.targets,
            func=func,
            retry=self.retry,
            compensate=self.compensate,
        )
        return cast(F, spec)


@overload
def action(func: F, /) -> F: ...
@overload
def action(
    *,
    start: bool = False,
    next: str | None = None,
    retry: RetryPolicy | None = None,
    compensate: str | None = None,
) -> Callable[[F], F]: ...
def action(
    func: Callable[..., Any] | None = None,
    /,
    *,
    start: bool = False,
    next: str | None = None,
    retry: RetryPolicy | None = None,
    compensate: str | None = None,
) -> Any:
    """Declare a method ``(self, state, ctx) -> state`` as an action step going to ``next``.

    ``retry`` (``Retry(max_attempts=..., backoff=..., max_backoff=..., never=...)``)
    sets how this step is retried when it raises; see ``definitions/retry.py``.
    ``compensate`` names the step that undoes this one when a ``fail`` step is
    reached later (docs/side-effects.md, "Compensation"); a compensation
    step itself declares no ``next``.
    """
    decorator = _StepDecorator("action", start=start, next=next, retry=retry, compensate=compensate)
    return decorator(func) if func is not None else decorator


@overload
def decision(func: F, /) -> F: ...
@overload
def decision(
    *,
    targets: list[str] | tuple[str, ...],
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> Callable[[F], F]: ...
def decision(
    func: Callable[..., Any] | None = None,
    /,
    *,
    targets: list[str] | tuple[str, ...] = (),
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> Any:
    """Declare a method ``(self, state[, ctx]) -> step id`` choosing one of ``targets``.

    The targets are declared so the plan (and its diagram) knows every edge
    without running code; the engine refuses a returned id not among them.
    """
    names = (targets,) if isinstance(targets, str) else tuple(targets)
    decorator = _StepDecorator("decision", start=start, targets=names, retry=retry)
    return decorator(func) if func is not None else decorator


def wait(
    *signals: str,
    next: str | None = None,
    on: Mapping[str, str] | None = None,
    apply: Callable[..., Any] | str | None = None,
    timeout: Duration | None = None,
    on_timeout: str | None = None,
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """Wait for one of ``signals``; go to ``on[signal]``, else ``next``.

    ``apply`` folds the payload into the state: a callable
    ``(state, signal_name, payload, ctx) -> state``, or the name of a method
    of the class with that signature after ``self``. Without it the payload
    is merged into the state (see ``Plan.apply_signal``). ``retry`` is the
    policy of ``apply`` when it raises. ``timeout`` (``"7d"`` or a
    ``timedelta``) with ``on_timeout``: when no signal has arrived that long
    after the wait began, go to ``on_timeout`` instead.
    """
    return StepSpec(
        "wait",
        start=start,
        next=next,
        signals=signals,
        on=on,
        apply=apply,
        retry=retry,
        timeout=timeout,
        on_timeout=on_timeout,
    )


def timer(
    duration: Duration | None = None,
    /,
    *,
    until: Callable[..., Any] | str | None = None,
    next: str | None = None,
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """Wait a duration (``timer("90s", next=...)``) or until an instant, then go to ``next``.

    ``until`` computes the instant from the state: a callable ``(state)`` or
    ``(state, ctx)``, or the name of a method of the class taking the same
    after ``self``, returning an aware ``datetime`` or an ISO-8601 string
    with an offset. Give exactly one of the two. ``retry`` is the policy of
    ``until`` when it raises.
    """
    return StepSpec("timer", start=start, next=next, delay=duration, until=until, retry=retry)


def task(
    *,
    decisions: Mapping[str, str | TaskDecision],
    title: str | None = None,
    assignee: str | Callable[..., Any] | None = None,
    candidate_users: Iterable[str] | Callable[..., Any] | None = None,
    candidate_groups: Iterable[str] | Callable[..., Any] | None = None,
    due: Duration | None = None,
    on_due: str | None = None,
    reminders: Iterable[Duration] = (),
    require_version_stability: bool = False,
    subject_version: Callable[..., Any] | str | None = None,
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """Open a human task and wait for one of its ``decisions``.

    ``decisions`` maps each decision name to the step it leads to, or to
    ``decision_to(step, schema={...})`` / ``TaskDecision(step, schema=...)``
    when its payload has a JSON Schema. ``assignee`` (a user name),
    ``candidate_users`` and ``candidate_groups`` (Django auth user and group
    names) say who may complete it; each may be a callable of the state
    (``(state)`` or ``(state, ctx)``), or a method of the class given by
    reference (``assignee=manager_of``). At least one of the three.
    ``due`` with ``on_due``: where the workflow goes when the task is still
    open after that long. ``reminders``: delays after which a reminder is
    recorded (the task stays open), each before ``due``.
    ``require_version_stability=True`` with ``subject_version`` (a callable
    or the name of a method, returning the reviewed subject's version)
    rejects a completion made against another version. ``title`` defaults
    to the step's name. ``retry`` is the policy of the callables when they
    raise.
    """
    options: dict[str, Any] = {
        "title": title,
        "assignee": assignee,
        "candidate_users": candidate_users,
        "candidate_groups": candidate_groups,
        "decisions": decisions,
        "due": due,
        "on_due": on_due,
        "reminders": reminders,
        "require_version_stability": require_version_stability,
        "subject_version": subject_version,
    }
    return StepSpec("task", start=start, task=options, retry=retry)


def fork(
    *,
    join: str,
    branches: Mapping[str, str] | None = None,
    each: str | Callable[..., Any] | None = None,
    start: str | None = None,
    key: Callable[..., Any] | None = None,
    max_branches: int = DEFAULT_MAX_BRANCHES,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """Start parallel branches that end at the join step ``join``.

    Fixed branches: ``branches={"payment": "charge", "stock": "reserve"}``
    maps each branch id to its first step. Fan-out: ``each`` (the name of a
    state field holding a list, or a callable ``(state[, ctx])`` -- a
    method of the class by reference -- returning one) starts one branch
    per item at ``start``; ``key`` (a callable ``(item) -> str``) names
    each branch, else its index does; more than ``max_branches`` items fail
    the fork. Every branch runs on its own copy of the state; a step of a
    branch finds the item in ``ctx.branch_item``. Here ``start`` is the
    branches' first step: to begin a workflow with a fork, declare it
    first. ``retry`` is the policy of ``each`` and ``key`` when they raise.
    """
    options: dict[str, Any] = {
        "join": join,
        "branches": branches or {},
        "each": each,
        "start": start,
        "key": key,
        "max_branches": max_branches,
    }
    return StepSpec("fork", fork=options, retry=retry)


def join(
    *,
    next: str | None = None,
    policy: JoinPolicy = "all",
    merge: Callable[..., Any] | str | None = None,
    on_failed: str | None = None,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """End the branches of the fork naming this step, then go to ``next``.

    ``policy``: ``"all"`` waits for every branch to complete, ``"any"`` for
    the first, an int ``n`` for ``n`` of them; the branches the decided join
    no longer needs are superseded. ``merge`` folds the results into the
    state the instance had at the fork: a callable ``(state, results, ctx)
    -> state`` (``results`` maps branch ids to ``BranchResult``), or the
    name of a method of the class taking the same after ``self``; without
    it that state goes on unchanged. When too many branches failed for the
    policy to be met, the instance goes to ``on_failed``, or fails without
    it. ``retry`` is the policy of ``merge`` when it raises.
    """
    options: dict[str, Any] = {"policy": policy, "merge": merge, "on_failed": on_failed}
    return StepSpec("join", next=next, join=options, retry=retry)


def call(
    workflow: str,
    *,
    version: int | None = None,
    payload: Callable[..., Any] | str | None = None,
    on_completed: str | None = None,
    on_failed: str | None = None,
    result: Callable[..., Any] | str | None = None,
    start: bool = False,
    retry: RetryPolicy | None = None,
) -> StepSpec:
    """Start the workflow ``workflow`` as a child and wait for it to end.

    ``version`` pins the child's version (the latest the node has
    otherwise). ``payload`` builds its start payload: a callable
    ``(state[, ctx]) -> dict`` or the name of a method of the class (``{}``
    without it). When the child completes the parent goes to
    ``on_completed``; when it ends any other way, to ``on_failed`` (the
    parent fails without it). ``result`` folds the child's outcome into the
    state: a callable ``(state, child, ctx) -> state`` (``child`` is a
    ``ChildResult``) or the name of a method; without it the state is
    unchanged. ``retry`` is the policy of ``payload`` and ``result``.
    """
    options: dict[str, Any] = {
        "workflow": workflow,
        "version": version,
        "payload": payload,
        "on_completed": on_completed,
        "on_failed": on_failed,
        "result": result,
    }
    return StepSpec("call", start=start, call=options, retry=retry)


def service(
    handler: str,
    *,
    next: str | None = None,
    request: Callable[..., Any] | str | None = None,
    result: Callable[..., Any] | str | None = None,
    on_failed: str | None = None,
    timeout: Duration = DEFAULT_SERVICE_TIMEOUT,
    attempts: int = DEFAULT_SERVICE_ATTEMPTS,
    backoff: Duration = DEFAULT_SERVICE_BACKOFF,
    max_backoff: Duration = DEFAULT_SERVICE_MAX_BACKOFF,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    result_schema: Mapping[str, Any] | None = None,
    start: bool = False,
    retry: RetryPolicy | None = None,
    compensate: str | None = None,
) -> StepSpec:
    """Call the service handler registered as ``handler`` through the outbox, then ``next``.

    The step records the call in the segment's transaction and waits; a
    relay calls the handler outside any workflow transaction, at least
    once, with a dispatch key as idempotency key (``ServiceSpec`` explains
    every option). ``request`` builds the handler's request: a callable
    ``(state[, ctx]) -> dict`` or the name of a method (the state's JSON
    without it). ``result`` folds the ``ServiceOutcome`` into the state: a
    callable ``(state, outcome, ctx) -> state`` or the name of a method.
    A call that failed for good goes to ``on_failed`` (the instance fails
    without it). ``retry`` is the policy of ``request`` and ``result`` when
    they raise in the segment, not of the handler (``attempts``, ``backoff``
    and ``retry_on`` are). ``compensate`` names the step that undoes a
    successful call when a ``fail`` step is reached later.
    """
    options: dict[str, Any] = {
        "handler": handler,
        "request": request,
        "result": result,
        "on_failed": on_failed,
        "timeout": timeout,
        "attempts": attempts,
        "backoff": backoff,
        "max_backoff": max_backoff,
        "retry_on": retry_on,
        "result_schema": result_schema,
    }
    return StepSpec(
        "service", start=start, next=next, service=options, retry=retry, compensate=compensate
    )


def end(*, start: bool = False) -> StepSpec:
    """Complete the instance."""
    return StepSpec("end", start=start)


def fail(*, reason: str = "FAILED") -> StepSpec:
    """Fail the instance, recording ``reason`` as its error type."""
    return StepSpec("fail", reason=reason)


class Workflow(Generic[S]):
    """Base class of code-defined workflows; ``S`` is the state type.

    ``Workflow[SomeDataclass]`` gives a typed state; ``Workflow[dict]`` or a
    bare ``Workflow`` a plain dict. Subclasses declare ``id``, ``version``,
    ``contract``, ``signals`` (name -> payload JSON schema or None) and
    ``start_schema``, then their steps in diagram order.
    """

    id: ClassVar[str]
    version: ClassVar[int]
    contract: ClassVar[str]
    signals: ClassVar[Mapping[str, dict[str, Any] | None]] = {}
    start_schema: ClassVar[dict[str, Any] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _RESERVED:
            if isinstance(vars(cls).get(name), StepSpec | _StepDecorator):
                raise WorkflowDefinitionError(
                    f"workflow class {cls.__qualname__}: {name!r} is reserved, "
                    "it cannot name a step"
                )

    @classmethod
    def plan(cls) -> Plan:
        """The validated plan of this class, built once and cached per class."""
        cached = vars(cls).get("_vw_plan")
        if cached is None:
            with _BUILD_LOCK:
                cached = vars(cls).get("_vw_plan")
                if cached is None:
                    cached = _build(cls)
                    cls._vw_plan = cached  # type: ignore[attr-defined]
        return cast(Plan, cached)


def _class_error(cls: type, rule: str, step_id: str | None = None) -> WorkflowDefinitionError:
    definition_id = getattr(cls, "id", None)
    return WorkflowDefinitionError(
        f"workflow class {cls.__qualname__} ({definition_id!r}): {rule}",
        definition_id=definition_id if isinstance(definition_id, str) else None,
        step_id=step_id,
    )


def _state_type(cls: type[Workflow[Any]]) -> type | None:
    for klass in cls.__mro__:
        for base in vars(klass).get("__orig_bases__", ()):
            origin = get_origin(base)
            if not (isinstance(origin, type) and issubclass(origin, Workflow)):
                continue
            args = get_args(base)
            if not args or isinstance(args[0], TypeVar):
                continue
            arg = args[0]
            if arg is dict or get_origin(arg) is dict:
                return None
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                return arg
            raise _class_error(cls, f"the state type must be dict or a dataclass, not {arg!r}")
    return None


def _collect(cls: type) -> list[tuple[str, StepSpec]]:
    """Step declarations in order: base classes first, each in class-body order."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        names.update(dict.fromkeys(vars(klass)))
    found = []
    for name in names:
        value = next(vars(k)[name] for k in cls.__mro__ if name in vars(k))
        if isinstance(value, _StepDecorator):
            raise _class_error(cls, f"step {name!r}: @{value.kind}(...) must decorate a method")
        if isinstance(value, StepSpec):
            found.append((name, value))
    return found


def _takes_ctx(cls: type, name: str, func: Callable[..., Any]) -> bool:
    """Whether a step method wants ``ctx``: ``(self, state)`` and ``(self, state, ctx)`` work."""
    params = list(inspect.signature(func).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(positional) >= 3 and len(required) <= 3:
        return True
    if len(positional) == 2:
        return False
    raise _class_error(
        cls, f"step {name!r}: the method must take (self, state) or (self, state, ctx)"
    )


def _bind(cls: type, instance: object, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    if _takes_ctx(cls, name, func):

        @functools.wraps(func)
        def callback(state: Any, ctx: Any) -> Any:
            return func(instance, state, ctx)

    else:

        @functools.wraps(func)
        def callback(state: Any, ctx: Any) -> Any:
            return func(instance, state)

    return callback


def _bind_state(
    cls: type, instance: object, name: str, func: Callable[..., Any]
) -> Callable[..., Any]:
    """A method ``(self, state[, ctx])`` as a ``(state, ctx)`` callable.

    Not ``functools.wraps``-ed: its own signature ``(state, ctx)`` is the
    one ``state_arity`` must read.
    """
    if _takes_ctx(cls, name, func):

        def call(state: Any, ctx: Any) -> Any:
            return func(instance, state, ctx)

    else:

        def call(state: Any, ctx: Any) -> Any:
            return func(instance, state)

    return call


def _is_own_function(cls: type, value: Any) -> bool:
    """Whether ``value`` is a plain function of the class body (``assignee=manager_of``)."""
    if not inspect.isfunction(value):
        return False
    return any(vars(klass).get(value.__name__) is value for klass in cls.__mro__)


def _state_callable(
    cls: type, instance: object, step: str, what: str, value: Any, *, by_name: bool
) -> tuple[Any, str | None]:
    """Resolve a state callable of the DSL: ``(callable or literal, hashed name or None)``.

    A method of the class -- named by a string when ``by_name``, or given
    by reference -- is bound to ``instance`` and named
    ``module.Class.method``; a lambda or function is kept (its own name is
    hashed); anything else is returned as is for validation to judge.
    """
    if isinstance(value, str) and by_name:
        raw = inspect.getattr_static(cls, value, None)
        if isinstance(raw, staticmethod):
            return raw.__func__, f"{cls.__module__}.{cls.__qualname__}.{value}"
        if not inspect.isfunction(raw):
            raise _class_error(cls, f"step {step!r}: {what} names no method {value!r}", step)
        return _bind_state(cls, instance, step, raw), f"{cls.__module__}.{cls.__qualname__}.{value}"
    if _is_own_function(cls, value):
        qualified = f"{cls.__module__}.{cls.__qualname__}.{value.__name__}"
        return _bind_state(cls, instance, step, value), qualified
    return value, None


def _compile_task(cls: type, instance: object, name: str, options: Mapping[str, Any]) -> TaskSpec:
    fields = dict(options)
    for what in ("assignee", "candidate_users", "candidate_groups", "subject_version"):
        value, qualified = _state_callable(
            cls, instance, name, what, fields[what], by_name=what == "subject_version"
        )
        fields[what] = value
        fields[f"{what}_name"] = qualified
    try:
        return TaskSpec(**fields)
    except WorkflowDefinitionError as exc:
        raise _class_error(cls, f"step {name!r}: {exc}", name) from None


def _method(
    cls: type, instance: object, step: str, what: str, value: Any
) -> tuple[Any, str | None]:
    """A callable taking fixed arguments (``merge``, ``result``, ``key``): ``(callable, name)``.

    A string names a method of the class; a function of the class body is
    taken by reference; both are bound to ``instance`` and named
    ``module.Class.method``. Anything else is kept (its own name is hashed)
    for validation to judge.
    """
    if isinstance(value, str):
        method = getattr(instance, value, None)
        if not callable(method):
            raise _class_error(cls, f"step {step!r}: {what} names no method {value!r}", step)
        return method, f"{cls.__module__}.{cls.__qualname__}.{value}"
    if _is_own_function(cls, value):
        return value.__get__(instance, cls), f"{cls.__module__}.{cls.__qualname__}.{value.__name__}"
    return value, None


def _compile_branches(cls: type, instance: object, name: str, spec: StepSpec) -> Step:
    """The Step of a fork, join or call declaration."""
    if spec.kind == "fork":
        fields = dict(spec.fork or {})
        fields["each"], fields["each_name"] = _state_callable(
            cls, instance, name, "each", fields["each"], by_name=False
        )
        fields["key"], fields["key_name"] = _method(cls, instance, name, "key", fields["key"])
        return Step(name, "fork", fork=ForkSpec(**fields), retry=spec.retry)
    if spec.kind == "join":
        fields = dict(spec.join or {})
        fields["merge"], fields["merge_name"] = _method(
            cls, instance, name, "merge", fields["merge"]
        )
        return Step(name, "join", next=spec.next, join=JoinSpec(**fields), retry=spec.retry)
    fields = dict(spec.call or {})
    fields["payload"], fields["payload_name"] = _state_callable(
        cls, instance, name, "payload", fields["payload"], by_name=True
    )
    fields["result"], fields["result_name"] = _method(
        cls, instance, name, "result", fields["result"]
    )
    return Step(name, "call", call=CallSpec(**fields), retry=spec.retry)


def _compile(cls: type, instance: object, name: str, spec: StepSpec) -> Step:
    try:
        return _compile_step(cls, instance, name, spec)
    except WorkflowDefinitionError as exc:
        if str(exc).startswith("workflow class"):
            raise
        # A Step's own refusal ("step 'x': delay: ...") gains the class and workflow.
        raise _class_error(cls, str(exc), name) from None


def _compile_step(cls: type, instance: object, name: str, spec: StepSpec) -> Step:
    qualified = f"{cls.__module__}.{cls.__qualname__}.{name}"
    if spec.kind in ("action", "decision"):
        assert spec.func is not None
        return Step(
            name,
            spec.kind,  # type: ignore[arg-type]
            next=spec.next,
            callback=_bind(cls, instance, name, spec.func),
            callback_name=qualified,
            targets=spec.targets,
            retry=spec.retry,
            compensate=spec.compensate,
        )
    if spec.kind == "wait":
        apply, apply_name = spec.apply, None
        if isinstance(apply, str):
            method = getattr(instance, apply, None)
            if not callable(method):
                raise _class_error(cls, f"step {name!r}: apply names no method {apply!r}")
            apply_name = f"{cls.__module__}.{cls.__qualname__}.{apply}"
            apply = method
        return Step(
            name,
            "wait",
            next=spec.next,
            signals=spec.signals,
            on_signal=spec.on or {},
            apply=apply,
            apply_name=apply_name,
            retry=spec.retry,
            timeout=spec.timeout,  # type: ignore[arg-type]  # parsed by Step
            on_timeout=spec.on_timeout,
        )
    if spec.kind == "timer":
        until, until_name = _state_callable(cls, instance, name, "until", spec.until, by_name=True)
        return Step(
            name,
            "timer",
            next=spec.next,
            delay=spec.delay,  # type: ignore[arg-type]  # parsed by Step
            until=until,
            until_name=until_name,
            retry=spec.retry,
        )
    if spec.kind == "task":
        assert spec.task is not None
        return Step(
            name, "task", task=_compile_task(cls, instance, name, spec.task), retry=spec.retry
        )
    if spec.kind in ("fork", "join", "call"):
        return _compile_branches(cls, instance, name, spec)
    if spec.kind == "service":
        fields = dict(spec.service or {})
        fields["request"], fields["request_name"] = _state_callable(
            cls, instance, name, "request", fields["request"], by_name=True
        )
        fields["result"], fields["result_name"] = _method(
            cls, instance, name, "result", fields["result"]
        )
        return Step(
            name,
            "service",
            next=spec.next,
            service=ServiceSpec(**fields),
            retry=spec.retry,
            compensate=spec.compensate,
        )
    return Step(name, spec.kind, reason=spec.reason)  # type: ignore[arg-type]


def _build(cls: type[Workflow[Any]]) -> Plan:
    for attribute in ("id", "version", "contract"):
        if not hasattr(cls, attribute):
            raise _class_error(cls, f"declares no {attribute}")
    state_type = _state_type(cls)
    specs = _collect(cls)
    if not specs:
        raise _class_error(cls, "declares no steps")
    starts = [name for name, spec in specs if spec.start]
    if len(starts) > 1:
        raise _class_error(cls, f"marks more than one start step: {', '.join(starts)}")
    instance = cls()
    return Plan.from_steps(
        [_compile(cls, instance, name, spec) for name, spec in specs],
        id=cls.id,
        version=cls.version,
        contract=cls.contract,
        start=starts[0] if starts else specs[0][0],
        state_type=state_type,
        signals=cls.signals,
        start_schema=cls.start_schema,
    )
