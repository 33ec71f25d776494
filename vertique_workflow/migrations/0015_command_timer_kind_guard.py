"""0015: the timer-kind rule of the command log is checked when a write names its columns (issue 14).

``workflow_commands_timer_kind_check`` (``timer_kind`` is set exactly when
``kind`` is ``TIMER``, and then one of four values) spans two columns, so 0014
could not move it onto a domain, and PostgreSQL checks every CHECK of a table
on every UPDATE, whatever the UPDATE sets: a claim and a settlement, which set
``state``, paid about 40,000 instructions each to read the check back from its
text, compile and run it, although neither can change what it judges. Here
the rule is a ``BEFORE INSERT OR UPDATE OF kind, timer_kind`` row trigger of
the same name: PostgreSQL runs it for every inserted row and for every update
whose SET list names either column, which are all the writes that can break
the rule, and not for the others. It refuses exactly what the check refused
(a NULL verdict passes, as a check's does) with the same error: SQLSTATE 23514,
``check_violation``, constraint name ``workflow_commands_timer_kind_check``,
"new row for relation ... violates check constraint ...". Measured with
callgrind on a one-thread drain: about 62,000 backend instructions less a
3-action instance, -2.5 %, and 15,000 less a start, -1.7 % (docs/performance.md).

What a trigger does not give that a check did: ``session_replication_role =
replica`` and ``ALTER TABLE ... DISABLE TRIGGER`` (owner or superuser) skip it,
as they skip the notify trigger the command log already depends on, and
PostgreSQL no longer lists the rule among the table's constraints (the
trigger and its function carry the name). 0010's
``workflow_command_timer_kind_admitted`` goes: the function holds the
condition itself. Dropping the check takes the table's ACCESS EXCLUSIVE lock
(30-second lock timeout) and scans nothing; the reverse adds the check again,
which scans the table once.

Django's model state does not change: the model's condition stays the rule
of ``Model.validate_constraints``. Reversing restores 0010's function and
check, then drops the trigger and its function.
"""

import importlib

from django.db import migrations

from vertique_workflow import tables

_0006 = importlib.import_module("vertique_workflow.migrations.0006_command_checks_as_constants")
_0010 = importlib.import_module("vertique_workflow.migrations.0010_command_checks_as_functions")

COMMANDS = tables.sql_names()["commands"]
NAME = "workflow_commands_timer_kind_check"
GUARD = tables.qualified_object(NAME)

TO_TRIGGER = [
    f"""
CREATE FUNCTION {GUARD}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF ((NEW.kind = 'TIMER') = (NEW.timer_kind IS NOT NULL)
        AND NEW.timer_kind = ANY ({_0006.constant(_0006.TIMER_KINDS)})) IS FALSE THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "{NAME}"',
            TG_TABLE_NAME
            USING ERRCODE = 'check_violation', CONSTRAINT = '{NAME}',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END
$$""",
    f"""
CREATE TRIGGER {NAME} BEFORE INSERT OR UPDATE OF kind, timer_kind ON {COMMANDS}
FOR EACH ROW EXECUTE FUNCTION {GUARD}()""",
    f"ALTER TABLE {COMMANDS} DROP CONSTRAINT {NAME}",
    f"DROP FUNCTION {_0010.TIMER_KIND_ADMITTED}(text, text)",
]

# 0010's function and the check that calls it, then no trigger
FROM_TRIGGER = [
    _0010.FUNCTIONS[2],
    f"ALTER TABLE {COMMANDS} ADD CONSTRAINT {NAME}"
    f" CHECK ({_0010.TIMER_KIND_ADMITTED}(kind, timer_kind))",
    f"DROP TRIGGER {NAME} ON {COMMANDS}",
    f"DROP FUNCTION {GUARD}()",
]


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0014_command_state_and_kind_domains"),
    ]

    operations = [
        # bound the wait for the table's lock, as 0006 to 0014 do (docs/migrations.md)
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.RunSQL(TO_TRIGGER, FROM_TRIGGER),
    ]
