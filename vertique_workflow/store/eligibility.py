"""The one SQL rendering of command eligibility, composed by peek, claim and the probe.

A command is claimable when it is at the head of its instance's queue (no
earlier PENDING, DEFERRED or CLAIMED command blocks, where a timer before its
fire_at and a held-back timer block nothing), is not held back, is
available, and is PENDING, DEFERRED, or CLAIMED under an expired lease.
PARKED, DEAD and settled commands block nothing. Time is the database clock.

Held back: a DUE or REMINDER timer while its task is COMPLETING; a TIMEOUT
timer while a SIGNAL or COMPLETION for its wait, recorded before the
timeout's fire_at, is still active (a timeout converted by 0003 has no
target_json and is held back by any such command of its instance).
"""

from __future__ import annotations

from ..tables import sql_names

T = sql_names()

ACTIVE_STATES = "('PENDING', 'DEFERRED', 'CLAIMED')"


def held_back(c: str) -> str:
    """SQL true when command alias ``c`` is a held-back timer."""
    return f"""({c}.kind = 'TIMER' AND (
        ({c}.timer_kind IN ('DUE', 'REMINDER') AND EXISTS (
            SELECT 1 FROM {T["tasks"]} ht WHERE ht.id = {c}.task_id AND ht.status = 'COMPLETING'))
        OR ({c}.timer_kind = 'TIMEOUT' AND EXISTS (
            SELECT 1 FROM {T["commands"]} hs
            WHERE hs.workflow_id = {c}.workflow_id AND hs.kind IN ('SIGNAL', 'COMPLETION')
              AND hs.state IN {ACTIVE_STATES} AND hs.recorded_at < {c}.fire_at
              AND ({c}.target_json IS NULL
                   OR (hs.kind = 'SIGNAL'
                       AND ({c}.target_json -> 'signalNames') ? (hs.target_json ->> 'name')
                       AND (hs.target_json ->> 'branchId') IS NOT DISTINCT FROM
                           ({c}.target_json ->> 'branchId'))
                   OR (hs.kind = 'COMPLETION' AND hs.task_id = {c}.task_id))))))"""


def at_head(c: str) -> str:
    """SQL true when no earlier active command of the instance blocks ``c``."""
    return f"""NOT EXISTS (
        SELECT 1 FROM {T["commands"]} b
        WHERE b.workflow_id = {c}.workflow_id AND b.seq < {c}.seq
          AND b.state IN {ACTIVE_STATES}
          AND NOT (b.kind = 'TIMER' AND b.fire_at > now())
          AND NOT {held_back("b")})"""


def claimable(c: str) -> str:
    """SQL true when command alias ``c`` can be claimed now."""
    return f"""({c}.state IN {ACTIVE_STATES}
        AND ({c}.state <> 'CLAIMED' OR {c}.lease_until < now())
        AND {c}.available_at <= now()
        AND NOT {held_back(c)}
        AND {at_head(c)})"""
