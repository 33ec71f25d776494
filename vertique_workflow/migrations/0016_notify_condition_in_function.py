"""0016: the notify trigger tests its condition in its function, without a ``WHEN`` (issue 14).

The trigger that wakes executors fires for a command that becomes PENDING or
DEFERRED. Its condition was the trigger's ``WHEN`` clause, which PostgreSQL
keeps as the text of a node tree and, for every statement that writes
``workflow_commands`` (each recording, claim and settlement of a command),
reads back, compiles and prepares before the first row, whether or not the
row then notifies: about 26,000 to 28,000 backend instructions a statement, even after
0012 spelled it as one constant array. Now the trigger has no ``WHEN`` and its
function begins with the same test (``NEW.state::text = ANY
('{PENDING,DEFERRED}'::text[])``), whose plan PL/pgSQL keeps for the session.
A recorded command (a start, a signal, a completion, a timer) saves the whole
of the ``WHEN``: measured with callgrind, a start 835,000 -> 810,000 backend
instructions (-3.0 %). For a claim or a settlement the function is now called
and ignores the row, which in a one-thread drain cost about what reading the
``WHEN`` did (about 22,000 against 26,000 instructions; the drain's total did
not move, 2.228 -> 2.232 M an instance, docs/performance.md).
The same rows notify, with the same payload, at the same commit; the trigger's
name, events and columns are unchanged, and ``pgtrigger.ignore()`` still skips
it.

The trigger is removed and installed again with django-pgtrigger's own
operations, as 0012 and 0013 do (0003 and 0008 install the model's current
trigger, so a new installation has this form from 0003 on). Both run in the
migration's transaction, whose lock on the table (ACCESS EXCLUSIVE from the
``DROP TRIGGER``, waiting at most 30 s) holds every writer of commands until it
commits: no command is written without the trigger. Reversing installs the
same trigger again: the ``WHEN`` it replaces is not kept anywhere (notifying
the same rows, it is not needed by anything).
"""

from django.db import migrations

from vertique_workflow.migrations._notify_trigger import reinstall_notify_trigger


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0015_command_timer_kind_guard"),
    ]

    # bounded lock wait, then the trigger removed and added (as 0012 and 0013 do)
    operations = reinstall_notify_trigger()
