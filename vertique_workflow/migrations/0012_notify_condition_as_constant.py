"""0012: the notify trigger's condition spelled with one constant array (issue 14).

The trigger that wakes executors fires for a command that becomes PENDING or
DEFERRED. PostgreSQL keeps its ``WHEN`` as the text of a node tree and reads it
back for every statement that writes ``workflow_commands`` (each claim and
each settlement of a command, each recording); spelled as Django renders
``state IN ('PENDING', 'DEFERRED')`` it was two constants, their casts and an
array expression, now one ``text[]`` constant:
``NEW.state::text = ANY ('{PENDING,DEFERRED}'::text[])``. The same rows wake
executors. Measured with callgrind on a one-thread drain: -1.4 % of the
backend's instructions per 3-action instance (docs/performance.md).

The trigger is removed and installed again with django-pgtrigger's own
operations, as 0008 does (0003 and 0008 install the model's current trigger,
so a new installation has this spelling from 0003 on). Both run in the
migration's transaction, whose lock on the table (ACCESS EXCLUSIVE from the
``DROP TRIGGER``, waiting at most 30 s) holds every writer of commands until it
commits: no command is written without the trigger. Reversing installs the
same trigger again: the spelling it replaces is not kept anywhere.
"""

from django.db import migrations

from vertique_workflow.migrations._notify_trigger import reinstall_notify_trigger


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0011_timer_hold_as_function"),
    ]

    # bounded lock wait, then the trigger removed and added (as 0008 does)
    operations = reinstall_notify_trigger()
