"""0001: the instance and runtime tables in their pre-scope shape.

Table names come from ``tables.py`` so a ``VERTIQUE_WORKFLOW["SCHEMA"]``
placement puts everything in that schema (created here when set).
``docs/schema.md`` describes each column.
"""

from django.db import migrations, models
from django.db.models import Q
from django.db.models.functions import Now

from vertique_workflow import tables

T = tables.sql_names()

CREATE_SCHEMA = (
    [
        migrations.RunSQL(
            f"CREATE SCHEMA IF NOT EXISTS {tables.quote(tables.SCHEMA)}", migrations.RunSQL.noop
        )
    ]
    if tables.SCHEMA
    else []
)


def uuid_pk():
    return models.UUIDField(primary_key=True, serialize=False)


def created():
    return models.DateTimeField(db_default=Now())


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        *CREATE_SCHEMA,
        migrations.CreateModel(
            name="WorkflowInstance",
            fields=[
                ("id", uuid_pk()),
                ("definition_id", models.CharField(max_length=255)),
                ("definition_version", models.IntegerField()),
                ("plan_hash", models.CharField(max_length=128)),
                ("status", models.CharField(max_length=32)),
                ("current_step_id", models.CharField(max_length=255)),
                ("state_json", models.JSONField()),
                ("business_key", models.CharField(blank=True, max_length=255, null=True)),
                ("subject_json", models.JSONField(blank=True, null=True)),
                ("metadata", models.JSONField(db_default={})),
                ("version", models.BigIntegerField(db_default=0)),
                ("error_type", models.CharField(blank=True, max_length=128, null=True)),
                ("error_message", models.TextField(blank=True, null=True)),
                ("created_at", created()),
                ("updated_at", created()),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
                ("archived_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": tables.qualified(tables.INSTANCES),
                "verbose_name": "workflow instance",
            },
        ),
        migrations.AddIndex(
            "workflowinstance",
            models.Index(
                fields=["definition_id", "definition_version"], name="wf_inst_definition_idx"
            ),
        ),
        migrations.AddIndex(
            "workflowinstance",
            models.Index(fields=["status", "updated_at"], name="wf_inst_status_updated_idx"),
        ),
        # The reference's name exceeds Django's 30-character Index.name limit,
        # so this index is created in SQL and is not part of the model state.
        migrations.RunSQL(
            f"CREATE INDEX idx_workflow_instances_business_key "
            f"ON {T['instances']} (definition_id, business_key) WHERE business_key IS NOT NULL",
            "DROP INDEX IF EXISTS " + tables.qualified("idx_workflow_instances_business_key"),
        ),
        migrations.CreateModel(
            name="WorkflowHistory",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_column="workflow_id",
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.DO_NOTHING,
                        related_name="history",
                        to="vertique_workflow.workflowinstance",
                    ),
                ),
                ("sequence", models.BigIntegerField()),
                ("event_type", models.CharField(max_length=64)),
                ("payload_json", models.JSONField(blank=True, null=True)),
                ("created_at", created()),
            ],
            options={
                "db_table": tables.qualified(tables.HISTORY),
                "verbose_name": "workflow history entry",
                "verbose_name_plural": "workflow history",
            },
        ),
        migrations.AddConstraint(
            "workflowhistory",
            models.UniqueConstraint(fields=["workflow", "sequence"], name="wf_history_wf_seq_uniq"),
        ),
        migrations.RunSQL(
            f"ALTER TABLE {T['history']} ADD CONSTRAINT workflow_history_workflow_fk "
            f"FOREIGN KEY (workflow_id) REFERENCES {T['instances']} (id) ON DELETE CASCADE",
            f"ALTER TABLE {T['history']} DROP CONSTRAINT workflow_history_workflow_fk",
        ),
        migrations.CreateModel(
            name="WorkflowDedup",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "kind",
                        "scope",
                        "key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("kind", models.CharField(max_length=32)),
                ("scope", models.CharField(max_length=255)),
                ("key", models.CharField(max_length=255)),
                ("workflow_id", models.UUIDField()),
                ("fingerprint", models.CharField(max_length=128)),
                ("result_json", models.JSONField(blank=True, null=True)),
                ("created_at", created()),
            ],
            options={
                "db_table": tables.qualified(tables.DEDUP),
                "verbose_name": "workflow dedup key",
            },
        ),
        migrations.AddIndex(
            "workflowdedup",
            models.Index(fields=["workflow_id"], name="wf_dedup_workflow_idx"),
        ),
        migrations.CreateModel(
            name="WorkflowTimer",
            fields=[
                ("id", uuid_pk()),
                ("workflow_id", models.UUIDField()),
                ("step_id", models.CharField(max_length=255)),
                ("purpose", models.CharField(max_length=32)),
                ("fire_at", models.DateTimeField()),
                ("status", models.CharField(max_length=16)),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("branch_token_id", models.UUIDField(blank=True, null=True)),
                ("fork_step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("branch_id", models.CharField(blank=True, max_length=255, null=True)),
                ("delayed_job_execution_id", models.UUIDField()),
                ("metadata", models.JSONField(db_default={})),
                ("created_at", created()),
                ("updated_at", created()),
            ],
            options={"db_table": tables.qualified(tables.TIMERS), "verbose_name": "workflow timer"},
        ),
        migrations.AddIndex(
            "workflowtimer",
            models.Index(fields=["workflow_id", "status"], name="wf_timer_workflow_idx"),
        ),
        migrations.AddConstraint(
            "workflowtimer",
            models.CheckConstraint(
                condition=Q(status__in=["SCHEDULED", "FIRED", "CANCELLED", "FAILED"]),
                name="workflow_timers_status_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowtimer",
            models.CheckConstraint(
                condition=Q(purpose__in=["STEP", "SIGNAL_TIMEOUT", "TASK_DUE", "TASK_REMINDER"]),
                name="workflow_timers_purpose_check",
            ),
        ),
        migrations.CreateModel(
            name="WorkflowTask",
            fields=[
                ("id", uuid_pk()),
                ("workflow_id", models.UUIDField()),
                ("step_id", models.CharField(max_length=255)),
                ("name", models.CharField(max_length=255)),
                ("status", models.CharField(max_length=16)),
                ("assignee", models.CharField(blank=True, max_length=255, null=True)),
                ("candidates_json", models.JSONField(db_default=[])),
                ("decisions_snapshot_json", models.JSONField(db_default={})),
                ("decision", models.CharField(blank=True, max_length=255, null=True)),
                ("result_json", models.JSONField(blank=True, null=True)),
                ("due_at", models.DateTimeField(blank=True, null=True)),
                ("branch_token_id", models.UUIDField(blank=True, null=True)),
                ("fork_step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("branch_id", models.CharField(blank=True, max_length=255, null=True)),
                ("version", models.BigIntegerField(db_default=0)),
                ("created_at", created()),
                ("updated_at", created()),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"db_table": tables.qualified(tables.TASKS), "verbose_name": "workflow task"},
        ),
        migrations.AddIndex(
            "workflowtask",
            models.Index(fields=["workflow_id"], name="wf_task_workflow_idx"),
        ),
        migrations.AddIndex(
            "workflowtask",
            models.Index(fields=["assignee", "status"], name="wf_task_assignee_idx"),
        ),
        migrations.AddConstraint(
            "workflowtask",
            models.CheckConstraint(
                condition=Q(status__in=["OPEN", "COMPLETED", "CANCELLED"]),
                name="workflow_tasks_status_check",
            ),
        ),
        migrations.CreateModel(
            name="WorkflowBranchToken",
            fields=[
                ("id", uuid_pk()),
                ("workflow_id", models.UUIDField()),
                ("fork_step_id", models.CharField(max_length=255)),
                ("branch_id", models.CharField(max_length=255)),
                ("status", models.CharField(max_length=32)),
                ("current_step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("state_json", models.JSONField(blank=True, null=True)),
                ("retry_at", models.DateTimeField(blank=True, null=True)),
                ("attempts", models.IntegerField(db_default=0)),
                ("metadata", models.JSONField(db_default={})),
                ("created_at", created()),
                ("updated_at", created()),
            ],
            options={
                "db_table": tables.qualified(tables.BRANCH_TOKENS),
                "verbose_name": "workflow branch token",
            },
        ),
        migrations.AddIndex(
            "workflowbranchtoken",
            models.Index(fields=["workflow_id", "fork_step_id"], name="wf_branch_workflow_idx"),
        ),
        migrations.CreateModel(
            name="WorkflowJoinState",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "workflow_id",
                        "join_step_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("workflow_id", models.UUIDField()),
                ("join_step_id", models.CharField(max_length=255)),
                ("fork_step_id", models.CharField(max_length=255)),
                ("expected", models.IntegerField()),
                ("arrived_json", models.JSONField(db_default=[])),
                ("decided", models.BooleanField(db_default=False)),
                ("created_at", created()),
                ("updated_at", created()),
            ],
            options={
                "db_table": tables.qualified(tables.JOIN_STATES),
                "verbose_name": "workflow join state",
            },
        ),
    ]
