"""0006: the three CHECK constraints of ``workflow_commands`` with constant arrays (issue 14).

Same names, same admitted values, same NULL behaviour; only the stored
expression changes. Django renders ``state IN ('PENDING', ...)``, which
PostgreSQL stores as an ``ARRAY['PENDING'::varchar, ...]::text[]``
expression: eleven constants and a coercion that PostgreSQL reads back from
its text form, constant-folds and compiles again on every statement that
writes a command (a claim, a segment's settlement, a recording). Measured
with callgrind on a one-thread drain, that was about an eighth of the backend's
instructions. Spelled ``state::text = ANY ('{PENDING,...}'::text[])`` the
array is one constant: less to read, nothing to fold.

Django's model state keeps the ``Q(... __in=...)`` conditions (the rule for
``Model.validate_constraints``); only the database changes, so no later
``makemigrations`` sees a difference. Adding the constraints validates the
existing rows under the table's ACCESS EXCLUSIVE lock: on a very large
command log, expect the migration to scan it once (see docs/migrations.md).
Reversing restores Django's spelling.
"""

from django.db import migrations

from vertique_workflow import tables

COMMANDS = tables.sql_names()["commands"]
STATES = (
    "PENDING",
    "DEFERRED",
    "CLAIMED",
    "PARKED",
    "DEAD",
    "COMPLETE",
    "REJECTED",
    "STALE",
    "FAILED",
    "SUPERSEDED",
    "CANCELLED",
)
KINDS = ("START", "SIGNAL", "COMPLETION", "RETRY", "MIGRATION", "TIMER")
TIMER_KINDS = ("FIRE", "TIMEOUT", "DUE", "REMINDER")


def constant(values: tuple[str, ...]) -> str:
    """One ``text[]`` constant: ``'{A,B}'::text[]`` (the values are plain upper-case words)."""
    return "'{" + ",".join(values) + "}'::text[]"


def listed(values: tuple[str, ...]) -> str:
    """Django's spelling: ``('A', 'B')``."""
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


def replace(state: str, kind: str, timer_kind: str) -> str:
    return f"""
ALTER TABLE {COMMANDS}
    DROP CONSTRAINT workflow_commands_state_check,
    DROP CONSTRAINT workflow_commands_kind_check,
    DROP CONSTRAINT workflow_commands_timer_kind_check,
    ADD CONSTRAINT workflow_commands_state_check CHECK ({state}),
    ADD CONSTRAINT workflow_commands_kind_check CHECK ({kind}),
    ADD CONSTRAINT workflow_commands_timer_kind_check CHECK ({timer_kind})
"""


AS_CONSTANTS = replace(
    f"state::text = ANY ({constant(STATES)})",
    f"kind::text = ANY ({constant(KINDS)})",
    f"(kind::text = 'TIMER' AND timer_kind IS NOT NULL"
    f" AND timer_kind::text = ANY ({constant(TIMER_KINDS)}))"
    " OR (NOT kind::text = 'TIMER' AND timer_kind IS NULL)",
)

AS_DJANGO_RENDERS = replace(
    f'"state" IN {listed(STATES)}',
    f'"kind" IN {listed(KINDS)}',
    f"""("kind" = 'TIMER' AND "timer_kind" IS NOT NULL AND "timer_kind" IN {listed(TIMER_KINDS)})"""
    """ OR (NOT ("kind" = 'TIMER') AND "timer_kind" IS NULL)""",
)


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0005_retention"),
    ]

    operations = [
        # the ALTER TABLE takes ACCESS EXCLUSIVE until the migration commits: bound
        # the wait for it, as 0002 and 0003 do (see docs/migrations.md)
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.RunSQL(AS_CONSTANTS, AS_DJANGO_RENDERS),
    ]
