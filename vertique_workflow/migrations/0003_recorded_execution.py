"""0003: recorded execution, as in the reference's V003.

Schema: ``workflow_commands`` (identity id, checks on state/kind/timer_kind,
three partial indexes, ``ON DELETE CASCADE`` to instances, the notify trigger)
and ``workflow_command_queues``; the column changes on instances, history,
tasks, timers and definitions.

Conversion of running work from a pre-0003 database (see
``docs/migrations.md``): SCHEDULED timers become TIMER commands, branches in
RETRY_SCHEDULED become branch-addressed RETRY commands, every instance that
received a command gets its queue row, every instance is marked
``baseline_logged = FALSE`` and the delayed jobs that fired old timers are
deleted when a plain ``job_executions`` table exists in the migration's schema.

The schema part reverses. The conversion does not: reversing 0003 while the
command log holds commands raises ``IrreversibleError`` (they would be lost);
an empty command log reverses cleanly.
"""

import pgtrigger.migrations
from django.db import migrations, models
from django.db.migrations.exceptions import IrreversibleError
from django.db.models import Q
from django.db.models.functions import Now

from vertique_workflow import tables
from vertique_workflow.models import WorkflowCommand

T = tables.sql_names()
ACTIVE = ["PENDING", "DEFERRED", "CLAIMED"]
IDENTITY_NAMESPACE = "identity"
TIMER_FIRE_HANDLER = "jobs/delayed/vertique.workflow.timer.fire/execute"

# The conversion runs in one statement per step, in the migration's transaction.
CONVERT_RUNNING_WORK = [
    # timers keep their durable context, never the identity snapshot
    f"""UPDATE {T["timers"]} SET metadata = metadata - '{IDENTITY_NAMESPACE}'
        WHERE status = 'SCHEDULED' AND metadata ? '{IDENTITY_NAMESPACE}'""",
    # SCHEDULED timers and RETRY_SCHEDULED branches become commands, numbered per
    # instance by availability (timers by fire time)
    f"""WITH work AS (
            SELECT t.workflow_id, 'TIMER' AS kind,
                   CASE t.purpose WHEN 'STEP' THEN 'FIRE' WHEN 'SIGNAL_TIMEOUT' THEN 'TIMEOUT'
                                  WHEN 'TASK_DUE' THEN 'DUE' ELSE 'REMINDER' END AS timer_kind,
                   t.id AS timer_id, t.task_id, NULL::jsonb AS target_json,
                   t.created_at AS recorded_at, t.fire_at, t.fire_at AS available_at,
                   0 AS ord, t.id::text AS tiebreak
            FROM {T["timers"]} t
            JOIN {T["instances"]} i ON i.id = t.workflow_id
            WHERE t.status = 'SCHEDULED'
            UNION ALL
            SELECT b.workflow_id, 'RETRY', NULL, NULL, NULL,
                   jsonb_build_object('forkStepId', b.fork_step_id, 'branchId', b.branch_id,
                                      'branchTokenId', b.id::text),
                   now(), NULL, COALESCE(b.retry_at, now()), 1, b.id::text
            FROM {T["branch_tokens"]} b
            JOIN {T["instances"]} i ON i.id = b.workflow_id
            WHERE b.status = 'RETRY_SCHEDULED'
        ),
        numbered AS (
            SELECT work.*, row_number() OVER (
                       PARTITION BY workflow_id ORDER BY available_at, ord, tiebreak) AS seq
            FROM work
        ),
        inserted AS (
            INSERT INTO {T["commands"]} (workflow_id, seq, kind, state, timer_kind, timer_id,
                task_id, target_json, actor_kind, actor_id, actor_reason, attribution_status,
                recorded_at, fire_at, available_at)
            SELECT workflow_id, seq, kind, 'PENDING', timer_kind, timer_id, task_id, target_json,
                   'SYSTEM', NULL, CASE kind WHEN 'TIMER' THEN 'timer' ELSE 'retry' END,
                   'VERIFIED', recorded_at, fire_at, available_at
            FROM numbered
            RETURNING id, workflow_id, seq, timer_id
        ),
        linked AS (
            UPDATE {T["timers"]} t SET command_id = inserted.id, updated_at = now()
            FROM inserted WHERE inserted.timer_id = t.id
        )
        INSERT INTO {T["command_queues"]} (workflow_id, next_seq)
        SELECT workflow_id, max(seq) + 1 FROM inserted GROUP BY workflow_id""",
    f"""UPDATE {T["branch_tokens"]} SET status = 'RUNNING', updated_at = now()
        WHERE status = 'RETRY_SCHEDULED'""",
    f"UPDATE {T['instances']} SET baseline_logged = FALSE",
    # the delayed jobs that fired pre-0003 timers, when their plain table is here
    f"""DO $$
        DECLARE
            job_table regclass := to_regclass(
                format('%I.job_executions', {f"'{tables.SCHEMA}'" if tables.SCHEMA else "current_schema()"}));
        BEGIN
            IF job_table IS NOT NULL
               AND (SELECT relkind FROM pg_class WHERE oid = job_table) = 'r' THEN
                EXECUTE format('DELETE FROM %s WHERE handler = $1 '
                               'AND state IN (''ENQUEUED'', ''PROCESSING'', ''FAILED'', ''ABANDONED'')',
                               job_table)
                USING '{TIMER_FIRE_HANDLER}';
            END IF;
        END
    $$""",
]


