"""Human task specifications: who may decide, what they may decide, and by when.

A ``TaskSpec`` is the definition side of a ``task`` step: plain, frozen data
the plan hash covers (callables by name, never by code), plus the two pure
helpers the engine needs when a token enters the step -- ``resolve_people``
(who the task goes to) -- and when a completion arrives -- ``check_payload``
(does the payload fit the decision's schema). Nothing here touches the
database or the settings, so the engine stays replayable in memory.
"""

from __future__ import annotations

import copy
import datetime
import functools
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import WorkflowDefinitionError, WorkflowValidationError
from ..payloads import schema_failure
from .durations import parse_duration
from .names import callable_name

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = [
    "MAX_PERSON_NAME_LENGTH",
    "TaskDecision",
    "TaskSpec",
    "call_with_state",
    "decision_to",
    "resolve_people",
    "state_arity",
]

# workflow_tasks.assignee and the names in candidates_json fit VARCHAR(255).
MAX_PERSON_NAME_LENGTH = 255


def state_arity(func: Callable[..., Any]) -> int:
    """1 when ``func`` takes ``(state)``, 2 when it takes ``(state, ctx)``.

    Decided from the signature, once per (hashable) callable. A callable
    whose signature cannot be read (some builtins) is taken as ``(state)``.
    A signature fitting neither raises ``TypeError``; validation asks this
    at build time so the engine never meets such a callable.
    """
    try:
        hash(func)
    except TypeError:
        return _arity(func)
    return _cached_arity(func)


@functools.lru_cache(maxsize=1024)
def _cached_arity(func: Callable[..., Any]) -> int:
    return _arity(func)


def _arity(func: Callable[..., Any]) -> int:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return 1
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(positional) >= 2 and len(required) <= 2:
        return 2
    if len(positional) == 1:
        return 1
    raise TypeError("the callable must take (state) or (state, ctx)")


def call_with_state(func: Callable[..., Any], state: Any, ctx: Any) -> Any:
    """Call a state callable of either form: ``func(state)`` or ``func(state, ctx)``."""
    if state_arity(func) == 2:
        return func(state, ctx)
    return func(state)


@dataclass(frozen=True)
class TaskDecision:
    """One decision a task offers: the step it leads to and its payload's JSON Schema.

    ``schema`` is ``None`` when the decision takes any payload. The schema is
    checked (draft 2020-12) when the plan is built. Hashable: the hash is
    over the step and the schema's canonical JSON.
    """

    next: str
    schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", copy.deepcopy(self.schema))

    def canonical(self) -> dict[str, Any]:
        """``{"next": ..., "schema": ...}``; the schema only when given."""
        data: dict[str, Any] = {"next": self.next}
        if self.schema is not None:
            data["schema"] = self.schema
        return data

    def __hash__(self) -> int:
        return hash(json.dumps(self.canonical(), sort_keys=True, default=repr))


def decision_to(next: str, *, schema: dict[str, Any] | None = None) -> TaskDecision:
    """Sugar for ``TaskDecision(next, schema=...)`` in ``task(decisions={...})``.

    ``{"approve": decision_to("pay", schema={...}), "reject": "rejected"}``.
    """
    return TaskDecision(next, schema=schema)


