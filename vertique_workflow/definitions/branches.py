"""Parallel branches and child workflows: the specs of ``fork``, ``join`` and ``call`` steps.

A ``ForkSpec``, ``JoinSpec`` or ``CallSpec`` is the definition side of its
step: frozen data the plan hash covers (callables by name, never by code).
The pure helpers here are the rules the engine applies when a token reaches
such a step -- ``branches_of`` (which branches a fork starts),
``join_outcome`` (has the join decided, failed, or must it wait) and
``call_payload`` (the child's start payload). Nothing here touches the
database or the settings, so the engine stays replayable in memory.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..payloads import json_copy
from .names import FrozenMap, callable_name
from .tasks import call_with_state

if TYPE_CHECKING:
    from .plan import Step

__all__ = [
    "BRANCH_ID_RULE",
    "DEFAULT_MAX_BRANCHES",
    "MAX_BRANCHES_LIMIT",
    "BranchListError",
    "BranchResult",
    "CallSpec",
    "ChildResult",
    "ForkSpec",
    "JoinOutcome",
    "JoinPolicy",
    "JoinSpec",
    "branches_of",
    "call_payload",
    "is_branch_id",
    "join_outcome",
]

#: How many branches a fan-out starts at most unless its ``max_branches`` says otherwise.
DEFAULT_MAX_BRANCHES = 1000
#: The largest ``max_branches`` a fork may declare: one segment creates every branch token.
MAX_BRANCHES_LIMIT = 10_000

_BRANCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
BRANCH_ID_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or a digit"

JoinPolicy = Literal["all", "any"] | int
JoinOutcome = Literal["WAIT", "DECIDED", "FAILED"]


def is_branch_id(value: Any) -> bool:
    """Whether ``value`` is a valid branch id (``BRANCH_ID_RULE``).

    Branch ids address signals (``wf.signal(..., branch=...)``), appear in
    admin URLs and log lines and are stored in ``branch_id`` columns, so
    they are short, plain names: no spaces, slashes or quotes.
    """
    return isinstance(value, str) and _BRANCH_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class ForkSpec:
    """What a ``fork`` step starts: fixed branches, or one branch per item of a list.

    - ``join``: the id of the ``join`` step that ends the branches.
    - Fixed: ``branches`` maps each branch id to the id of its first step
      (declaration order is the order the branches start in).
    - Fan-out: ``each`` is the name of a state field holding a JSON list,
      or a callable ``(state)`` / ``(state, ctx)`` returning a list;
      ``start`` is the first step of every branch; ``key`` an optional
      callable ``(item) -> str`` giving each branch its id (else the
      item's index); ``max_branches`` bounds the list.

    ``each_name``/``key_name`` default to the callables' ``module.qualname``;
    the plan hash covers these names, never the code.
    """

    join: str
    branches: Mapping[str, str] = field(default_factory=FrozenMap)
    each: str | Callable[..., Any] | None = None
    start: str | None = None
    key: Callable[..., Any] | None = None
    max_branches: int = DEFAULT_MAX_BRANCHES
    each_name: str | None = None
    key_name: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        if isinstance(self.branches, Mapping):
            put(self, "branches", FrozenMap(self.branches))
        if callable(self.each) and self.each_name is None:
            put(self, "each_name", callable_name(self.each))
        if self.key is not None and self.key_name is None:
            put(self, "key_name", callable_name(self.key))

    @property
    def fan_out(self) -> bool:
        """True for one branch per item of a list (``each``), False for fixed branches."""
        return self.each is not None

    def first_steps(self) -> list[tuple[str, str]]:
        """``(what, step id)`` of each first step a branch may start at, for validation."""
        if self.fan_out:
            return [] if self.start is None else [("start", self.start)]
        return [(f"branch {branch!r}", first) for branch, first in self.branches.items()]

    def canonical(self) -> dict[str, Any]:
        """The hashed structure: fixed branches sorted by id, callables by name.

        Fields at their default are left out (``max_branches`` too).
        """
        data: dict[str, Any] = {"join": self.join}
        if self.branches:
            data["branches"] = dict(sorted(self.branches.items()))
        if isinstance(self.each, str):
            data["each"] = self.each
        elif self.each is not None:
            data["each_name"] = self.each_name
        if self.start is not None:
            data["start"] = self.start
        if self.key is not None:
            data["key_name"] = self.key_name
        if self.max_branches != DEFAULT_MAX_BRANCHES:
            data["max_branches"] = self.max_branches
        return data


@dataclass(frozen=True)
class JoinSpec:
    """How a ``join`` step decides: its policy, the merge, and where a failed join goes.

    - ``policy``: ``"all"`` (every branch completed), ``"any"`` (the first
      completed branch decides) or an int ``n`` (``n`` completed branches).
    - ``merge``: a callable ``(state, results, ctx) -> state`` folding the
      branch results (branch id -> ``BranchResult``) into the state the
      instance had at the fork; without it that state goes on unchanged.
    - ``on_failed``: where the instance goes when the policy can no longer
      be met; without it the instance fails.

    The join's ``next`` is the step's own ``Step.next``.
    """

    policy: JoinPolicy = "all"
    merge: Callable[..., Any] | None = None
    on_failed: str | None = None
    merge_name: str | None = None

    def __post_init__(self) -> None:
        if self.merge is not None and self.merge_name is None:
            object.__setattr__(self, "merge_name", callable_name(self.merge))

    def needed(self, expected: int) -> int:
        """How many completed branches decide the join when ``expected`` branches run."""
        if self.policy == "all":
            return expected
        if self.policy == "any":
            return 1
        return int(self.policy)

    def canonical(self) -> dict[str, Any]:
        """The hashed structure: the policy as given, the merge by name, ``on_failed``."""
        data: dict[str, Any] = {"policy": self.policy}
        if self.merge is not None:
            data["merge_name"] = self.merge_name
        if self.on_failed is not None:
            data["on_failed"] = self.on_failed
        return data


@dataclass(frozen=True)
class CallSpec:
    """What a ``call`` step starts: a child workflow, and where its outcome leads.

    - ``workflow``: the child's definition id; ``version``: a pinned
      version, or None for the latest the node has.
    - ``payload``: a callable ``(state)`` / ``(state, ctx)`` returning the
      child's start payload (a JSON object); without it the child starts
      with ``{}``.
    - ``on_completed``: where the parent goes when the child completes;
      ``on_failed``: where it goes when the child ends any other way
      (without it the parent fails).
    - ``result``: a callable ``(state, child, ctx) -> state`` folding the
      ``ChildResult`` into the parent's state; without it the state is
      unchanged.
    """

    workflow: str
    on_completed: str | None = None
    on_failed: str | None = None
    version: int | None = None
    payload: Callable[..., Any] | None = None
    result: Callable[..., Any] | None = None
    payload_name: str | None = None
    result_name: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        if self.payload is not None and self.payload_name is None:
            put(self, "payload_name", callable_name(self.payload))
        if self.result is not None and self.result_name is None:
            put(self, "result_name", callable_name(self.result))

    def canonical(self) -> dict[str, Any]:
        """The hashed structure: target and transitions, callables by name."""
        data: dict[str, Any] = {"workflow": self.workflow}
        if self.version is not None:
            data["version"] = self.version
        if self.on_completed is not None:
            data["on_completed"] = self.on_completed
        if self.on_failed is not None:
            data["on_failed"] = self.on_failed
        if self.payload is not None:
            data["payload_name"] = self.payload_name
        if self.result is not None:
            data["result_name"] = self.result_name
        return data


@dataclass(frozen=True)
class BranchResult:
    """How one branch ended, as a join's ``merge`` sees it.

    ``status`` is ``"COMPLETED"`` (the branch reached its join) or
    ``"FAILED"``; ``state`` the branch's own state when it ended (a private
    copy); ``error`` the reason code of a failed branch (never a message).
    """

    status: Literal["COMPLETED", "FAILED"]
    state: Any = None
    error: str | None = None


@dataclass(frozen=True)
class ChildResult:
    """How a called child workflow ended, as a call's ``result`` sees it.

    ``status`` is the child instance's ended status (``"COMPLETED"``,
    ``"FAILED"``, ``"CANCELLED"``, ...); ``state`` its final state JSON;
    ``error_type`` its reason code when it did not complete.
    """

    status: str
    state: Any = None
    error_type: str | None = None


class BranchListError(ValueError):
    """A fan-out list the fork cannot start branches for; ``reason_code`` says why.

    ``TOO_MANY_BRANCHES`` (more items than ``max_branches``),
    ``BRANCH_KEY_INVALID`` (a key that is not a valid branch id) or
    ``BRANCH_KEY_DUPLICATE`` (two items with one key). Retrying cannot help:
    the engine fails the command non-retryably with the reason code. The
    message names the step and item indexes, never a value.
    """

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


def _items_of(step: Step, spec: ForkSpec, state: Any, ctx: Any) -> list[Any]:
    what = f"fork step {step.id!r}"
    if isinstance(spec.each, str):
        name = spec.each
        if isinstance(state, Mapping):
            if name not in state:
                raise TypeError(f"{what}: the state has no field {name!r} to fan out over")
            items = state[name]
        elif dataclasses.is_dataclass(state) and hasattr(state, name):
            items = getattr(state, name)
        else:
            raise TypeError(f"{what}: the state has no field {name!r} to fan out over")
        if not isinstance(items, list):
            raise TypeError(
                f"{what}: state field {name!r} must hold a list, not {type(items).__name__}"
            )
    else:
        assert spec.each is not None, "validation requires each for a fan-out"
        items = call_with_state(spec.each, state, ctx)
        if not isinstance(items, list | tuple):
            raise TypeError(f"{what}: each must return a list, not {type(items).__name__}")
    if len(items) > spec.max_branches:
        raise BranchListError(
            "TOO_MANY_BRANCHES",
            f"{what}: the list has {len(items)} items, more than max_branches "
            f"({spec.max_branches})",
        )
    try:
        return [
            json_copy(item, f"item {index}", error=TypeError) for index, item in enumerate(items)
        ]
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None


def _key_of(step: Step, spec: ForkSpec, index: int, item: Any) -> str:
    if spec.key is None:
        return str(index)
    key = spec.key(item)
    what = f"key of fork step {step.id!r} for item {index}"
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, not {type(key).__name__}")
    if not is_branch_id(key):
        raise BranchListError("BRANCH_KEY_INVALID", f"{what} is not {BRANCH_ID_RULE}")
    return key


def branches_of(step: Step, state: Any, ctx: Any) -> list[tuple[str, str, Any]]:
    """The branches a fork step entered now starts: ``(branch id, first step, item)``.

    Fixed branches come in declaration order with item ``None``. A fan-out
    yields one branch per item, in list order, each with a private JSON
    copy of its item and the id ``str(index)`` or ``key(item)``. Raises
    ``TypeError`` naming the step (never a value) when ``each`` does not
    give a list, an item is not JSON or a key is not a str, and
    ``BranchListError`` for too many items or a bad or duplicate key.
    """
    spec = step.fork
    if step.kind != "fork" or not isinstance(spec, ForkSpec):
        raise TypeError(f"step {step.id!r} is a {step.kind} step, not a fork")
    if not spec.fan_out:
        return [(branch, first, None) for branch, first in spec.branches.items()]
    assert spec.start is not None, "validation requires start for a fan-out"
    found: list[tuple[str, str, Any]] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(_items_of(step, spec, state, ctx)):
        branch = _key_of(step, spec, index, item)
        if branch in seen:
            raise BranchListError(
                "BRANCH_KEY_DUPLICATE",
                f"key of fork step {step.id!r} gives items {seen[branch]} and {index} "
                "the same branch id",
            )
        seen[branch] = index
        found.append((branch, spec.start, item))
    return found


def join_outcome(step: Step, expected: int, results: Mapping[str, BranchResult]) -> JoinOutcome:
    """The one rule of a join policy: ``"DECIDED"``, ``"FAILED"`` or ``"WAIT"``.

    ``expected`` is how many branches the fork started; ``results`` holds
    the branches that have ended so far. The join decides once the policy's
    number of branches completed (all of them, one, or ``n``), and fails
    once too many failed for that ever to happen. A fan-out over an empty
    list decides an ``"all"`` join at once and fails the others.
    """
    spec = step.join
    if step.kind != "join" or not isinstance(spec, JoinSpec):
        raise TypeError(f"step {step.id!r} is a {step.kind} step, not a join")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise ValueError(f"join step {step.id!r}: expected must be a count of branches")
    if len(results) > expected:
        raise ValueError(
            f"join step {step.id!r}: {len(results)} branch results for {expected} branches"
        )
    completed = failed = 0
    for result in results.values():
        if result.status == "COMPLETED":
            completed += 1
        elif result.status == "FAILED":
            failed += 1
        else:
            raise ValueError(f"join step {step.id!r}: a branch result has an unknown status")
    needed = spec.needed(expected)
    if completed >= needed:
        return "DECIDED"
    if expected - failed < needed:
        return "FAILED"
    return "WAIT"


def call_payload(step: Step, state: Any, ctx: Any) -> dict[str, Any]:
    """The start payload of the child a call step starts now: a private JSON object.

    ``{}`` without a ``payload`` callable. A callable returning anything
    but a dict, or a dict JSON cannot store, raises ``TypeError`` naming the
    step and the path, never the value.
    """
    spec = step.call
    if step.kind != "call" or not isinstance(spec, CallSpec):
        raise TypeError(f"step {step.id!r} is a {step.kind} step, not a call")
    if spec.payload is None:
        return {}
    value = call_with_state(spec.payload, state, ctx)
    if not isinstance(value, dict):
        raise TypeError(
            f"payload of call step {step.id!r} must return a dict, not {type(value).__name__}"
        )
    try:
        result: dict[str, Any] = json_copy(value, "payload", error=TypeError)
    except TypeError as exc:
        raise TypeError(f"call step {step.id!r}: {exc}") from None
    return result
