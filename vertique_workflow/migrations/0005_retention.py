"""0005: the partial index retention's purge reads its candidates from (issue 13).

``wf_inst_archived_idx (archived_at, id) WHERE archived_at IS NOT NULL``:
only archived rows are in it, so it costs nothing on the hot path (an
instance is archived once) and a purge batch is a range scan instead of a
scan of every instance. Building it scans ``workflow_instances`` once under
a SHARE lock (writes wait); on a very large table create it first with
``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` and the same definition, and
this migration then finds it (see docs/migrations.md).
"""

from django.db import migrations, models

from vertique_workflow import tables

T = tables.sql_names()


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0004_side_effects"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="workflowinstance",
                    index=models.Index(
                        condition=models.Q(("archived_at__isnull", False)),
                        fields=["archived_at", "id"],
                        name="wf_inst_archived_idx",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"CREATE INDEX IF NOT EXISTS wf_inst_archived_idx ON {T['instances']} "
                    "(archived_at, id) WHERE archived_at IS NOT NULL",
                    f"DROP INDEX IF EXISTS {tables.qualified('wf_inst_archived_idx')}",
                ),
            ],
        ),
    ]
