"""The operations that install the notify trigger again (0012, 0013, 0014, 0016).

Not a migration (Django's loader skips modules whose name starts with ``_``).
The model's current trigger is removed and added with django-pgtrigger's own
operations, in the migration's transaction, after bounding the wait for the
table's lock to 30 s (docs/migrations.md, "Lock timeouts").
"""

from __future__ import annotations

from typing import Any

import pgtrigger.migrations
from django.db import migrations

from vertique_workflow.models import WorkflowCommand


def reinstall_notify_trigger(meanwhile: list[Any] | None = None) -> list[Any]:
    """``SET LOCAL lock_timeout``, then remove and add the model's notify trigger.

    ``meanwhile``: operations to run while the trigger is absent (PostgreSQL
    refuses to change the type of a column a trigger's definition names).
    """
    trigger = WorkflowCommand._meta.triggers[0]
    return [
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        pgtrigger.migrations.RemoveTrigger(model_name="workflowcommand", name=trigger.name),
        *(meanwhile or []),
        pgtrigger.migrations.AddTrigger(
            model_name="workflowcommand", trigger=trigger.compile(WorkflowCommand)
        ),
    ]
