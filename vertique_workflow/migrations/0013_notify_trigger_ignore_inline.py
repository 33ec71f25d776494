"""0013: the notify trigger asks whether it is ignored without a subtransaction (issue 14).

django-pgtrigger's trigger function first calls its helper
``_pgtrigger_should_ignore``, which reads the ``pgtrigger.ignore`` setting in a
block with an exception handler: PL/pgSQL runs such a block as a subtransaction,
and since the setting is unset unless ``pgtrigger.ignore()`` is in use, every
firing of the trigger (every command recorded PENDING: each start, signal,
completion, timer and re-queue) began a subtransaction, raised an error and
rolled it back. The function now makes the same test inline: it reads the
setting with ``current_setting('pgtrigger.ignore', true)``, which answers NULL
for an unset setting, and looks for the trigger's name as one element of the
array text ``pgtrigger.ignore()`` sets (``vertique_workflow/triggers.py``). The
trigger fires for the same rows and ``pgtrigger.ignore()`` still skips it; under
a schema placement it now does (the helper could not read the array there: it
holds a quoted table name, the cast failed inside the handler, and the trigger
was never ignored). Measured with callgrind: about 31,000 backend instructions
less a start, -3.4 % (docs/performance.md).

The trigger is removed and installed again with django-pgtrigger's own
operations, as 0008 and 0012 do (0003 and 0008 install the model's current
trigger, so a new installation has this function from 0003 on). Both run in the
migration's transaction, whose lock on the table (ACCESS EXCLUSIVE from the
``DROP TRIGGER``, waiting at most 30 s) holds every writer of commands until it
commits: no command is written without the trigger. django-pgtrigger's helper
function stays (its install creates it; other triggers may call it). Reversing
installs the same trigger again: the function it replaces is not kept anywhere.
"""

from django.db import migrations

from vertique_workflow.migrations._notify_trigger import reinstall_notify_trigger


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0012_notify_condition_as_constant"),
    ]

    # bounded lock wait, then the trigger removed and added (as 0008 does)
    operations = reinstall_notify_trigger()
