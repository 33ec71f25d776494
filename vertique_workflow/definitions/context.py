"""What a step callback may know about the run it belongs to."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["StepContext"]


@dataclass(frozen=True)
class StepContext:
    """Read-only facts about the instance and the command driving a step.

    Callbacks receive it instead of the instance row so they cannot change
    engine bookkeeping; it is rebuilt for every step, so it is cheap and
    immutable. ``signal_name``/``signal_payload`` are set while a signal is
    being applied; ``actor`` is whoever recorded the command, when known.
    In a step of a branch, ``fork_step_id`` and ``branch_id`` name the
    branch, and ``branch_item`` is its item of a fan-out list (a private
    JSON copy; None for a fixed branch). All three are None outside branches.
    """

    instance_id: uuid.UUID
    step_id: str
    definition_id: str
    definition_version: int
    command_id: int | None
    command_kind: str | None
    business_key: str | None
    scope: str
    signal_name: str | None = None
    signal_payload: Any = None
    actor: Any = None
    fork_step_id: str | None = None
    branch_id: str | None = None
    branch_item: Any = None
