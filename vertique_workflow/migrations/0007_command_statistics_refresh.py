"""0007: autovacuum analyzes ``workflow_commands`` after 200 changed rows, whatever its size (issue 14).

The claim, the fence and the peek are planned from the statistics of
``workflow_commands``, and only a sliver of its rows is ever active (PENDING,
DEFERRED, CLAIMED). By default autovacuum analyzes a table after 10 % of its
rows changed: on a command log of a million settled rows, 100,000 changes.
Statistics taken while the queue was idle then outlive any burst of starts,
and the plans made from them take the active partial indexes for empty: the
claim scans the whole backlog for every candidate (quadratic in the
backlog; measured at about 1.2 s a claim with 1,300 pending commands, see
docs/performance.md). With a fixed threshold of 200 changed rows autovacuum
analyzes the table at its next round after a burst (``autovacuum_naptime``,
a minute by default) and every executor replans at its next statement.

The cost: one ANALYZE of the command log per ``autovacuum_naptime`` at most,
while commands are recorded. Both settings are ordinary storage parameters;
``ALTER TABLE workflow_commands SET (...)`` or ``RESET (...)`` overrides them.
Reversing resets them to the server's defaults.
"""

from django.db import migrations

from vertique_workflow import tables

COMMANDS = tables.sql_names()["commands"]


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0006_command_checks_as_constants"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE {COMMANDS} SET "
            "(autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 200)",
            f"ALTER TABLE {COMMANDS} RESET "
            "(autovacuum_analyze_scale_factor, autovacuum_analyze_threshold)",
        ),
    ]
