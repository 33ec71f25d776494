"""The execution probe: is there work in flight or claimable now, and what is stuck?

Plain reads of the command log with the database clock: they run on a
connection of their own in autocommit, so they open no transaction on the
caller's connection, take no lock and see committed state only (a start
recorded in the caller's still-open transaction is not seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conf import workflow_settings
from .store import probe as reads


@dataclass(frozen=True)
class ProbeReport:
    """Lists of at most 1000 commands each, ordered by instance id then sequence.

    ``in_flight``: claimed under a live lease. ``claimable``: an executor could
    claim it now. ``deferred``: DEFERRED and not claimable. ``parked``: signals
    waiting for a wait that accepts them. ``waiting``: other PENDING or CLAIMED
    commands that are not claimable (behind their queue head, or backing off).
    ``stuck``: DEAD, or open longer than STUCK_AFTER_SECONDS since first
    available (a command may be in ``stuck`` and in its state's list).
    """

    idle: bool
    now: Any
    in_flight: list[dict[str, Any]]
    claimable: list[dict[str, Any]]
    deferred: list[dict[str, Any]]
    parked: list[dict[str, Any]]
    waiting: list[dict[str, Any]]
    stuck: list[dict[str, Any]]


def is_idle(instance_id: Any = None, *, on_caller_connection: bool = False) -> bool:
    """True when no command (of the instance, or at all) is in flight or claimable now.

    ``on_caller_connection=True`` reads on the caller's connection and inside
    its open transaction instead (for tests wrapped in one transaction, which
    must see their own uncommitted rows; see docs/testing.md).
    """
    return reads.idle(instance_id, on_caller_connection=on_caller_connection)[0]


def report(instance_id: Any = None, *, on_caller_connection: bool = False) -> ProbeReport:
    idle, now = reads.idle(instance_id, on_caller_connection=on_caller_connection)
    lists = reads.lists(
        instance_id,
        workflow_settings.STUCK_AFTER_SECONDS,
        on_caller_connection=on_caller_connection,
    )
    return ProbeReport(idle=idle, now=now, **lists)
