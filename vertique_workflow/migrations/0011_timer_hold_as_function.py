"""0011: the held-back rule of timer commands as a PL/pgSQL function (issue 14).

Creates ``workflow_timer_held_back(...)``, the rule that holds a DUE or
REMINDER timer back while its task is COMPLETING and a TIMEOUT timer while a
signal or completion for its wait is on its way, which every reader of the
command log's eligibility (peek, claim, fence, probe) calls for TIMER commands
(``store/eligibility.py``). Written inline, the rule's two ``EXISTS`` were
sub-plans PostgreSQL set up on every execution of the claim and the fence,
for every kind of command: four index scans and their conditions a claim,
two a fence. Measured with callgrind on a one-thread drain: about 190,000
backend instructions less a 3-action instance, -7 % (docs/performance.md).

The function is ``STABLE``: its queries see the snapshot of the statement
that calls it, as the inline sub-plans did. It is created in the workflow
schema when one is configured, and reads the tables there. The body is
``store/eligibility.py``'s (as 0003 installs the model's trigger): a later
change of the rule ships a migration that replaces the function. Nothing
is locked but the catalog; no table is scanned.

Reversing drops the function. The code of this release calls it: reverse only
to run an earlier release.
"""

from django.db import migrations

from vertique_workflow.store import eligibility


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0010_command_checks_as_functions"),
    ]

    operations = [
        migrations.RunSQL(
            eligibility.held_back_function_sql(), eligibility.drop_held_back_function_sql()
        ),
    ]
