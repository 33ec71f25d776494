"""Tokens: where the instance stands, and where each of its branches stands.

The instance has one token of its own (its ``current_step``); a fork adds a
**branch token** per branch, each with its own step, status and state (a
copy of the instance state at the fork, plus the fan-out item). A branch
ends when it reaches its fork's join (it *arrives*) or a ``fail`` step; the
join's policy decides when the token that forked goes on. Branch tokens of
a fork inside a branch are keyed by ``scoped_key(fork, parent token id)``,
so nested forks and fan-outs of forks never share a key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LIVE", "JoinView", "Token", "scoped_key", "split_key"]

LIVE = frozenset({"RUNNING", "WAITING", "RETRY_SCHEDULED"})
SEPARATOR = "@"


def scoped_key(step_id: str, parent_token_id: Any = None) -> str:
    """The fork (or join) key of a step: plain at the top, ``step@parent`` inside a branch."""
    if parent_token_id is None:
        return step_id
    return f"{step_id}{SEPARATOR}{uuid.UUID(str(parent_token_id))}"


def split_key(key: str) -> tuple[str, str | None]:
    """The inverse of :func:`scoped_key`: (step id, parent token id as text, or None).

    Only a suffix that is a token id (a UUID) scopes the key, so a step id
    that itself holds ``@`` stays whole at the top.
    """
    step_id, separator, parent = key.rpartition(SEPARATOR)
    if separator and step_id:
        try:
            return step_id, str(uuid.UUID(parent))
        except ValueError:
            pass
    return key, None


@dataclass(frozen=True)
class Token:
    """A branch token as stored: ``state`` is the branch's own state JSON."""

    id: Any
    fork_key: str
    branch_id: str
    status: str
    current_step: str | None
    state: dict[str, Any] | None
    item: Any = None

    @property
    def fork_step(self) -> str:
        return split_key(self.fork_key)[0]

    @property
    def parent_id(self) -> str | None:
        return split_key(self.fork_key)[1]

    @property
    def live(self) -> bool:
        return self.status in LIVE


@dataclass(frozen=True)
class JoinView:
    """A join's progress as stored: the arrivals so far, in order."""

    join_key: str
    fork_key: str
    expected: int
    arrived: tuple[dict[str, Any], ...] = ()
    decided: bool = False


@dataclass
class Progress:
    """A join's progress during a drive (mutable copy of a ``JoinView``)."""

    join_key: str
    fork_key: str
    expected: int
    arrived: list[dict[str, Any]] = field(default_factory=list)
    decided: bool = False