NOTIFY_TRIGGER = WorkflowCommand._meta.triggers[0]
DROP_TRIGGER_FUNCTIONS = [
    f"DROP FUNCTION IF EXISTS "
    f"{tables.qualified_object(NOTIFY_TRIGGER.get_pgid(WorkflowCommand))}()",
    # the ignore helper is ours only when it lives in the workflow schema
    *(
        [f"DROP FUNCTION IF EXISTS {tables.qualified_object('_pgtrigger_should_ignore')}(name)"]
        if tables.SCHEMA
        else []
    ),
]


def refuse_reverse_with_commands(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {T['commands']})")
        if cursor.fetchone()[0]:
            raise IrreversibleError(
                "vertique_workflow 0003 cannot be reversed while workflow_commands holds commands: "
                "the recorded work (including timers and retries converted from a pre-0003 "
                "database) would be lost. Restore a backup taken before 0003 instead."
            )


class Migration(migrations.Migration):
    dependencies = [("vertique_workflow", "0002_definitions_and_scopes")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.CreateModel(
            name="WorkflowCommand",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_column="workflow_id",
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.DO_NOTHING,
                        related_name="commands",
                        to="vertique_workflow.workflowinstance",
                    ),
                ),
                ("seq", models.BigIntegerField()),
                ("kind", models.CharField(max_length=16)),
                ("state", models.CharField(max_length=16)),
                ("timer_kind", models.CharField(blank=True, max_length=16, null=True)),
                ("timer_id", models.UUIDField(blank=True, null=True)),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("target_json", models.JSONField(blank=True, null=True)),
                ("payload_json", models.JSONField(blank=True, null=True)),
                ("dedup_key", models.CharField(blank=True, max_length=255, null=True)),
                ("claim_token", models.UUIDField(blank=True, null=True)),
                ("claimed_by", models.CharField(blank=True, max_length=255, null=True)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("actor_kind", models.CharField(blank=True, max_length=32, null=True)),
                ("actor_id", models.CharField(blank=True, max_length=255, null=True)),
                ("actor_reason", models.CharField(blank=True, max_length=255, null=True)),
                ("on_behalf_of", models.CharField(blank=True, max_length=255, null=True)),
                ("attribution_status", models.CharField(blank=True, max_length=32, null=True)),
                ("context_json", models.JSONField(blank=True, null=True)),
                ("explicit_carrier_json", models.JSONField(blank=True, null=True)),
                ("attempts", models.IntegerField(db_default=0)),
                ("transient_count", models.IntegerField(db_default=0)),
                ("deferral_count", models.IntegerField(db_default=0)),
                ("recorded_at", models.DateTimeField(db_default=Now())),
                ("fire_at", models.DateTimeField(blank=True, null=True)),
                ("available_at", models.DateTimeField(db_default=Now())),
                ("settled_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, null=True)),
            ],
            options={
                "db_table": tables.qualified(tables.COMMANDS),
                "verbose_name": "workflow command",
            },
        ),
        migrations.AddConstraint(
            "workflowcommand",
            models.UniqueConstraint(
                fields=["workflow", "seq"], name="workflow_commands_wf_seq_uniq"
            ),
        ),
        migrations.AddConstraint(
            "workflowcommand",
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "PENDING",
                        "DEFERRED",
                        "CLAIMED",
                        "PARKED",
                        "DEAD",
                        "COMPLETE",
                        "REJECTED",
                        "STALE",
                        "FAILED",
                        "SUPERSEDED",
                        "CANCELLED",
                    ]
                ),
                name="workflow_commands_state_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowcommand",
            models.CheckConstraint(
                condition=Q(
                    kind__in=["START", "SIGNAL", "COMPLETION", "RETRY", "MIGRATION", "TIMER"]
                ),
                name="workflow_commands_kind_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowcommand",
            models.CheckConstraint(
                # timer_kind IS NOT NULL is spelled out: IN alone is NULL (not
                # false) for a NULL timer_kind, and a CHECK admits NULL
                condition=(
                    Q(kind="TIMER")
                    & Q(timer_kind__isnull=False)
                    & Q(timer_kind__in=["FIRE", "TIMEOUT", "DUE", "REMINDER"])
                )
                | (~Q(kind="TIMER") & Q(timer_kind__isnull=True)),
                name="workflow_commands_timer_kind_check",
            ),
        ),
        migrations.AddIndex(
            "workflowcommand",
            models.Index(
                condition=Q(state__in=ACTIVE),
                fields=["workflow", "seq"],
                name="wf_cmd_active_seq_idx",
            ),
        ),
        migrations.AddIndex(
            "workflowcommand",
            models.Index(
                condition=Q(state__in=ACTIVE),
                fields=["available_at"],
                name="wf_cmd_active_avail_idx",
            ),
        ),
        migrations.AddIndex(
            "workflowcommand",
            models.Index(
                condition=Q(state__in=["PARKED", "DEAD"]),
                fields=["workflow"],
                name="wf_cmd_parked_dead_idx",
            ),
        ),
        migrations.RunSQL(
            f"ALTER TABLE {T['commands']} ADD CONSTRAINT workflow_commands_workflow_fk "
            f"FOREIGN KEY (workflow_id) REFERENCES {T['instances']} (id) ON DELETE CASCADE",
            f"ALTER TABLE {T['commands']} DROP CONSTRAINT workflow_commands_workflow_fk",
        ),
        migrations.CreateModel(
            name="WorkflowCommandQueue",
            fields=[
                (
                    "workflow",
                    models.OneToOneField(
                        db_column="workflow_id",
                        db_constraint=False,
                        on_delete=models.DO_NOTHING,
                        primary_key=True,
                        related_name="command_queue",
                        serialize=False,
                        to="vertique_workflow.workflowinstance",
                    ),
                ),
                ("next_seq", models.BigIntegerField()),
                ("open_signals", models.IntegerField(db_default=0)),
            ],
            options={
                "db_table": tables.qualified(tables.COMMAND_QUEUES),
                "verbose_name": "workflow command queue",
            },
        ),
        migrations.RunSQL(
            f"ALTER TABLE {T['command_queues']} ADD CONSTRAINT workflow_command_queues_workflow_fk "
            f"FOREIGN KEY (workflow_id) REFERENCES {T['instances']} (id) ON DELETE CASCADE",
            f"ALTER TABLE {T['command_queues']} DROP CONSTRAINT workflow_command_queues_workflow_fk",
        ),
        # instances
        migrations.AlterField(
            "workflowinstance", "state_json", models.JSONField(blank=True, null=True)
        ),
        migrations.AlterField(
            "workflowinstance",
            "current_step_id",
            models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            "workflowinstance", "baseline_logged", models.BooleanField(db_default=True)
        ),
        # history: sixteen nullable columns and entry_version
        *[
            migrations.AddField("workflowhistory", name, field)
            for name, field in [
                ("actor_kind", models.CharField(blank=True, max_length=32, null=True)),
                ("actor_id", models.CharField(blank=True, max_length=255, null=True)),
                ("actor_reason", models.CharField(blank=True, max_length=255, null=True)),
                ("on_behalf_of", models.CharField(blank=True, max_length=255, null=True)),
                ("attribution_status", models.CharField(blank=True, max_length=32, null=True)),
                ("executor_id", models.CharField(blank=True, max_length=255, null=True)),
                ("command_id", models.BigIntegerField(blank=True, null=True)),
                ("step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("outcome", models.CharField(blank=True, max_length=64, null=True)),
                ("definition_scope_key", models.CharField(blank=True, max_length=255, null=True)),
                ("definition_id", models.CharField(blank=True, max_length=255, null=True)),
                ("definition_version", models.IntegerField(blank=True, null=True)),
                ("plan_hash", models.CharField(blank=True, max_length=128, null=True)),
                ("state_version_before", models.BigIntegerField(blank=True, null=True)),
                ("state_version_after", models.BigIntegerField(blank=True, null=True)),
                ("patch_json", models.JSONField(blank=True, null=True)),
                ("entry_version", models.SmallIntegerField(db_default=1)),
            ]
        ],
        # tasks
        migrations.RemoveConstraint("workflowtask", "workflow_tasks_status_check"),
        migrations.AddConstraint(
            "workflowtask",
            models.CheckConstraint(
                condition=Q(status__in=["OPEN", "COMPLETING", "COMPLETED", "CANCELLED"]),
                name="workflow_tasks_status_check",
            ),
        ),
        migrations.AddField(
            "workflowtask", "reservation_command_id", models.BigIntegerField(blank=True, null=True)
        ),
        migrations.AddField(
            "workflowtask", "require_version_stability", models.BooleanField(blank=True, null=True)
        ),
        # timers
        migrations.AlterField(
            "workflowtimer", "delayed_job_execution_id", models.UUIDField(blank=True, null=True)
        ),
        migrations.AddField(
            "workflowtimer", "command_id", models.BigIntegerField(blank=True, null=True)
        ),
        # definitions
        migrations.AddField(
            "workflowdefinition", "signal_names_json", models.JSONField(blank=True, null=True)
        ),
        migrations.AddField(
            "workflowdefinition", "start_schema_json", models.JSONField(blank=True, null=True)
        ),
        # the notify trigger (django-pgtrigger; its functions follow the placement).
        # Reversing drops the trigger function too (pgtrigger leaves it behind).
        migrations.RunSQL(migrations.RunSQL.noop, DROP_TRIGGER_FUNCTIONS),
        pgtrigger.migrations.AddTrigger(
            model_name="workflowcommand",
            trigger=NOTIFY_TRIGGER.compile(WorkflowCommand),
        ),
        # conversion of running work; refuses to reverse over recorded commands
        migrations.RunPython(migrations.RunPython.noop, refuse_reverse_with_commands),
        migrations.RunSQL(CONVERT_RUNNING_WORK, migrations.RunSQL.noop),
    ]
