"""The plan: the immutable, validated graph of steps the engine drives.

A plan is data. The code DSL and (later) documents both compile to it, the
engine reads nothing else, and its hash -- over the structure, never over
callback bodies -- is what instances are pinned to. Building a ``Plan``
validates it, so an invalid plan cannot exist.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..exceptions import WorkflowDefinitionError, WorkflowValidationError
from ..payloads import json_copy, schema_failure
from .branches import CallSpec, ForkSpec, JoinSpec
from .durations import parse_duration
from .names import FrozenMap, callable_name
from .retry import RetryPolicy
from .services import ServiceSpec
from .tasks import TaskSpec, call_with_state

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = [
    "STEP_KINDS",
    "FrozenMap",
    "Plan",
    "Step",
    "StepKind",
    "TimerFire",
    "callable_name",
    "resolve_class_name",
]

StepKind = Literal[
    "action", "decision", "wait", "timer", "task", "fork", "join", "call", "service", "end", "fail"
]
STEP_KINDS: frozenset[str] = frozenset(get_args(StepKind))

_MAX_NAMES_IN_MESSAGE = 5

#: What ``Step.timer_fire`` answers: ``("delay", seconds)`` or ``("at", aware datetime)``.
TimerFire = tuple[Literal["delay"], int] | tuple[Literal["at"], datetime.datetime]


def resolve_class_name(name: str) -> type | None:
    """The class the dotted ``module.qualname`` ``name`` names, or None.

    Python's counterpart of a Java binary name: the longest importable module
    prefix, then attributes down the qualified name. A name that does not
    import, or names something other than a class, resolves to None: the
    class has *moved* (renamed, moved to another module, or deleted). The
    module is imported when it is not yet; an error other than ImportError
    raised by that import propagates (a broken module is not a moved class).
    """
    parts = str(name).split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute, None)
            if found is None:
                return None
        return found if isinstance(found, type) else None
    return None


def _names(value: Any, what: str, step_id: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise WorkflowDefinitionError(
            f"step {step_id!r}: {what} must be a list of names", step_id=step_id
        ) from None


@dataclass(frozen=True)
class Step:
    """One node of the plan; which fields matter depends on ``kind``.

    ``action``: ``callback(state, ctx) -> state`` then ``next``.
    ``decision``: ``callback(state, ctx) -> step id``, one of ``targets``.
    ``wait``: stops until one of ``signals`` arrives; ``apply`` (or the
    default merge) folds the payload into the state, then ``on_signal[name]``
    or ``next``; with ``timeout`` it also schedules a TIMEOUT timer leading
    to ``on_timeout``. ``timer``: waits ``delay``, or until the instant
    ``until(state[, ctx])`` returns, then ``next``. ``task``: opens the human
    task ``task`` (a ``TaskSpec``) and waits for one of its decisions.
    ``fork``: starts the branches of ``fork`` (a ``ForkSpec``), each ending
    at its join; ``join``: decides by ``join`` (a ``JoinSpec``), then
    ``next``; ``call``: starts the child workflow of ``call`` (a
    ``CallSpec``) and waits for it to end; ``service``: records a call of
    ``service`` (a ``ServiceSpec``) in the outbox and waits for its outcome,
    then ``next`` (or ``service.on_failed``). ``end`` completes; ``fail``
    fails with ``reason``.

    ``callback_name``/``apply_name``/``until_name`` default to the
    callable's ``module.qualname``; the plan hash covers these names, not
    the code. Durations are ``timedelta``s (readable strings are parsed).
    """

    id: str
    kind: StepKind
    next: str | None = None
    callback: Callable[..., Any] | None = None
    callback_name: str | None = None
    targets: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    on_signal: Mapping[str, str] = field(default_factory=FrozenMap)
    apply: Callable[..., Any] | None = None
    apply_name: str | None = None
    reason: str | None = None
    retry: RetryPolicy | None = None
    delay: datetime.timedelta | None = None
    until: Callable[..., Any] | None = None
    until_name: str | None = None
    timeout: datetime.timedelta | None = None
    on_timeout: str | None = None
    task: TaskSpec | None = None
    fork: ForkSpec | None = None
    join: JoinSpec | None = None
    call: CallSpec | None = None
    service: ServiceSpec | None = None
    # the step that undoes this one (an action or service step run only as a
    # compensation, when a ``fail`` step is reached later; see engine/compensation.py)
    compensate: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in ("delay", "timeout"):
            value = getattr(self, name)
            if value is not None:
                try:
                    put(self, name, parse_duration(value))
                except WorkflowDefinitionError as exc:
                    raise WorkflowDefinitionError(
                        f"step {self.id!r}: {name}: {exc}", step_id=self.id
                    ) from None
        if self.until is not None and self.until_name is None:
            put(self, "until_name", callable_name(self.until))
        if isinstance(self.task, TaskSpec) and self.task.title is None:
            put(self, "task", dataclasses.replace(self.task, title=self.id))
        put(self, "targets", _names(self.targets, "targets", self.id))
        put(self, "signals", _names(self.signals, "signals", self.id))
        try:
            put(self, "on_signal", FrozenMap(self.on_signal or {}))
        except (TypeError, ValueError):
            raise WorkflowDefinitionError(
                f"step {self.id!r}: on_signal must map signal names to step ids",
                step_id=self.id,
            ) from None
        if self.callback is not None and self.callback_name is None:
            put(self, "callback_name", callable_name(self.callback))
        if self.apply is not None and self.apply_name is None:
            put(self, "apply_name", callable_name(self.apply))

    def canonical(self) -> dict[str, Any]:
        """The hashed structure of the step.

        Fields at their default are left out, so a field added by a later
        release does not change the hash of plans that do not use it.
        Targets and signals are sets: their declaration order is not hashed.
        """
        data: dict[str, Any] = {"kind": self.kind}
        if self.next is not None:
            data["next"] = self.next
        if self.callback_name is not None:
            data["callback_name"] = self.callback_name
        if self.targets:
            data["targets"] = sorted(self.targets)
        if self.signals:
            data["signals"] = sorted(self.signals)
        if self.on_signal:
            data["on_signal"] = dict(sorted(self.on_signal.items()))
        if self.apply_name is not None:
            data["apply_name"] = self.apply_name
        if self.reason is not None:
            data["reason"] = self.reason
        if self.retry is not None and self.retry.canonical():
            data["retry"] = self.retry.canonical()
        if self.delay is not None:
            data["delay"] = int(self.delay.total_seconds())
        if self.until_name is not None:
            data["until_name"] = self.until_name
        if self.timeout is not None:
            data["timeout"] = int(self.timeout.total_seconds())
        if self.on_timeout is not None:
            data["on_timeout"] = self.on_timeout
        if self.task is not None:
            data["task"] = self.task.canonical()
        for name in ("fork", "join", "call", "service"):
            spec = getattr(self, name)
            if spec is not None:
                data[name] = spec.canonical()
        if self.compensate is not None:
            data["compensate"] = self.compensate
        return data

    def timer_fire(self, state: Any, ctx: Any) -> TimerFire:
        """When a timer step entered now fires: ``("delay", seconds)`` or ``("at", instant)``.

        A ``delay`` counts from the recording of the timer (the store reads
        the database clock); an ``until`` callable is called with the state
        (and ``ctx`` when it takes it) and must return an aware ``datetime``
        or an ISO-8601 string with an offset, answered in UTC. A naive
        datetime, a string without an offset or anything else raises
        ``TypeError`` naming the step, never the value. An instant in the
        past is returned as is: the store takes it as now.
        """
        if self.kind != "timer":
            raise TypeError(f"step {self.id!r} is a {self.kind} step, not a timer")
        if self.delay is not None:
            return ("delay", int(self.delay.total_seconds()))
        assert self.until is not None, "validation requires delay or until"
        value = call_with_state(self.until, state, ctx)
        what = f"until of timer step {self.id!r}"
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value)
            except ValueError:
                raise TypeError(
                    f"{what} returned a string that is not an ISO-8601 instant"
                ) from None
        elif not isinstance(value, datetime.datetime):
            raise TypeError(
                f"{what} must return an aware datetime or an ISO-8601 string, "
                f"not {type(value).__name__}"
            )
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError(f"{what} returned an instant without a time zone offset")
        return ("at", value.astimezone(datetime.UTC))


def _name_list(names: Iterable[str]) -> str:
    shown = sorted(str(name)[:64] for name in names)
    more = len(shown) - _MAX_NAMES_IN_MESSAGE
    text = ", ".join(repr(name) for name in shown[:_MAX_NAMES_IN_MESSAGE])
    return f"{text} and {more} more" if more > 0 else text


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan:
    """A validated workflow definition: identity, state type, signals and steps.

    ``steps`` keeps declaration order (for diagrams and listings); use
    ``Plan.from_steps`` to build one from a sequence of steps. Plans compare
    by identity: compare ``plan_hash`` to ask "same structure?".
    """

    id: str
    version: int
    contract: str
    start: str
    steps: Mapping[str, Step]
    state_type: type | None = None
    state_type_name: str = ""
    signals: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    start_schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        from .validation import validate

        put = object.__setattr__
        if isinstance(self.steps, Mapping):
            put(self, "steps", MappingProxyType(dict(self.steps)))
        if isinstance(self.signals, Mapping):
            put(self, "signals", MappingProxyType(copy.deepcopy(dict(self.signals))))
        put(self, "start_schema", copy.deepcopy(self.start_schema))
        if not self.state_type_name:
            name = "dict" if self.state_type is None else callable_name(self.state_type)
            put(self, "state_type_name", name)
        validate(self)

    @classmethod
    def from_steps(cls, steps: Iterable[Step], **fields: Any) -> Plan:
        """Build a plan from steps in declaration order, refusing duplicate ids."""
        by_id: dict[str, Step] = {}
        for step in steps:
            if step.id in by_id:
                raise WorkflowDefinitionError(
                    f"workflow {fields.get('id')!r} step {step.id!r}: step id declared twice",
                    definition_id=fields.get("id"),
                    step_id=step.id,
                )
            by_id[step.id] = step
        return cls(steps=by_id, **fields)

    # -- identity ---------------------------------------------------------

    def canonical(self) -> dict[str, Any]:
        """The JSON structure the hash covers: everything but callables, keys sorted."""
        raw = {
            "id": self.id,
            "version": self.version,
            "contract": self.contract,
            "state_type_name": self.state_type_name,
            "start": self.start,
            "signals": dict(self.signals),
            "start_schema": self.start_schema,
            "steps": {step.id: step.canonical() for step in self.steps.values()},
        }
        result: dict[str, Any] = json.loads(json.dumps(raw, sort_keys=True))
        return result

    @cached_property
    def plan_hash(self) -> str:
        """SHA-256 (lowercase hex) of the canonical structure, dumped compactly with sorted keys."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @cached_property
    def opens_timers_or_tasks(self) -> bool:
        """Whether any step schedules a timer or opens a task (timer, task, wait with timeout).

        An ending step closes what is still open only in such plans: the
        others never pay for it.
        """
        return any(
            step.kind in ("timer", "task") or step.timeout is not None
            for step in self.steps.values()
        )

    @cached_property
    def name_binding(self) -> dict[str, str]:
        """The binary name of each class the plan names, mapped to the name the hash used.

        Recorded with the plan hash (registry ``name_binding``). Code plans
        name one class at most, the dataclass state type (signal payloads
        are JSON checked by schemas, not classes): ``{"app.flows.Expense":
        "app.flows.Expense"}`` when the hash used its dotted name, or the
        logical ``state_type_name`` a ``Plan`` was given. A dict state names
        no class, and a class that cannot be found by its name (defined
        inside a function) is not bound: nothing could look it up by name.
        """
        if self.state_type is None:
            return {}
        binary = callable_name(self.state_type)
        if resolve_class_name(binary) is not self.state_type:
            return {}
        return {binary: self.state_type_name}

    @cached_property
    def fork_of_join(self) -> Mapping[str, str]:
        """Join step id -> the id of the one fork step naming it (validation ensures one)."""
        return MappingProxyType(
            {
                step.fork.join: step.id
                for step in self.steps.values()
                if step.kind == "fork" and step.fork is not None
            }
        )

    @cached_property
    def compensation_steps(self) -> frozenset[str]:
        """Ids of the steps some step names as its ``compensate`` (run only as compensations).

        Empty for a plan that declares no compensation: its ``fail`` steps
        never read the history for compensations.
        """
        return frozenset(
            step.compensate for step in self.steps.values() if step.compensate is not None
        )

    def step(self, step_id: str) -> Step:
        """The step with this id; an unknown id is a definition error (a stale pin or a bug)."""
        try:
            return self.steps[step_id]
        except KeyError:
            raise WorkflowDefinitionError(
                f"workflow {self.id!r} version {self.version} has no step {step_id!r}",
                definition_id=self.id,
                step_id=step_id,
            ) from None

    # -- state ------------------------------------------------------------

    def state_from_json(self, data: dict[str, Any] | None) -> Any:
        """The state callbacks see, built from stored JSON (a private copy).

        A dataclass state refuses unknown and missing fields with
        ``WorkflowValidationError`` (``check_state_fields``). Nested values
        stay as JSON (dicts and lists): only the top-level dataclass is rebuilt.
        """
        if data is None:
            data = {}
        self.check_state_fields(data, f"state of workflow {self.id!r}")
        data = copy.deepcopy(data)
        if self.state_type is None:
            return data
        return self.state_type(**data)

    def check_state_fields(self, data: Any, what: str) -> None:
        """Refuse JSON the state type cannot be built from, without building it.

        The one rule for "fits the state type": a JSON object; for a dataclass
        state no field it does not declare and every required field. The
        record side asks it of a start payload (no workflow code runs there:
        the dataclass is not constructed); ``state_from_json`` of every
        stored state.
        """
        if not isinstance(data, dict):
            raise WorkflowValidationError(
                f"{what} must be a JSON object, not {type(data).__name__}"
            )
        if self.state_type is None:
            return
        fields = [f for f in dataclasses.fields(self.state_type) if f.init]
        unknown = set(data) - {f.name for f in fields}
        if unknown:
            raise WorkflowValidationError(
                f"{what} has fields {self.state_type_name} does not declare: {_name_list(unknown)}"
            )
        missing = [
            f.name
            for f in fields
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise WorkflowValidationError(
                f"{what} lacks required fields of {self.state_type_name}: {_name_list(missing)}"
            )

    def state_to_json(self, state: Any) -> dict[str, Any]:
        """The JSON to store for a state: a deep copy holding only JSON types.

        Raises ``TypeError`` naming the offending field path (never its value)
        when the state is of the wrong type or holds something JSON cannot
        store (a datetime, a set, NaN, a non-string key, a NUL character:
        the rules of ``payloads.json_copy``).
        """
        if self.state_type is None:
            if not isinstance(state, dict):
                raise TypeError(
                    f"state of workflow {self.id!r} must be a dict, not {type(state).__name__}"
                )
        elif not isinstance(state, self.state_type):
            raise TypeError(
                f"state of workflow {self.id!r} must be a {self.state_type_name}, "
                f"not {type(state).__name__}"
            )
        result: dict[str, Any] = json_copy(state, "state", error=TypeError, objects=True)
        return result

    # -- signals ----------------------------------------------------------

    def next_after_signal(self, step: Step, name: str) -> str | None:
        """Where a wait step goes after ``name``; None when the step does not accept it."""
        if name not in step.signals:
            return None
        return step.on_signal.get(name, step.next)

    def apply_signal(self, step: Step, state: Any, name: str, payload: Any, ctx: Any) -> Any:
        """Fold a signal's payload into the state at a wait step.

        ``step.apply(state, name, payload, ctx)`` when given. Otherwise a
        merge: a dict state becomes ``state | payload``; a dataclass state is
        ``dataclasses.replace``-d with the payload's keys, which must be
        declared fields (``check_merge``). A ``None`` payload leaves the state
        unchanged.
        """
        if name not in step.signals:
            raise WorkflowValidationError(
                f"step {step.id!r} of workflow {self.id!r} does not accept signal {name!r}"
            )
        if step.apply is not None:
            return step.apply(state, name, payload, ctx)
        self.check_merge(name, payload)
        return self.merge(state, payload)

    def merge(self, state: Any, payload: dict[str, Any] | None) -> Any:
        """The default merge of a payload ``check_merge`` admitted: ``state | payload``.

        A dataclass state is ``dataclasses.replace``-d; the payload is copied,
        so the state never shares it. A signal's and a task completion's
        payload are folded in by this one rule.
        """
        if payload is None:
            return state
        payload = copy.deepcopy(payload)
        if self.state_type is None:
            return {**state, **payload}
        return dataclasses.replace(state, **payload)

    def check_merge(self, name: str, payload: Any) -> None:
        """Refuse a payload the default merge cannot fold into the state.

        The one rule of the default merge, asked when a wait applies the
        signal and, on the record side, before the signal is written: a JSON
        object (or ``None``: nothing to merge) whose keys, for a dataclass
        state, are declared fields. Its values are not checked: the merge
        does not look at them.
        """
        if payload is None:
            return
        if not isinstance(payload, dict):
            raise WorkflowValidationError(
                f"payload of signal {name!r} must be a JSON object to merge into the state of "
                f"workflow {self.id!r}, not {type(payload).__name__}"
            )
        if self.state_type is None:
            return
        allowed = {f.name for f in dataclasses.fields(self.state_type) if f.init}
        unknown = set(payload) - allowed
        if unknown:
            raise WorkflowValidationError(
                f"payload of signal {name!r} has fields {self.state_type_name} does not "
                f"declare: {_name_list(unknown)}"
            )

    @cached_property
    def _merged_signals(self) -> frozenset[str]:
        """Signal names every accepting wait folds in with the default merge.

        Only for these can the record side tell that a payload will not fit:
        a wait with its own ``apply`` accepts any JSON its schema admits, and
        a name no wait accepts is never applied.
        """
        accepting: dict[str, list[Step]] = {}
        for step in self.steps.values():
            if step.kind == "wait":
                for name in step.signals:
                    accepting.setdefault(name, []).append(step)
        return frozenset(
            name for name, waits in accepting.items() if all(step.apply is None for step in waits)
        )

    # -- payload schemas --------------------------------------------------

    @cached_property
    def _validators(self) -> dict[str | None, Validator]:
        from jsonschema import Draft202012Validator

        found: dict[str | None, Validator] = {}
        if self.start_schema is not None:
            found[None] = Draft202012Validator(self.start_schema)
        for name, schema in self.signals.items():
            if schema is not None:
                found[name] = Draft202012Validator(schema)
        return found

    def check_start_payload(self, payload: Any) -> None:
        """Refuse a start payload that fails ``start_schema`` or does not fit the state type.

        ``WorkflowValidationError`` either way: the executor would refuse the
        same payload when it builds the first state.
        """
        what = f"start payload of workflow {self.id!r}"
        self._check(None, payload, what)
        self.check_state_fields({} if payload is None else payload, what)

    def check_signal_payload(self, name: str, payload: Any) -> None:
        """Refuse an undeclared signal, a payload failing its schema, or one the merge refuses.

        ``WorkflowValidationError``. The merge rule (``check_merge``) applies
        when every wait accepting ``name`` uses the default merge.
        """
        if name not in self.signals:
            raise WorkflowValidationError(
                f"workflow {self.id!r} version {self.version} declares no signal {str(name)[:64]!r}"
            )
        self._check(name, payload, f"payload of signal {name!r} of workflow {self.id!r}")
        if name in self._merged_signals:
            self.check_merge(name, payload)

    def _check(self, key: str | None, payload: Any, what: str) -> None:
        validator = self._validators.get(key)
        failure = None if validator is None else schema_failure(validator, payload)
        if failure is not None:
            raise WorkflowValidationError(f"{what} does not match its schema {failure}")
