"""0014: the command's ``state`` and ``kind`` are domains that hold their checks (issue 14).

PostgreSQL reads a table's CHECK expressions back from their stored text and
compiles them again on every statement that writes the table (0006, 0009 and
0010 made that cheaper, but a claim and a settlement still paid for all three
checks of ``workflow_commands``: about 26,000 instructions a check, on both
updates of every command). A domain's checks are read once per session and
kept parsed in PostgreSQL's type cache, and they run only when a value of the
domain is written, that is when a statement assigns the column: a claim or a
settlement sets ``state`` and never ``kind``. So ``state`` becomes the domain
``workflow_command_state`` and ``kind`` the domain ``workflow_command_kind``,
each ``varchar(16)`` with the check that was the table's, under the same
name; the two functions of 0010 that held those checks go. The timer-kind
check spans two columns and stays a check of the table (0010's function).
Measured with callgrind on a one-thread drain: about 72,000 backend
instructions less a 3-action instance, -2.9 % of the drain's backend, and
about 37,000 less a start, -4.1 % (docs/performance.md).

Same admitted values, same NULL behaviour (the columns are NOT NULL), and a
refused value is still a check violation (SQLSTATE 23514) whose constraint
name is ``workflow_commands_state_check`` or ``workflow_commands_kind_check``;
its message names the domain instead of the table. Readers see the same text
(a domain over ``varchar`` compares, sorts and indexes as its base type).

PostgreSQL refuses to change the type of a column that a trigger's definition
names, so the notify trigger is removed first and installed again after (as
0012 and 0013 do, in the migration's transaction: no command is written
without it). The domains are created without their checks, so the columns
take them without a rewrite of the table; PostgreSQL still rebuilds the three
partial indexes whose predicates name ``state``, and adding each check scans
the table once, all under the table's ACCESS EXCLUSIVE lock (30-second lock
timeout for the wait): on a very large command log expect five passes over it
while writers wait. The domains live in the workflow schema when one is
configured, next to the table.

Django's model state does not change: the model's conditions stay the rule of
``Model.validate_constraints``. A later ``AlterField`` of ``state`` or ``kind``
would turn the column back into a plain ``varchar`` without its check; change
them with a migration like this one. Reversing restores 0010's functions and
checks, then drops the domains.
"""

import importlib

from django.db import migrations

from vertique_workflow import tables
from vertique_workflow.migrations._notify_trigger import reinstall_notify_trigger

_0006 = importlib.import_module("vertique_workflow.migrations.0006_command_checks_as_constants")
_0010 = importlib.import_module("vertique_workflow.migrations.0010_command_checks_as_functions")

COMMANDS = tables.sql_names()["commands"]
STATE = tables.qualified_object("workflow_command_state")
KIND = tables.qualified_object("workflow_command_kind")

TO_DOMAINS = [
    f"CREATE DOMAIN {STATE} AS varchar(16)",
    f"CREATE DOMAIN {KIND} AS varchar(16)",
    f"""
ALTER TABLE {COMMANDS}
    DROP CONSTRAINT workflow_commands_state_check,
    DROP CONSTRAINT workflow_commands_kind_check,
    ALTER COLUMN state TYPE {STATE},
    ALTER COLUMN kind TYPE {KIND}
""",
    f"ALTER DOMAIN {STATE} ADD CONSTRAINT workflow_commands_state_check"
    f" CHECK (VALUE::text = ANY ({_0006.constant(_0006.STATES)}))",
    f"ALTER DOMAIN {KIND} ADD CONSTRAINT workflow_commands_kind_check"
    f" CHECK (VALUE::text = ANY ({_0006.constant(_0006.KINDS)}))",
    f"DROP FUNCTION {_0010.STATE_ADMITTED}(text), {_0010.KIND_ADMITTED}(text)",
]

# 0010's two functions and the checks that call them, then no domains
FROM_DOMAINS = [
    *_0010.FUNCTIONS[:2],
    f"""
ALTER TABLE {COMMANDS}
    ALTER COLUMN state TYPE varchar(16),
    ALTER COLUMN kind TYPE varchar(16),
    ADD CONSTRAINT workflow_commands_state_check CHECK ({_0010.STATE_ADMITTED}(state)),
    ADD CONSTRAINT workflow_commands_kind_check CHECK ({_0010.KIND_ADMITTED}(kind))
""",
    f"DROP DOMAIN {STATE}, {KIND}",
]


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0013_notify_trigger_ignore_inline"),
    ]

    # bounded lock wait; the trigger removed, the columns changed, the trigger added
    operations = reinstall_notify_trigger([migrations.RunSQL(TO_DOMAINS, FROM_DOMAINS)])
