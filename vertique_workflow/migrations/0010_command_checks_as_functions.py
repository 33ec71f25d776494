"""0010: the three checks of ``workflow_commands`` call functions (issue 14).

PostgreSQL keeps a table's CHECK expressions as the text of their node trees
and, for every statement that writes the table, reads each back
(``stringToNode``), folds and compiles it again: nothing of it is kept from
one execution to the next. A claim and a segment's settlement each update a
command, so a drain paid for the three checks twice an instance, and a
constant's bytes are stored one number each, so the admitted values were
most of that text even after 0006 and 0009 (about 38,000 instructions a
check). Here each check calls a PL/pgSQL function that holds the admitted
values: the stored expression is one function call on the columns, and
PL/pgSQL compiles the function's expression once per session and sets it up
once per transaction. Measured with callgrind on a one-thread drain: the
checks cost 48,000 instructions each before (read back, folded, compiled and
run), 25,000 after (the call's text read back, the function run); about
110,000 instructions less an instance, -4 % (docs/performance.md).

Same constraint names, same verdicts (the functions return what the checks
returned, NULL included, and a refusal is still a check violation of the
named constraint), the same values as the model's conditions. The functions
are ``IMMUTABLE``: their result depends on their arguments only, as a
check's must. They live in the workflow schema when one is configured, next
to the table. Adding the constraints validates the existing rows under the
table's ACCESS EXCLUSIVE lock, as 0006 and 0009 did: on a very large command
log expect one scan of it.

Django's model state is unchanged. Reversing restores 0009's checks, then
drops the functions.
"""

import importlib

from django.db import migrations

from vertique_workflow import tables

_0006 = importlib.import_module("vertique_workflow.migrations.0006_command_checks_as_constants")
_0009 = importlib.import_module("vertique_workflow.migrations.0009_command_writes_cheaper")

COMMANDS = tables.sql_names()["commands"]
STATE_ADMITTED = tables.qualified_object("workflow_command_state_admitted")
KIND_ADMITTED = tables.qualified_object("workflow_command_kind_admitted")
TIMER_KIND_ADMITTED = tables.qualified_object("workflow_command_timer_kind_admitted")


def function(name: str, arguments: str, condition: str) -> str:
    return f"""
CREATE FUNCTION {name}({arguments}) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN {condition};
END
$$"""


FUNCTIONS = [
    function(STATE_ADMITTED, "state text", f"state = ANY ({_0006.constant(_0006.STATES)})"),
    function(KIND_ADMITTED, "kind text", f"kind = ANY ({_0006.constant(_0006.KINDS)})"),
    # 0009's one comparison of two truth values
    function(
        TIMER_KIND_ADMITTED,
        "kind text, timer_kind text",
        "(kind = 'TIMER') = (timer_kind IS NOT NULL)"
        f" AND timer_kind = ANY ({_0006.constant(_0006.TIMER_KINDS)})",
    ),
]
DROP_FUNCTIONS = (
    f"DROP FUNCTION {STATE_ADMITTED}(text), {KIND_ADMITTED}(text),"
    f" {TIMER_KIND_ADMITTED}(text, text)"
)

AS_FUNCTIONS = _0006.replace(
    f"{STATE_ADMITTED}(state)", f"{KIND_ADMITTED}(kind)", f"{TIMER_KIND_ADMITTED}(kind, timer_kind)"
)
# 0006's state and kind checks, then 0009's timer check
AS_0009_LEFT_THEM = [_0006.AS_CONSTANTS, _0009.ONE_COMPARISON]


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0009_command_writes_cheaper"),
    ]

    operations = [
        # bound the wait for the table's lock, as 0006, 0008 and 0009 do (docs/migrations.md)
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.RunSQL(FUNCTIONS, DROP_FUNCTIONS),
        migrations.RunSQL(AS_FUNCTIONS, AS_0009_LEFT_THEM),
    ]
