"""Retry policies: how often a step that raises is run again, and how long apart.

A step's policy is part of its plan (and of the plan hash): changing how a
step is retried is a change of the definition that running instances see
only in a new version. A step without a policy uses the settings
``MAX_ATTEMPTS``, ``BACKOFF_BASE_MS`` and ``BACKOFF_MAX_MS``; a policy sets
any of them for its step, and names exception classes that are never
retried (the command fails at once, like ``NonRetryable``).

The n-th failed attempt waits ``min(max, initial * 2**(n-1))`` scaled by a
random factor in [0.5, 1] (jitter, so instances that failed together do not
come back together). The executor dead-letters a command whose failing step
has spent its attempts; ``MAX_ATTEMPTS`` stays the upper bound of every
policy, because the claim dead-letters a command that reaches it whatever
its step (a crashed executor's claims count too).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import WorkflowDefinitionError
from .durations import parse_duration

__all__ = ["Retry", "RetryPolicy"]

MAX_POLICY_ATTEMPTS = 1000


def _ms(value: str | datetime.timedelta | None, what: str) -> int | None:
    if value is None:
        return None
    try:
        delta = parse_duration(value)
    except WorkflowDefinitionError as exc:
        raise WorkflowDefinitionError(f"retry {what}: {exc}") from None
    return int(delta.total_seconds() * 1000)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class RetryPolicy:
    """A step's retry policy; ``None`` fields fall back to the settings."""

    max_attempts: int | None = None
    initial_backoff_ms: int | None = None
    max_backoff_ms: int | None = None
    never: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= MAX_POLICY_ATTEMPTS
        ):
            raise WorkflowDefinitionError(
                f"retry max_attempts must be an integer from 1 to {MAX_POLICY_ATTEMPTS}"
            )
        if (
            self.initial_backoff_ms is not None
            and self.max_backoff_ms is not None
            and self.initial_backoff_ms > self.max_backoff_ms
        ):
            raise WorkflowDefinitionError("retry backoff must not exceed max_backoff")
        never = tuple(self.never)
        for cls in never:
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                raise WorkflowDefinitionError(
                    "retry never= takes exception classes (subclasses of Exception)"
                )
        object.__setattr__(self, "never", never)

    def canonical(self) -> dict[str, Any]:
        """The hashed form: the fields set, exception classes by dotted name, sorted."""
        data: dict[str, Any] = {}
        if self.max_attempts is not None:
            data["max_attempts"] = self.max_attempts
        if self.initial_backoff_ms is not None:
            data["initial_backoff_ms"] = self.initial_backoff_ms
        if self.max_backoff_ms is not None:
            data["max_backoff_ms"] = self.max_backoff_ms
        if self.never:
            data["never"] = sorted(_class_name(cls) for cls in self.never)
        return data

    def never_retried(self, exc: BaseException) -> bool:
        return isinstance(exc, self.never)


def Retry(  # reads as a declaration in a step: retry=Retry(...)
    *,
    max_attempts: int | None = None,
    backoff: str | datetime.timedelta | None = None,
    max_backoff: str | datetime.timedelta | None = None,
    never: tuple[type[BaseException], ...] | list[type[BaseException]] = (),
) -> RetryPolicy:
    """A step's retry policy: ``@action(next="x", retry=Retry(max_attempts=3, backoff="10s"))``.

    ``backoff`` is the first delay, ``max_backoff`` its cap (readable
    durations such as ``"30s"`` or ``"5m"``); ``never`` lists exception
    classes that fail the command at once instead of being retried.
    """
    return RetryPolicy(
        max_attempts=max_attempts,
        initial_backoff_ms=_ms(backoff, "backoff"),
        max_backoff_ms=_ms(max_backoff, "max_backoff"),
        never=tuple(never),
    )
