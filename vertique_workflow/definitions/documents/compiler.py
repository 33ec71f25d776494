"""Compiling a workflow document to a ``Plan``: the same steps the code DSL builds.

The compiler builds ``Step``, ``TaskSpec``, ``ForkSpec``, ``JoinSpec`` and
``CallSpec`` objects exactly as ``dsl.py`` does for the equivalent class --
the same hashed names, the same method binding -- and lets ``Plan``'s own
validation judge the result, so a document is valid exactly when its code
twin is, and both have one plan hash and one name binding. Every refusal is
a ``DocumentError`` at the path and line of the offending key.
"""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ...exceptions import WorkflowDefinitionError
from ..branches import DEFAULT_MAX_BRANCHES, CallSpec, ForkSpec, JoinSpec
from ..dsl import StepSpec, _bind, _method, _state_callable
from ..durations import parse_duration
from ..names import callable_name
from ..plan import Plan, Step
from ..retry import RetryPolicy
from ..tasks import TaskDecision, TaskSpec, state_arity
from .errors import DocumentError, Path, format_path
from .parsing import Parsed
from .references import DocumentCatalog, workflow_method

__all__ = ["compile_parsed"]

# How a named callable is called, which decides how a Workflow method is bound
# (the three ways dsl.py binds them): an action/decision callback (state, ctx),
# a state callable (state[, ctx]), or a method with fixed arguments (apply,
# merge, result, key).
_CALLBACK, _STATE, _METHOD = "callback", "state", "method"


