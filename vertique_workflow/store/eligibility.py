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

from .. import tables
from ..tables import sql_names

T = sql_names()

ACTIVE_STATES = "('PENDING', 'DEFERRED', 'CLAIMED')"

# The held-back rule is a PL/pgSQL function (migration 0011 creates it from
# held_back_function_sql()). PostgreSQL sets up every sub-plan of a statement on
# each execution, also one whose branch never runs: written inline, the rule's two
# EXISTS were four index scans and their conditions set up on every claim, and two
# on every fence, for the TIMER commands only. A function call costs nothing
# until a TIMER row reaches it, and PL/pgSQL keeps its plans for the session. It
# is STABLE, so its queries see the calling statement's snapshot, as the inline
# sub-plans did. A change of the rule is a migration that replaces the function.
HELD_BACK_FUNCTION = "workflow_timer_held_back"


def held_back_function_sql(schema: str | None = tables.SCHEMA) -> str:
    """``CREATE OR REPLACE FUNCTION`` of the held-back rule, its tables in ``schema``.

    True for a DUE or REMINDER timer while its task is COMPLETING, and for a
    TIMEOUT timer while a SIGNAL or COMPLETION for its wait, recorded before
    the timeout's ``fire_at``, is PENDING, DEFERRED or CLAIMED (a timeout
    without ``target_json``, converted by 0003, by any such command of its
    instance); false otherwise. Called for TIMER commands only (``held_back``).
    """
    names = sql_names(schema)
    return f"""
CREATE OR REPLACE FUNCTION {tables.qualified_object(HELD_BACK_FUNCTION, schema)}(
    timer_workflow_id uuid, timer_timer_kind text, timer_task_id uuid,
    timer_fire_at timestamptz, timer_target jsonb
) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF timer_timer_kind IN ('DUE', 'REMINDER') THEN
        RETURN EXISTS (
            SELECT 1 FROM {names["tasks"]} ht
            WHERE ht.id = timer_task_id AND ht.status = 'COMPLETING');
    END IF;
    IF timer_timer_kind = 'TIMEOUT' THEN
        RETURN EXISTS (
            SELECT 1 FROM {names["commands"]} hs
            WHERE hs.workflow_id = timer_workflow_id AND hs.kind IN ('SIGNAL', 'COMPLETION')
              AND hs.state IN {ACTIVE_STATES} AND hs.recorded_at < timer_fire_at
              AND (timer_target IS NULL
                   OR (hs.kind = 'SIGNAL'
                       AND (timer_target -> 'signalNames') ? (hs.target_json ->> 'name')
                       AND (hs.target_json ->> 'branchId') IS NOT DISTINCT FROM
                           (timer_target ->> 'branchId'))
                   OR (hs.kind = 'COMPLETION' AND hs.task_id = timer_task_id)));
    END IF;
    RETURN FALSE;
END
$$"""


def drop_held_back_function_sql(schema: str | None = tables.SCHEMA) -> str:
    """The reverse of :func:`held_back_function_sql`."""
    function = tables.qualified_object(HELD_BACK_FUNCTION, schema)
    return f"DROP FUNCTION {function}(uuid, text, uuid, timestamptz, jsonb)"


_HELD_BACK = tables.qualified_object(HELD_BACK_FUNCTION)


def held_back(c: str) -> str:
    """SQL true when command alias ``c`` is a held-back timer."""
    return (
        f"({c}.kind = 'TIMER' AND {_HELD_BACK}({c}.workflow_id, {c}.timer_kind, {c}.task_id, "
        f"{c}.fire_at, {c}.target_json))"
    )


def at_head(c: str) -> str:
    """SQL true when no earlier active command of the instance blocks ``c``.

    ``OFFSET 0`` keeps it a sub-plan run for the rows that reach it, each an
    index scan of ``(workflow_id, seq)``: flattened into an anti-join, the
    planner read every active command for the claim's one candidate once the
    held-back rule became a function call.
    """
    return f"""NOT EXISTS (
        SELECT 1 FROM {T["commands"]} b
        WHERE b.workflow_id = {c}.workflow_id AND b.seq < {c}.seq
          AND b.state IN {ACTIVE_STATES}
          AND NOT (b.kind = 'TIMER' AND b.fire_at > now())
          AND NOT {held_back("b")}
        OFFSET 0)"""


def claimable(c: str) -> str:
    """SQL true when command alias ``c`` can be claimed now."""
    return f"""({c}.state IN {ACTIVE_STATES}
        AND ({c}.state <> 'CLAIMED' OR {c}.lease_until < now())
        AND {c}.available_at <= now()
        AND NOT {held_back(c)}
        AND {at_head(c)})"""