class _Decisions(Mapping[str, TaskDecision]):
    """A read-only, hashable mapping of decision names, like ``plan.FrozenMap``."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._data: dict[str, Any] = {
            name: TaskDecision(value) if isinstance(value, str) else value
            for name, value in items.items()
        }

    def __getitem__(self, key: str) -> TaskDecision:
        value: TaskDecision = self._data[key]
        return value

    def __iter__(self) -> Any:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset((name, hash(value)) for name, value in self._data.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self._data) == dict(other)

    def __repr__(self) -> str:
        return f"Decisions({self._data!r})"


def _duration(value: Any, what: str) -> datetime.timedelta | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except WorkflowDefinitionError as exc:
        raise WorkflowDefinitionError(f"{what}: {exc}") from None


def _people(value: Any, what: str) -> Any:
    """A callable as is; a single name or names as a tuple (not yet checked: validation does)."""
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise WorkflowDefinitionError(
            f"{what} must be names, a list of names or a callable of the state"
        ) from None


@dataclass(frozen=True)
class TaskSpec:
    """What a ``task`` step opens: title, people, decisions, due date, reminders.

    - ``title``: shown in task lists; ``None`` becomes the step id.
    - ``assignee``: a user name or a callable of the state returning one
      (or None); ``candidate_users`` / ``candidate_groups``: names (Django
      auth user names / group names) or a callable returning a list of
      them. Callables take ``(state)`` or ``(state, ctx)``. At least one of
      the three is required.
    - ``decisions``: decision name -> ``TaskDecision`` (a plain step id is
      sugar for a decision without a payload schema).
    - ``due`` with ``on_due`` (both or neither): the DUE timer and where it
      leads. ``reminders``: delays after the task opens, each firing a
      REMINDER timer that keeps the task open; each before ``due``.
    - ``require_version_stability`` with ``subject_version``: a callable of
      the state returning the version (int or str) of the reviewed subject;
      a completion made against another version is rejected.

    The ``*_name`` fields default to the callables' ``module.qualname``;
    the plan hash covers these names, never the code.
    """

    title: str | None = None
    assignee: str | Callable[..., Any] | None = None
    candidate_users: tuple[str, ...] | Callable[..., Any] | None = None
    candidate_groups: tuple[str, ...] | Callable[..., Any] | None = None
    decisions: Mapping[str, TaskDecision] = field(default_factory=dict)
    due: datetime.timedelta | None = None
    on_due: str | None = None
    reminders: tuple[datetime.timedelta, ...] = ()
    require_version_stability: bool = False
    subject_version: Callable[..., Any] | None = None
    assignee_name: str | None = None
    candidate_users_name: str | None = None
    candidate_groups_name: str | None = None
    subject_version_name: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "candidate_users", _people(self.candidate_users, "candidate_users"))
        put(self, "candidate_groups", _people(self.candidate_groups, "candidate_groups"))
        if not isinstance(self.decisions, Mapping):
            raise WorkflowDefinitionError(
                "decisions must map decision names to step ids or TaskDecision(...)"
            )
        put(self, "decisions", _Decisions(self.decisions))
        put(self, "due", _duration(self.due, "due"))
        reminders = self.reminders
        if isinstance(reminders, str | datetime.timedelta):
            reminders = (reminders,)
        try:
            items = tuple(reminders or ())
        except TypeError:
            raise WorkflowDefinitionError("reminders must be a list of durations") from None
        put(
            self,
            "reminders",
            tuple(_duration(item, f"reminder {index + 1}") for index, item in enumerate(items)),
        )
        for attribute in ("assignee", "candidate_users", "candidate_groups", "subject_version"):
            value = getattr(self, attribute)
            if callable(value) and getattr(self, f"{attribute}_name") is None:
                put(self, f"{attribute}_name", callable_name(value))

    # -- identity ---------------------------------------------------------

    def canonical(self) -> dict[str, Any]:
        """The hashed structure: literal names sorted, callables by name, durations in seconds.

        Decisions are keyed by name (their declaration order is not hashed),
        reminders and candidate names are sorted. Fields at their default
        are left out.
        """
        data: dict[str, Any] = {"decisions": {}}
        if self.title is not None:
            data["title"] = self.title
        for attribute in ("assignee", "candidate_users", "candidate_groups"):
            value = getattr(self, attribute)
            if callable(value):
                data[f"{attribute}_name"] = getattr(self, f"{attribute}_name")
            elif isinstance(value, tuple):
                if value:
                    data[attribute] = sorted(value)
            elif value is not None:
                data[attribute] = value
        data["decisions"] = {
            name: decision.canonical() for name, decision in sorted(self.decisions.items())
        }
        if self.due is not None:
            data["due"] = int(self.due.total_seconds())
        if self.on_due is not None:
            data["on_due"] = self.on_due
        if self.reminders:
            data["reminders"] = sorted(int(r.total_seconds()) for r in self.reminders)
        if self.require_version_stability:
            data["require_version_stability"] = True
        if self.subject_version is not None:
            data["subject_version_name"] = self.subject_version_name
        return data

    def snapshot(self) -> dict[str, Any]:
        """The JSON a task row stores in ``decisions_snapshot_json``.

        ``{"<decision>": {"next": "<step>", "payloadSchema": {...}}}``, with
        ``payloadSchema`` only when the decision has a schema (the reference's
        snapshot stores it only when present). A private copy.
        """
        result: dict[str, Any] = {}
        for name, decision in self.decisions.items():
            entry: dict[str, Any] = {"next": decision.next}
            if decision.schema is not None:
                entry["payloadSchema"] = copy.deepcopy(decision.schema)
            result[name] = entry
        return result

    def subject_version_of(self, state: Any, ctx: Any) -> int | str | None:
        """The version of the subject under review now, or None without ``subject_version``.

        The engine records it when the task opens and compares it when a
        completion arrives (``require_version_stability``). Anything but an
        int or a str (a bool included) raises ``TypeError`` naming the
        field, never the value.
        """
        if self.subject_version is None:
            return None
        value = call_with_state(self.subject_version, state, ctx)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(
                f"subject_version must return an int or a str, not {type(value).__name__}"
            )
        return value

    # -- completion payloads ------------------------------------------------

    @functools.cached_property
    def _validators(self) -> dict[str, Validator]:
        from jsonschema import Draft202012Validator

        return {
            name: Draft202012Validator(decision.schema)
            for name, decision in self.decisions.items()
            if decision.schema is not None
        }

    def check_payload(self, decision: str, payload: Any, *, what: str = "task") -> None:
        """Refuse an undeclared decision or a payload failing the decision's schema.

        ``WorkflowValidationError`` whose message names the JSON path and the
        failed keyword, never the value (the style of ``Plan._check``).
        ``what`` names the task in the message (e.g. ``"task 'review' of
        workflow 'expense-approval'"``).
        """
        if decision not in self.decisions:
            raise WorkflowValidationError(
                f"{what} declares no decision {str(decision)[:64]!r} "
                f"(declared: {', '.join(repr(n) for n in sorted(self.decisions))})"
            )
        validator = self._validators.get(decision)
        failure = None if validator is None else schema_failure(validator, payload)
        if failure is not None:
            raise WorkflowValidationError(
                f"payload of decision {decision!r} of {what} does not match its schema {failure}"
            )


def _check_name(value: Any, field_name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"{field_name} must be a user or group name (str), not {type(value).__name__}"
        )
    if not value or len(value) > MAX_PERSON_NAME_LENGTH or value != value.strip():
        raise TypeError(
            f"{field_name} must be a non-empty name of at most {MAX_PERSON_NAME_LENGTH} "
            "characters without outer spaces"
        )
    return value


def _name_list(value: Any, field_name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise TypeError(f"{field_name} must be a list of names, not {type(value).__name__}")
    names: list[str] = []
    for item in value:
        name = _check_name(item, f"each of {field_name}")
        if name not in names:
            names.append(name)
    return names


def resolve_people(spec: TaskSpec, state: Any, ctx: Any) -> tuple[str | None, list[str], list[str]]:
    """Who a task opened now goes to: ``(assignee, candidate_users, candidate_groups)``.

    Literal names are used as declared; callables are called with the state
    (and ``ctx`` when they take it). A callable may return ``None`` (nobody
    for that field). A wrong return -- a non-string assignee, a bare string
    or a non-list for candidates, an empty or over-long name -- raises
    ``TypeError`` naming the field, never the value. Duplicates are dropped,
    order kept. All three may come out empty: such a task can still be
    completed by a user with the task permission.
    """
    assignee = spec.assignee
    if callable(assignee):
        assignee = call_with_state(assignee, state, ctx)
    if assignee is not None:
        assignee = _check_name(assignee, "assignee")
    lists: list[list[str]] = []
    for field_name in ("candidate_users", "candidate_groups"):
        value = getattr(spec, field_name)
        if callable(value):
            value = call_with_state(value, state, ctx)
        lists.append(_name_list(value, field_name))
    return assignee, lists[0], lists[1]