class _Compiler:
    def __init__(self, parsed: Parsed, source: str | None, catalog: DocumentCatalog) -> None:
        self.parsed = parsed
        self.data: dict[str, Any] = parsed.data
        self.source = source
        self.catalog = catalog
        self.instances: dict[type, object] = {}

    # -- errors -----------------------------------------------------------

    def error(self, path: Path, detail: str, step_id: str | None = None) -> DocumentError:
        return DocumentError(
            detail,
            path=format_path(path) or None,
            line=self.parsed.line_of(path),
            source=self.source,
            definition_id=self.data.get("id") if isinstance(self.data.get("id"), str) else None,
            step_id=step_id,
        )

    # -- names ------------------------------------------------------------

    def instance_of(self, cls: type, path: Path) -> object:
        if cls not in self.instances:
            try:
                self.instances[cls] = cls()
            except Exception as exc:
                raise self.error(
                    path, f"workflow class {cls.__qualname__} cannot be instantiated"
                ) from exc
        return self.instances[cls]

    def callable(
        self, path: Path, name: str, style: str, step_id: str
    ) -> tuple[Callable[..., Any], str]:
        """The callable a document names, bound as the DSL binds it, and its hashed name."""
        what = str(path[-1]) if path and isinstance(path[-1], str) else "callable"
        registered = self.catalog.callable(name)
        if registered is not None:
            hashed = callable_name(registered)
            if style != _CALLBACK:
                return registered, hashed
            try:
                arity = state_arity(registered)
            except TypeError:
                raise self.error(path, f"{name!r} must take (state) or (state, ctx)") from None
            if arity == 2:
                return registered, hashed

            @functools.wraps(registered)
            def callback(state: Any, ctx: Any) -> Any:
                return registered(state)

            return callback, hashed
        found = workflow_method(name)
        if found is None:
            raise self.error(
                path,
                f"unknown callable {name[:255]!r}: register it with register_callable(), or "
                "name a method of an imported Workflow class as 'module.Class.method'",
            )
        cls, attribute = found
        instance = self.instance_of(cls, path)
        try:
            if style == _STATE:
                return _state_callable(cls, instance, step_id, what, attribute, by_name=True)
            if style == _METHOD:
                return _method(cls, instance, step_id, what, attribute)
            raw = inspect.getattr_static(cls, attribute)
            func = raw.func if isinstance(raw, StepSpec) else raw
            if not inspect.isfunction(func):
                raise self.error(path, f"{name!r} is not a method")
            return _bind(cls, instance, step_id, func), name
        except WorkflowDefinitionError as exc:
            if isinstance(exc, DocumentError):
                raise
            raise self.error(path, _rule_of(str(exc)), step_id) from None

    def state_type(self) -> type | None:
        name = self.data.get("state")
        if name is None or name == "dict":
            return None
        found = self.catalog.type(name)
        if found is None:
            raise self.error(
                ("state",), f"unknown type {name[:255]!r}: register it with register_type()"
            )
        return found

    def duration(self, path: Path, value: str) -> datetime.timedelta:
        try:
            return parse_duration(value)
        except WorkflowDefinitionError as exc:
            raise self.error(path, str(exc)) from None

    # -- transitions ------------------------------------------------------

    def transitions(self) -> Iterator[tuple[Path, Any]]:
        """Every ``(path, step id)`` a document names as a step, for the unknown-step check."""
        if "start" in self.data:
            yield ("start",), self.data["start"]
        for step_id, body in self.data["steps"].items():
            at: Path = ("steps", step_id)
            for key in ("next", "on_timeout", "on_due", "on_failed", "on_completed", "compensate"):
                if key in body:
                    yield (*at, key), body[key]
            if body["kind"] == "fork":
                yield (*at, "join"), body["join"]
                if "start" in body:
                    yield (*at, "start"), body["start"]
                for branch, first in body.get("branches", {}).items():
                    yield (*at, "branches", branch), first
            for index, target in enumerate(body.get("targets", ())):
                yield (*at, "targets", index), target
            for signal, target in body.get("on", {}).items():
                yield (*at, "on", signal), target
            for name, decision in body.get("decisions", {}).items():
                if isinstance(decision, str):
                    yield (*at, "decisions", name), decision
                else:
                    yield (*at, "decisions", name, "next"), decision["next"]

    # -- steps ------------------------------------------------------------

    def retry(self, path: Path, body: Mapping[str, Any] | None) -> RetryPolicy | None:
        if body is None:
            return None
        never = []
        for index, name in enumerate(body.get("never", ())):
            cls = self.catalog.type(name)
            if cls is None or not issubclass(cls, Exception):
                raise self.error(
                    (*path, "never", index),
                    f"unknown exception class {name[:255]!r}: register it with register_type() "
                    "(builtin exceptions are known by name)",
                )
            never.append(cls)
        backoff = body.get("backoff_ms")
        if "backoff" in body:
            backoff = _ms(self.duration((*path, "backoff"), body["backoff"]))
        cap = body.get("max_backoff_ms")
        if "max_backoff" in body:
            cap = _ms(self.duration((*path, "max_backoff"), body["max_backoff"]))
        try:
            return RetryPolicy(
                max_attempts=body.get("max_attempts"),
                initial_backoff_ms=backoff,
                max_backoff_ms=cap,
                never=tuple(never),
            )
        except WorkflowDefinitionError as exc:
            raise self.error(path, str(exc)) from None

    def step(self, step_id: str, body: Mapping[str, Any]) -> Step:
        at: Path = ("steps", step_id)
        kind = body["kind"]
        retry = self.retry((*at, "retry"), body.get("retry"))
        if kind in ("action", "decision"):
            func, name = self.callable((*at, "callback"), body["callback"], _CALLBACK, step_id)
            return Step(
                step_id,
                kind,
                next=body.get("next"),
                callback=func,
                callback_name=name,
                targets=tuple(body.get("targets", ())),
                retry=retry,
                compensate=body.get("compensate"),
            )
        if kind == "wait":
            return self.wait(at, step_id, body, retry)
        if kind == "timer":
            until = until_name = None
            if "until" in body:
                until, until_name = self.callable((*at, "until"), body["until"], _STATE, step_id)
            delay = (
                self.duration((*at, "duration"), body["duration"]) if "duration" in body else None
            )
            return Step(
                step_id,
                "timer",
                next=body["next"],
                delay=delay,
                until=until,
                until_name=until_name,
                retry=retry,
            )
        if kind == "task":
            return Step(step_id, "task", task=self.task(at, step_id, body), retry=retry)
        if kind == "fork":
            return Step(step_id, "fork", fork=self.fork(at, step_id, body), retry=retry)
        if kind == "join":
            merge = merge_name = None
            if "merge" in body:
                merge, merge_name = self.callable((*at, "merge"), body["merge"], _METHOD, step_id)
            spec = JoinSpec(
                policy=body.get("policy", "all"),
                merge=merge,
                on_failed=body.get("on_failed"),
                merge_name=merge_name,
            )
            return Step(step_id, "join", next=body["next"], join=spec, retry=retry)
        if kind == "call":
            return Step(step_id, "call", call=self.call(at, step_id, body), retry=retry)
        if kind == "fail":
            return Step(step_id, "fail", reason=body.get("reason", "FAILED"))
        return Step(step_id, "end")

    def wait(
        self, at: Path, step_id: str, body: Mapping[str, Any], retry: RetryPolicy | None
    ) -> Step:
        signals = body["signals"]
        apply = apply_name = None
        if "apply" in body:
            apply, apply_name = self.callable((*at, "apply"), body["apply"], _METHOD, step_id)
        timeout = self.duration((*at, "timeout"), body["timeout"]) if "timeout" in body else None
        return Step(
            step_id,
            "wait",
            next=body.get("next"),
            signals=(signals,) if isinstance(signals, str) else tuple(signals),
            on_signal=body.get("on", {}),
            apply=apply,
            apply_name=apply_name,
            timeout=timeout,
            on_timeout=body.get("on_timeout"),
            retry=retry,
        )

    def people(self, at: Path, step_id: str, body: Mapping[str, Any], key: str) -> tuple[Any, Any]:
        """A people field: a literal name or names, or ``{callable: ...}``; with its hashed name."""
        value = body.get(key)
        if isinstance(value, dict):
            return self.callable((*at, key, "callable"), value["callable"], _STATE, step_id)
        if isinstance(value, list):
            return tuple(value), None
        if isinstance(value, str) and key != "assignee":
            return (value,), None
        return value, None

    def task(self, at: Path, step_id: str, body: Mapping[str, Any]) -> TaskSpec:
        fields: dict[str, Any] = {}
        for key in ("assignee", "candidate_users", "candidate_groups"):
            fields[key], fields[f"{key}_name"] = self.people(at, step_id, body, key)
        if "subject_version" in body:
            fields["subject_version"], fields["subject_version_name"] = self.callable(
                (*at, "subject_version"), body["subject_version"], _STATE, step_id
            )
        decisions = {
            name: TaskDecision(value)
            if isinstance(value, str)
            else TaskDecision(value["next"], schema=value.get("schema"))
            for name, value in body["decisions"].items()
        }
        due = self.duration((*at, "due"), body["due"]) if "due" in body else None
        reminders = tuple(
            self.duration((*at, "reminders", index), text)
            for index, text in enumerate(body.get("reminders", ()))
        )
        try:
            return TaskSpec(
                title=body.get("title"),
                decisions=decisions,
                due=due,
                on_due=body.get("on_due"),
                reminders=reminders,
                require_version_stability=body.get("require_version_stability", False),
                **fields,
            )
        except WorkflowDefinitionError as exc:
            raise self.error(at, str(exc), step_id) from None

    def fork(self, at: Path, step_id: str, body: Mapping[str, Any]) -> ForkSpec:
        each: Any = body.get("each")
        each_name = key = key_name = None
        if isinstance(each, dict):
            each, each_name = self.callable(
                (*at, "each", "callable"), each["callable"], _STATE, step_id
            )
        if "key" in body:
            key, key_name = self.callable((*at, "key"), body["key"], _METHOD, step_id)
        return ForkSpec(
            join=body["join"],
            branches=body.get("branches", {}),
            each=each,
            start=body.get("start"),
            key=key,
            max_branches=body.get("max_branches", DEFAULT_MAX_BRANCHES),
            each_name=each_name,
            key_name=key_name,
        )

    def call(self, at: Path, step_id: str, body: Mapping[str, Any]) -> CallSpec:
        payload = payload_name = result = result_name = None
        if "payload" in body:
            payload, payload_name = self.callable(
                (*at, "payload"), body["payload"], _STATE, step_id
            )
        if "result" in body:
            result, result_name = self.callable((*at, "result"), body["result"], _METHOD, step_id)
        return CallSpec(
            workflow=body["workflow"],
            on_completed=body.get("on_completed"),
            on_failed=body.get("on_failed"),
            version=body.get("version"),
            payload=payload,
            result=result,
            payload_name=payload_name,
            result_name=result_name,
        )

    # -- the plan ---------------------------------------------------------

    def plan(self) -> Plan:
        steps_data: dict[str, Any] = self.data["steps"]
        for path, target in self.transitions():
            if target not in steps_data:
                raise self.error(path, f"unknown step {target[:255]!r}")
        state_type = self.state_type()
        steps = []
        for step_id, body in steps_data.items():
            try:
                steps.append(self.step(step_id, body))
            except DocumentError:
                raise
            except WorkflowDefinitionError as exc:
                raise self.error(("steps", step_id), _rule_of(str(exc)), step_id) from None
        try:
            return Plan.from_steps(
                steps,
                id=self.data["id"],
                version=self.data["version"],
                contract=self.data.get("contract", self.data["id"]),
                start=self.data.get("start", next(iter(steps_data))),
                state_type=state_type,
                signals=self.data.get("signals", {}),
                start_schema=self.data.get("start_schema"),
            )
        except WorkflowDefinitionError as exc:
            raise self.translate(exc) from None

    def translate(self, exc: WorkflowDefinitionError) -> DocumentError:
        """A plan validation error as a DocumentError at the step (and field) it names."""
        rule = _rule_of(str(exc))
        step_id = exc.step_id
        steps = self.data["steps"]
        if step_id is not None and step_id in steps:
            path: Path = ("steps", step_id)
            head = rule.split(" ", 1)[0].strip(":,")
            if head in steps[step_id] and head != "kind":
                path = (*path, head)
            return self.error(path, rule, step_id)
        return self.error(_header_path(rule, self.data), rule)


def _ms(delta: datetime.timedelta) -> int:
    return int(delta.total_seconds() * 1000)


def _rule_of(message: str) -> str:
    """A validation message without its ``workflow 'x' step 'y': `` prefix (the path says it)."""
    for marker in ("': ", "): "):
        if message.startswith(("workflow ", "step ")) and marker in message:
            return message.split(marker, 1)[1]
    return message


def _header_path(rule: str, data: Mapping[str, Any]) -> Path:
    for key in ("id", "version", "contract", "start_schema", "start"):
        if rule.startswith(key + " "):
            return (key,)
    if rule.startswith(("payload schema of signal", "signal name")):
        for name in data.get("signals", {}):
            if repr(name) in rule:
                return ("signals", name)
        return ("signals",)
    if rule.startswith(("the state type", "a dict state")):
        return ("state",)
    return ()


def compile_parsed(parsed: Parsed, source: str | None, catalog: DocumentCatalog) -> Plan:
    """The plan of a parsed document whose shape the schema admitted."""
    return _Compiler(parsed, source, catalog).plan()
