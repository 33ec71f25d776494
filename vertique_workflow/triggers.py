"""The commands notify trigger, declared with django-pgtrigger.

A command that becomes PENDING or DEFERRED wakes executors at commit through
``pg_notify('vertique_workflow_commands', <available_at in epoch ms>)``. The
payload names no instance: it is only a hint of when work becomes available.

django-pgtrigger creates its trigger function (and its ignore helper)
unqualified or in ``PGTRIGGER_SCHEMA``. With a placement every workflow object
must live in the workflow schema, so :class:`PlacedTriggerSql` qualifies both
functions with the schema of ``tables.py``; without a placement the SQL is
exactly django-pgtrigger's own.
"""

from __future__ import annotations

from typing import Any

import pgtrigger
from pgtrigger import compiler

from . import tables

NOTIFY_TRIGGER_NAME = "workflow_commands_notify"


# django-pgtrigger's trigger function first asks its helper whether the trigger is
# ignored (``pgtrigger.ignore``). The helper reads the setting inside a block with
# an exception handler, which PL/pgSQL runs as a subtransaction, and the setting is
# unset unless something is being ignored, so every firing began a subtransaction,
# raised "unrecognized configuration parameter" and rolled it back: about 31,000
# backend instructions of a start's 930,000 (callgrind). The test is made inline:
# ``current_setting(..., true)`` answers NULL for an unset setting instead of
# raising, and the trigger's name is looked for as one element of the array text
# ``pgtrigger.ignore()`` sets ("{uri,pgid,...}"), without a cast that could fail.
# (Under a schema placement that text holds a quoted table name, which the
# helper's cast to text[] could not read: its handler swallowed the error and the
# trigger was never ignored there. The inline test finds the name either way.)
PGTRIGGER_IGNORE_CALL = "IF ({ignore_func_name}(TG_NAME) IS TRUE) THEN"
INLINE_IGNORE_TEST = (
    "IF (position(',' || TG_NAME || ',' IN "
    "',' || btrim(current_setting('pgtrigger.ignore', true), '{{}}') || ',') > 0) THEN"
)


class NotifyTriggerSql(compiler.UpsertTriggerSql):
    """pgtrigger's install SQL with the ignore test inline (no helper call, no subtransaction)."""

    def get_template(self) -> str:
        template = super().get_template()
        if PGTRIGGER_IGNORE_CALL not in template:
            raise RuntimeError("django-pgtrigger's trigger template changed: review triggers.py")
        return template.replace(PGTRIGGER_IGNORE_CALL, INLINE_IGNORE_TEST)


class PlacedTriggerSql(NotifyTriggerSql):
    """:class:`NotifyTriggerSql` with the trigger function created as ``execute`` names it.

    ``execute`` is ``"<schema>".<pgid>()`` under a placement, so the function
    is created (and called) in the workflow schema.
    """

    def get_template(self) -> str:
        return (
            super()
            .get_template()
            .replace("CREATE OR REPLACE FUNCTION {pgid}()", "CREATE OR REPLACE FUNCTION {execute}")
        )


class CommandNotifyTrigger(pgtrigger.Trigger):
    """AFTER INSERT OR UPDATE OF state, available_at; notifies for a PENDING or DEFERRED state."""

    name = NOTIFY_TRIGGER_NAME
    when = pgtrigger.After
    operation = pgtrigger.Insert | pgtrigger.UpdateOf("state", "available_at")
    # The condition is tested in the function, not in a ``WHEN`` clause: PostgreSQL
    # keeps a trigger's ``WHEN`` as the text of a node tree and reads it back,
    # compiles and prepares it for every statement that writes the table (each
    # recording, claim and settlement of a command). A recorded command saves all
    # of it (callgrind: a start 835,000 -> 810,000 backend instructions); a claim or
    # a settlement now calls the function, which ignores the row at about the cost
    # the ``WHEN`` had (a drain unchanged; migration 0016, docs/performance.md).
    # Spelled with one constant array, as 0012 spelled the ``WHEN``; PL/pgSQL keeps
    # the test's plan for the session.
    func = (
        """IF NEW."state"::text = ANY ('{PENDING,DEFERRED}'::text[]) THEN """
        f"PERFORM pg_notify('{tables.NOTIFY_CHANNEL}', "
        "(floor(extract(epoch FROM NEW.available_at) * 1000))::bigint::text); "
        "END IF; "
        "RETURN NULL;"
    )

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("name", self.name)
        super().__init__(**kwargs)

    def render_execute(self, model: Any) -> str:
        return f"{tables.qualified_object(self.get_pgid(model))}()"

    def compile(self, model: Any) -> compiler.Trigger:
        compiled = super().compile(model)
        kwargs = dict(compiled.sql.kwargs)
        if tables.SCHEMA is None:
            return compiler.Trigger(name=compiled.name, sql=NotifyTriggerSql(**kwargs))
        kwargs["ignore_func_name"] = tables.qualified_object("_pgtrigger_should_ignore")
        return compiler.Trigger(name=compiled.name, sql=PlacedTriggerSql(**kwargs))
