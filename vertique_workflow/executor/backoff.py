"""Retry delays: exponential with jitter, per step policy over the settings defaults.

With the defaults (``MAX_ATTEMPTS`` 10, ``BACKOFF_BASE_MS`` 1 s,
``BACKOFF_MAX_MS`` 2 min) the nine waits between ten attempts are at most
1 + 2 + 4 + 8 + 16 + 32 + 64 + 120 + 120 = 367 s and, with the jitter factor
in [0.5, 1], at least half of it: a step that keeps failing is dead-lettered
3 to 6 minutes after its first failure, so an outage of a few minutes is
ridden out. Transient database failures (deadlock, lock timeout, lost
connection, the segment deadline) restore their attempt and back off by
their own count (``transient_count``) in SQL, with the same base and cap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..conf import workflow_settings
from ..definitions.retry import RetryPolicy

JITTER_MIN = 0.5


@dataclass(frozen=True)
class Effective:
    """A policy with the settings filled in: what the executor applies to a failure."""

    max_attempts: int
    initial_ms: int
    max_ms: int
    policy: RetryPolicy | None = None

    def delay_seconds(self, attempt: int) -> float:
        """The wait after the ``attempt``-th failed attempt (1-based), with jitter."""
        base = min(self.max_ms, self.initial_ms * 2 ** max(attempt - 1, 0))
        return base * random.uniform(JITTER_MIN, 1.0) / 1000.0

    def never_retried(self, exc: BaseException) -> bool:
        return self.policy is not None and self.policy.never_retried(exc)


def effective(policy: RetryPolicy | None) -> Effective:
    """The step's policy over the settings; ``MAX_ATTEMPTS`` bounds every policy."""
    ceiling = int(workflow_settings.MAX_ATTEMPTS)
    initial = int(workflow_settings.BACKOFF_BASE_MS)
    maximum = int(workflow_settings.BACKOFF_MAX_MS)
    if policy is None:
        return Effective(ceiling, initial, maximum)
    if policy.initial_backoff_ms is not None:
        initial = policy.initial_backoff_ms
    if policy.max_backoff_ms is not None:
        maximum = policy.max_backoff_ms
    attempts = min(policy.max_attempts or ceiling, ceiling)
    return Effective(attempts, initial, max(initial, maximum), policy)


__all__ = ["Effective", "effective"]
