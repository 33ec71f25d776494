"""0002: the definition registry and scope keys, as in the reference's V002.

* ``workflow_definitions`` keyed by (scope_key, definition_id, definition_version)
  and ``workflow_definition_activations`` keyed by (scope_key, definition_id),
  whose target row is referenced ``ON DELETE RESTRICT`` (a composite foreign
  key Django cannot declare, so it is SQL).
* ``scope_key`` / ``definition_scope_key`` on instances and ``scope_key`` on
  tasks, ``VARCHAR(255) NOT NULL DEFAULT 'default'``; no row is rewritten.
* The business-key index is dropped and rebuilt unique per
  (scope_key, definition_id, business_key); the two scope keyset indexes.
* ``workflow_dedup.scope`` becomes ``dedup_namespace``, gains ``scope_key`` and
  the primary key (kind, scope_key, dedup_namespace, key).

Lock waits are bounded with ``SET LOCAL lock_timeout = '30s'``. Every step is
reversible.
"""

from django.db import migrations, models
from django.db.models import F, Q
from django.db.models.functions import Now

from vertique_workflow import tables

T = tables.sql_names()
DEFAULT = "default"


def index_name(name: str) -> str:
    return tables.qualified(name)


class Migration(migrations.Migration):
    dependencies = [("vertique_workflow", "0001_initial")]

    operations = [
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.CreateModel(
            name="WorkflowDefinition",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "scope_key",
                        "definition_id",
                        "definition_version",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("scope_key", models.CharField(db_default=DEFAULT, max_length=255)),
                ("definition_id", models.CharField(max_length=255)),
                ("definition_version", models.IntegerField()),
                ("kind", models.CharField(max_length=16)),
                ("status", models.CharField(max_length=16)),
                ("contract_name", models.CharField(max_length=255)),
                ("state_type_name", models.CharField(max_length=255)),
                ("plan_hash", models.CharField(max_length=128)),
                ("name_binding", models.JSONField(db_default={})),
                ("document_text", models.TextField(blank=True, null=True)),
                ("document_digest", models.CharField(blank=True, max_length=64, null=True)),
                ("document_format", models.CharField(blank=True, max_length=16, null=True)),
                ("source_location", models.TextField(blank=True, null=True)),
                ("publish_token", models.UUIDField(blank=True, null=True)),
                ("publish_claimed_at", models.DateTimeField(blank=True, null=True)),
                ("failure_reason", models.CharField(blank=True, max_length=64, null=True)),
                ("created_at", models.DateTimeField(db_default=Now())),
                ("updated_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "db_table": tables.qualified(tables.DEFINITIONS),
                "verbose_name": "workflow definition",
            },
        ),
        migrations.AddConstraint(
            "workflowdefinition",
            models.CheckConstraint(
                condition=Q(kind__in=["CODE", "DOCUMENT"]), name="workflow_definitions_kind_check"
            ),
        ),
        migrations.AddConstraint(
            "workflowdefinition",
            models.CheckConstraint(
                condition=Q(
                    status__in=["CANDIDATE", "PUBLISHING", "AVAILABLE", "DEPRECATED", "RETIRED"]
                ),
                name="workflow_definitions_status_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowdefinition",
            models.CheckConstraint(
                condition=~Q(kind="CODE") | Q(scope_key=DEFAULT),
                name="workflow_definitions_code_scope_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowdefinition",
            models.CheckConstraint(
                condition=(
                    Q(kind="DOCUMENT", document_text__isnull=False, document_digest__isnull=False)
                    | Q(kind="CODE", document_text__isnull=True, document_digest__isnull=True)
                ),
                name="workflow_definitions_source_check",
            ),
        ),
        migrations.AddConstraint(
            "workflowdefinition",
            models.CheckConstraint(
                condition=Q(status="PUBLISHING", publish_token__isnull=False)
                | (~Q(status="PUBLISHING") & Q(publish_token__isnull=True)),
                name="workflow_definitions_publish_token_check",
            ),
        ),
        migrations.CreateModel(
            name="WorkflowDefinitionActivation",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "scope_key",
                        "definition_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("scope_key", models.CharField(max_length=255)),
                ("definition_id", models.CharField(max_length=255)),
                ("target_scope_key", models.CharField(max_length=255)),
                ("definition_version", models.IntegerField()),
                ("activated_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "db_table": tables.qualified(tables.ACTIVATIONS),
                "verbose_name": "workflow definition activation",
            },
        ),
        migrations.AddConstraint(
            "workflowdefinitionactivation",
            models.CheckConstraint(
                condition=(
                    (Q(target_scope_key=F("scope_key")) | Q(target_scope_key=DEFAULT))
                    & (~Q(scope_key=DEFAULT) | Q(target_scope_key=DEFAULT))
                ),
                name="workflow_definition_activations_target_check",
            ),
        ),
        migrations.RunSQL(
            f"ALTER TABLE {T['definition_activations']} "
            "ADD CONSTRAINT workflow_definition_activations_target_fk "
            "FOREIGN KEY (target_scope_key, definition_id, definition_version) "
            f"REFERENCES {T['definitions']} (scope_key, definition_id, definition_version) "
            "ON DELETE RESTRICT",
            f"ALTER TABLE {T['definition_activations']} "
            "DROP CONSTRAINT workflow_definition_activations_target_fk",
        ),
        # scope columns: existing rows read 'default', nothing is rewritten
        migrations.AddField(
            "workflowinstance", "scope_key", models.CharField(db_default=DEFAULT, max_length=255)
        ),
        migrations.AddField(
            "workflowinstance",
            "definition_scope_key",
            models.CharField(db_default=DEFAULT, max_length=255),
        ),
        migrations.AddField(
            "workflowtask", "scope_key", models.CharField(db_default=DEFAULT, max_length=255)
        ),
        migrations.RunSQL(
            [
                f"DROP INDEX IF EXISTS {index_name('idx_workflow_instances_business_key')}",
                "CREATE UNIQUE INDEX idx_workflow_instances_business_key "
                f"ON {T['instances']} (scope_key, definition_id, business_key) "
                "WHERE business_key IS NOT NULL",
                "CREATE INDEX IF NOT EXISTS idx_workflow_instances_scope_updated_at "
                f"ON {T['instances']} (scope_key, updated_at DESC, id)",
                "CREATE INDEX IF NOT EXISTS idx_workflow_tasks_scope_updated_at "
                f"ON {T['tasks']} (scope_key, updated_at DESC, id)",
            ],
            [
                f"DROP INDEX IF EXISTS {index_name('idx_workflow_tasks_scope_updated_at')}",
                f"DROP INDEX IF EXISTS {index_name('idx_workflow_instances_scope_updated_at')}",
                f"DROP INDEX IF EXISTS {index_name('idx_workflow_instances_business_key')}",
                "CREATE INDEX idx_workflow_instances_business_key "
                f"ON {T['instances']} (definition_id, business_key) WHERE business_key IS NOT NULL",
            ],
        ),
        # dedup: rename scope -> dedup_namespace, add scope_key, new primary key
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    [
                        f"ALTER TABLE {T['dedup']} RENAME COLUMN scope TO dedup_namespace",
                        f"ALTER TABLE {T['dedup']} ADD COLUMN scope_key VARCHAR(255) NOT NULL "
                        "DEFAULT 'default'",
                        f"ALTER TABLE {T['dedup']} DROP CONSTRAINT {tables.DEDUP}_pkey",
                        f"ALTER TABLE {T['dedup']} ADD CONSTRAINT {tables.DEDUP}_pkey "
                        "PRIMARY KEY (kind, scope_key, dedup_namespace, key)",
                    ],
                    [
                        f"ALTER TABLE {T['dedup']} DROP CONSTRAINT {tables.DEDUP}_pkey",
                        f"ALTER TABLE {T['dedup']} DROP COLUMN scope_key",
                        f"ALTER TABLE {T['dedup']} RENAME COLUMN dedup_namespace TO scope",
                        f"ALTER TABLE {T['dedup']} ADD CONSTRAINT {tables.DEDUP}_pkey "
                        "PRIMARY KEY (kind, scope, key)",
                    ],
                )
            ],
            state_operations=[
                migrations.RenameField("workflowdedup", "scope", "dedup_namespace"),
                migrations.AddField(
                    "workflowdedup",
                    "scope_key",
                    models.CharField(db_default=DEFAULT, max_length=255),
                ),
                migrations.AlterField(
                    "workflowdedup",
                    "pk",
                    models.CompositePrimaryKey(
                        "kind",
                        "scope_key",
                        "dedup_namespace",
                        "key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
            ],
        ),
    ]
