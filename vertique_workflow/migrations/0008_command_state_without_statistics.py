"""0008: ``workflow_commands.state`` keeps no planner statistics (issue 14).

Only a sliver of the command log is ever active (PENDING, DEFERRED, CLAIMED),
and that sliver changes far faster than any ANALYZE: statistics taken while
the queue was idle say that no row is active, and every plan made from them
after a burst of starts takes the active partial indexes for empty. The fence
then read its command by scanning ``wf_cmd_active_avail_idx`` whole instead
of by primary key, and the head rule scanned the same index whole for every
candidate of the claim: quadratic in the backlog (about 1.2 s a claim with
1,300 pending commands; docs/performance.md). Without statistics on ``state``
the planner estimates the active rows with its fixed default share of the
table, and its plans no longer depend on when ANALYZE last ran: the fence by
primary key, the head rule by ``(workflow_id, seq)``, the claim as a walk of
the availability index (the claim also reads its instance in a subquery of
its own, see ``store/commands.py``).

``SET STATISTICS 0`` stops ANALYZE from collecting statistics for the column
but leaves those it collected before. PostgreSQL removes a column's
statistics when the column's type is altered, so the migration alters
``state`` to the type it already has (``varchar(16)``, as 0001 created it):
no row is rewritten, but what reads ``state`` is made again. The three
partial indexes are dropped first and built again after it, stored exactly
as 0003 created them; PostgreSQL refuses the alteration
while a trigger's ``WHEN`` reads the column, so the notify trigger is removed
first and installed again after it with django-pgtrigger's own operations,
exactly as 0003 installed it (same SQL, same comment); PostgreSQL itself
re-creates the state's check constraint (0006's text reads back unchanged). All of it in the migration's
transaction, under the table's ACCESS EXCLUSIVE lock taken first (waiting at
most 30 s): on a very large command log, expect the three index builds to
hold the lock for the time of three scans of the table (see
docs/migrations.md). Another trigger of your own whose condition reads
``state`` makes PostgreSQL refuse the migration, naming the trigger: drop it,
migrate, and create it again.

Reversing lets ANALYZE collect statistics for the column again
(``SET STATISTICS -1``); the statistics return at the next analyze.
"""

import pgtrigger.migrations
from django.db import migrations

from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand

COMMANDS = tables.sql_names()["commands"]
NOTIFY_TRIGGER = WorkflowCommand._meta.triggers[0]
# The three partial indexes that read ``state``, as 0003 created them (PostgreSQL stores
# ``state IN (...)`` exactly as it stores Django's rendering of the model's condition).
# Dropped before the alteration and created again after it: PostgreSQL would rebuild
# them itself, but from their deparsed text, which it then stores spelled differently
# (the same predicate, another text than a fresh install's).
ACTIVE = "state IN ('PENDING', 'DEFERRED', 'CLAIMED')"
STATE_INDEXES = {
    "wf_cmd_active_seq_idx": f"(workflow_id, seq) WHERE {ACTIVE}",
    "wf_cmd_active_avail_idx": f"(available_at) WHERE {ACTIVE}",
    "wf_cmd_parked_dead_idx": "(workflow_id) WHERE state IN ('PARKED', 'DEAD')",
}


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0007_command_statistics_refresh"),
    ]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.RunSQL(
            [
                f"LOCK TABLE {COMMANDS} IN ACCESS EXCLUSIVE MODE",
                f"ALTER TABLE {COMMANDS} ALTER COLUMN state SET STATISTICS 0",
            ],
            f"ALTER TABLE {COMMANDS} ALTER COLUMN state SET STATISTICS -1",
        ),
        pgtrigger.migrations.RemoveTrigger(model_name="workflowcommand", name=NOTIFY_TRIGGER.name),
        migrations.RunSQL(
            [
                *(f"DROP INDEX {tables.qualified(name)}" for name in STATE_INDEXES),
                # the same type: removes the column's statistics, rewrites no row
                f"ALTER TABLE {COMMANDS} ALTER COLUMN state TYPE varchar(16)",
                *(
                    f"CREATE INDEX {name} ON {COMMANDS} {definition}"
                    for name, definition in STATE_INDEXES.items()
                ),
            ],
            migrations.RunSQL.noop,
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="workflowcommand", trigger=NOTIFY_TRIGGER.compile(WorkflowCommand)
        ),
    ]
