"""0004: the side-effect tables (issue 12), beside the eleven reference tables.

``workflow_service_outbox`` holds the dispatches of ``service`` steps,
written in the segment's transaction and claimed by the relay;
``workflow_events`` is the events recorder's outbox, read by consumers in
``(txid, id)`` order below the oldest running transaction;
``workflow_event_consumers`` keeps each consumer's acknowledged position.
Creating three empty tables locks nothing that exists; the migration
reverses by dropping them.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

from vertique_workflow import tables

T = tables.sql_names()


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0003_recorded_execution"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowEventConsumer",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("consumer", models.CharField(max_length=255)),
                ("last_txid", models.BigIntegerField(db_default=0)),
                ("last_id", models.BigIntegerField(db_default=0)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "workflow event consumer",
                "db_table": tables.qualified(tables.EVENT_CONSUMERS),
                "constraints": [
                    models.UniqueConstraint(fields=("consumer",), name="wf_event_consumer_uniq")
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("txid", models.BigIntegerField()),
                ("workflow_id", models.UUIDField()),
                ("event_type", models.CharField(max_length=64)),
                ("step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("fork_step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("branch_id", models.CharField(blank=True, max_length=255, null=True)),
                ("command_id", models.BigIntegerField(blank=True, null=True)),
                ("definition_id", models.CharField(max_length=255)),
                ("definition_version", models.IntegerField()),
                ("data_json", models.JSONField(db_default={})),
                (
                    "recorded_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "workflow event",
                "db_table": tables.qualified(tables.EVENTS),
                "indexes": [
                    models.Index(fields=["txid", "id"], name="wf_event_txid_id_idx"),
                    models.Index(fields=["workflow_id", "id"], name="wf_event_workflow_idx"),
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowServiceCall",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("workflow_id", models.UUIDField()),
                ("command_id", models.BigIntegerField(blank=True, null=True)),
                ("step_id", models.CharField(max_length=255)),
                ("branch_token_id", models.UUIDField(blank=True, null=True)),
                ("fork_step_id", models.CharField(blank=True, max_length=255, null=True)),
                ("branch_id", models.CharField(blank=True, max_length=255, null=True)),
                ("dispatch_key", models.CharField(max_length=512)),
                ("handler", models.CharField(max_length=255)),
                ("request_json", models.JSONField(blank=True, null=True)),
                ("policy_json", models.JSONField(db_default={})),
                ("state", models.CharField(db_default="PENDING", max_length=16)),
                ("attempts", models.IntegerField(db_default=0)),
                ("claim_token", models.UUIDField(blank=True, null=True)),
                ("claimed_by", models.CharField(blank=True, max_length=255, null=True)),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                (
                    "available_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("last_error", models.TextField(blank=True, null=True)),
                ("outcome", models.CharField(blank=True, max_length=16, null=True)),
                ("context_json", models.JSONField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "workflow service call",
                "db_table": tables.qualified(tables.SERVICE_OUTBOX),
                "indexes": [
                    models.Index(
                        condition=models.Q(("state", "PENDING")),
                        fields=["available_at"],
                        name="wf_svc_pending_avail_idx",
                    ),
                    models.Index(
                        condition=models.Q(("state", "CLAIMED")),
                        fields=["lease_until"],
                        name="wf_svc_claimed_lease_idx",
                    ),
                    models.Index(fields=["workflow_id"], name="wf_svc_workflow_idx"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("workflow_id", "dispatch_key"), name="wf_svc_dispatch_key_uniq"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("state__in", ["PENDING", "CLAIMED", "DELIVERED", "CANCELLED"])
                        ),
                        name="wf_svc_state_check",
                    ),
                ],
            },
        ),
        # the recording transaction's id, so consumers can read below the oldest
        # running transaction (see WorkflowEvent)
        migrations.RunSQL(
            f"ALTER TABLE {T['events']} ALTER COLUMN txid SET DEFAULT pg_current_xact_id()::text::bigint",
            migrations.RunSQL.noop,
        ),
    ]
