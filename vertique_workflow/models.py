"""Django models of the eleven workflow tables, and of the side-effect tables of 0004.

The models describe the tables for the ORM (admin, queries, tests); the hot
paths of the engine use the raw statements of ``store/``. Database behaviour
the reference requires lives in the database itself: defaults are
``db_default``, the foreign keys that must cascade or restrict in PostgreSQL
are declared ``db_constraint=False`` here and created by migration SQL with
the right action, and the commands notify trigger is declared below with
django-pgtrigger. ``docs/schema.md`` describes every column.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from . import tables
from .triggers import CommandNotifyTrigger

DEFAULT_SCOPE = "default"


class InstanceStatus(models.TextChoices):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"
    COMPENSATED = "COMPENSATED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    FAILED = "FAILED"


class CommandState(models.TextChoices):
    PENDING = "PENDING"
    DEFERRED = "DEFERRED"
    CLAIMED = "CLAIMED"
    PARKED = "PARKED"
    DEAD = "DEAD"
    COMPLETE = "COMPLETE"
    REJECTED = "REJECTED"
    STALE = "STALE"
    FAILED = "FAILED"
    SUPERSEDED = "SUPERSEDED"
    CANCELLED = "CANCELLED"


class CommandKind(models.TextChoices):
    START = "START"
    SIGNAL = "SIGNAL"
    COMPLETION = "COMPLETION"
    RETRY = "RETRY"
    MIGRATION = "MIGRATION"
    TIMER = "TIMER"


class TimerKind(models.TextChoices):
    FIRE = "FIRE"
    TIMEOUT = "TIMEOUT"
    DUE = "DUE"
    REMINDER = "REMINDER"


class TimerPurpose(models.TextChoices):
    """Why a timer exists; the TIMER command's ``timer_kind`` follows from it."""

    STEP = "STEP"
    SIGNAL_TIMEOUT = "SIGNAL_TIMEOUT"
    TASK_DUE = "TASK_DUE"
    TASK_REMINDER = "TASK_REMINDER"


TIMER_KIND_OF_PURPOSE = {
    TimerPurpose.STEP: TimerKind.FIRE,
    TimerPurpose.SIGNAL_TIMEOUT: TimerKind.TIMEOUT,
    TimerPurpose.TASK_DUE: TimerKind.DUE,
    TimerPurpose.TASK_REMINDER: TimerKind.REMINDER,
}


class TimerStatus(models.TextChoices):
    SCHEDULED = "SCHEDULED"
    FIRED = "FIRED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"


class TaskStatus(models.TextChoices):
    OPEN = "OPEN"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"


class BranchStatus(models.TextChoices):
    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    SUPERSEDED = "SUPERSEDED"


class DefinitionKind(models.TextChoices):
    CODE = "CODE"
    DOCUMENT = "DOCUMENT"


class DefinitionStatus(models.TextChoices):
    CANDIDATE = "CANDIDATE"
    PUBLISHING = "PUBLISHING"
    AVAILABLE = "AVAILABLE"
    DEPRECATED = "DEPRECATED"
    RETIRED = "RETIRED"


def _in(field: str, choices: type[models.TextChoices]) -> Q:
    return Q(**{f"{field}__in": list(choices.values)})


class WorkflowInstance(models.Model):
    """Current snapshot of one workflow instance."""

    id = models.UUIDField(primary_key=True)
    definition_id = models.CharField(max_length=255)
    definition_version = models.IntegerField()
    plan_hash = models.CharField(max_length=128)
    status = models.CharField(max_length=32)
    current_step_id = models.CharField(max_length=255, null=True, blank=True)
    state_json = models.JSONField(null=True, blank=True)
    business_key = models.CharField(max_length=255, null=True, blank=True)
    subject_json = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(db_default={})
    version = models.BigIntegerField(db_default=0)
    error_type = models.CharField(max_length=128, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    scope_key = models.CharField(max_length=255, db_default=DEFAULT_SCOPE)
    definition_scope_key = models.CharField(max_length=255, db_default=DEFAULT_SCOPE)
    baseline_logged = models.BooleanField(db_default=True)

    class Meta:
        db_table = tables.qualified(tables.INSTANCES)
        verbose_name = "workflow instance"
        indexes = [
            models.Index(
                fields=["definition_id", "definition_version"], name="wf_inst_definition_idx"
            ),
            models.Index(fields=["status", "updated_at"], name="wf_inst_status_updated_idx"),
            # retention's purge candidates: archived rows only, oldest archive first
            models.Index(
                fields=["archived_at", "id"],
                name="wf_inst_archived_idx",
                condition=models.Q(archived_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.definition_id} v{self.definition_version} {self.id} ({self.status})"


class WorkflowHistory(models.Model):
    """Append-only history of an instance; ``sequence`` is dense per instance."""

    id = models.BigAutoField(primary_key=True)
    workflow = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="workflow_id",
        db_index=False,
        related_name="history",
    )
    sequence = models.BigIntegerField()
    event_type = models.CharField(max_length=64)
    payload_json = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    actor_kind = models.CharField(max_length=32, null=True, blank=True)
    actor_id = models.CharField(max_length=255, null=True, blank=True)
    actor_reason = models.CharField(max_length=255, null=True, blank=True)
    on_behalf_of = models.CharField(max_length=255, null=True, blank=True)
    attribution_status = models.CharField(max_length=32, null=True, blank=True)
    executor_id = models.CharField(max_length=255, null=True, blank=True)
    command_id = models.BigIntegerField(null=True, blank=True)
    step_id = models.CharField(max_length=255, null=True, blank=True)
    outcome = models.CharField(max_length=64, null=True, blank=True)
    definition_scope_key = models.CharField(max_length=255, null=True, blank=True)
    definition_id = models.CharField(max_length=255, null=True, blank=True)
    definition_version = models.IntegerField(null=True, blank=True)
    plan_hash = models.CharField(max_length=128, null=True, blank=True)
    state_version_before = models.BigIntegerField(null=True, blank=True)
    state_version_after = models.BigIntegerField(null=True, blank=True)
    patch_json = models.JSONField(null=True, blank=True)
    entry_version = models.SmallIntegerField(db_default=1)

    class Meta:
        db_table = tables.qualified(tables.HISTORY)
        verbose_name = "workflow history entry"
        verbose_name_plural = "workflow history"
        constraints = [
            models.UniqueConstraint(fields=["workflow", "sequence"], name="wf_history_wf_seq_uniq"),
        ]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.event_type}"


class WorkflowDedup(models.Model):
    """Idempotency and signal deduplication keys."""

    pk = models.CompositePrimaryKey("kind", "scope_key", "dedup_namespace", "key")
    kind = models.CharField(max_length=32)
    scope_key = models.CharField(max_length=255, db_default=DEFAULT_SCOPE)
    dedup_namespace = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    workflow_id = models.UUIDField()
    fingerprint = models.CharField(max_length=128)
    result_json = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.DEDUP)
        verbose_name = "workflow dedup key"
        indexes = [models.Index(fields=["workflow_id"], name="wf_dedup_workflow_idx")]


class WorkflowTimer(models.Model):
    """Durable timer; this row is the authoritative timer status."""

    id = models.UUIDField(primary_key=True)
    workflow_id = models.UUIDField()
    step_id = models.CharField(max_length=255)
    purpose = models.CharField(max_length=32)
    fire_at = models.DateTimeField()
    status = models.CharField(max_length=16)
    task_id = models.UUIDField(null=True, blank=True)
    branch_token_id = models.UUIDField(null=True, blank=True)
    fork_step_id = models.CharField(max_length=255, null=True, blank=True)
    branch_id = models.CharField(max_length=255, null=True, blank=True)
    delayed_job_execution_id = models.UUIDField(null=True, blank=True)
    metadata = models.JSONField(db_default={})
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    command_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = tables.qualified(tables.TIMERS)
        verbose_name = "workflow timer"
        indexes = [models.Index(fields=["workflow_id", "status"], name="wf_timer_workflow_idx")]
        constraints = [
            models.CheckConstraint(
                condition=_in("status", TimerStatus), name="workflow_timers_status_check"
            ),
            models.CheckConstraint(
                condition=_in("purpose", TimerPurpose), name="workflow_timers_purpose_check"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} timer at {self.fire_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class WorkflowTask(models.Model):
    """A human task opened by a task step."""

    id = models.UUIDField(primary_key=True)
    workflow_id = models.UUIDField()
    step_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    status = models.CharField(max_length=16)
    assignee = models.CharField(max_length=255, null=True, blank=True)
    candidates_json = models.JSONField(db_default=[])
    decisions_snapshot_json = models.JSONField(db_default={})
    decision = models.CharField(max_length=255, null=True, blank=True)
    result_json = models.JSONField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    branch_token_id = models.UUIDField(null=True, blank=True)
    fork_step_id = models.CharField(max_length=255, null=True, blank=True)
    branch_id = models.CharField(max_length=255, null=True, blank=True)
    version = models.BigIntegerField(db_default=0)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    scope_key = models.CharField(max_length=255, db_default=DEFAULT_SCOPE)
    reservation_command_id = models.BigIntegerField(null=True, blank=True)
    require_version_stability = models.BooleanField(null=True, blank=True)

    class Meta:
        db_table = tables.qualified(tables.TASKS)
        verbose_name = "workflow task"
        indexes = [
            models.Index(fields=["workflow_id"], name="wf_task_workflow_idx"),
            models.Index(fields=["assignee", "status"], name="wf_task_assignee_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=_in("status", TaskStatus), name="workflow_tasks_status_check"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class WorkflowBranchToken(models.Model):
    """Active branch execution state of a fork."""

    id = models.UUIDField(primary_key=True)
    workflow_id = models.UUIDField()
    fork_step_id = models.CharField(max_length=255)
    branch_id = models.CharField(max_length=255)
    status = models.CharField(max_length=32)
    current_step_id = models.CharField(max_length=255, null=True, blank=True)
    state_json = models.JSONField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(db_default=0)
    metadata = models.JSONField(db_default={})
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.BRANCH_TOKENS)
        verbose_name = "workflow branch token"
        indexes = [
            models.Index(fields=["workflow_id", "fork_step_id"], name="wf_branch_workflow_idx")
        ]

    def __str__(self) -> str:
        return f"{self.fork_step_id}/{self.branch_id} ({self.status})"


class WorkflowJoinState(models.Model):
    """Fan-in state of one join of one instance."""

    pk = models.CompositePrimaryKey("workflow_id", "join_step_id")
    workflow_id = models.UUIDField()
    join_step_id = models.CharField(max_length=255)
    fork_step_id = models.CharField(max_length=255)
    expected = models.IntegerField()
    arrived_json = models.JSONField(db_default=[])
    decided = models.BooleanField(db_default=False)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.JOIN_STATES)
        verbose_name = "workflow join state"


class WorkflowDefinition(models.Model):
    """Durable definition metadata (CODE rows) and source text (DOCUMENT rows)."""

    pk = models.CompositePrimaryKey("scope_key", "definition_id", "definition_version")
    scope_key = models.CharField(max_length=255, db_default=DEFAULT_SCOPE)
    definition_id = models.CharField(max_length=255)
    definition_version = models.IntegerField()
    kind = models.CharField(max_length=16)
    status = models.CharField(max_length=16)
    contract_name = models.CharField(max_length=255)
    state_type_name = models.CharField(max_length=255)
    plan_hash = models.CharField(max_length=128)
    name_binding = models.JSONField(db_default={})
    document_text = models.TextField(null=True, blank=True)
    document_digest = models.CharField(max_length=64, null=True, blank=True)
    document_format = models.CharField(max_length=16, null=True, blank=True)
    source_location = models.TextField(null=True, blank=True)
    publish_token = models.UUIDField(null=True, blank=True)
    publish_claimed_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.CharField(max_length=64, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    signal_names_json = models.JSONField(null=True, blank=True)
    start_schema_json = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = tables.qualified(tables.DEFINITIONS)
        verbose_name = "workflow definition"
        constraints = [
            models.CheckConstraint(
                condition=_in("kind", DefinitionKind), name="workflow_definitions_kind_check"
            ),
            models.CheckConstraint(
                condition=_in("status", DefinitionStatus), name="workflow_definitions_status_check"
            ),
            models.CheckConstraint(
                condition=~Q(kind="CODE") | Q(scope_key=DEFAULT_SCOPE),
                name="workflow_definitions_code_scope_check",
            ),
            models.CheckConstraint(
                condition=(
                    Q(kind="DOCUMENT", document_text__isnull=False, document_digest__isnull=False)
                    | Q(kind="CODE", document_text__isnull=True, document_digest__isnull=True)
                ),
                name="workflow_definitions_source_check",
            ),
            models.CheckConstraint(
                condition=Q(status="PUBLISHING", publish_token__isnull=False)
                | (~Q(status="PUBLISHING") & Q(publish_token__isnull=True)),
                name="workflow_definitions_publish_token_check",
            ),
        ]


class WorkflowDefinitionActivation(models.Model):
    """The current version of a definition id in a scope (no row: follow default)."""

    pk = models.CompositePrimaryKey("scope_key", "definition_id")
    scope_key = models.CharField(max_length=255)
    definition_id = models.CharField(max_length=255)
    target_scope_key = models.CharField(max_length=255)
    definition_version = models.IntegerField()
    activated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.ACTIVATIONS)
        verbose_name = "workflow definition activation"
        constraints = [
            models.CheckConstraint(
                condition=(
                    (Q(target_scope_key=models.F("scope_key")) | Q(target_scope_key=DEFAULT_SCOPE))
                    & (~Q(scope_key=DEFAULT_SCOPE) | Q(target_scope_key=DEFAULT_SCOPE))
                ),
                name="workflow_definition_activations_target_check",
            ),
        ]


class WorkflowCommand(models.Model):
    """One recorded command of an instance's command log."""

    id = models.BigAutoField(primary_key=True)
    workflow = models.ForeignKey(
        WorkflowInstance,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="workflow_id",
        db_index=False,
        related_name="commands",
    )
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=16)
    state = models.CharField(max_length=16)
    timer_kind = models.CharField(max_length=16, null=True, blank=True)
    timer_id = models.UUIDField(null=True, blank=True)
    task_id = models.UUIDField(null=True, blank=True)
    target_json = models.JSONField(null=True, blank=True)
    payload_json = models.JSONField(null=True, blank=True)
    dedup_key = models.CharField(max_length=255, null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True)
    claimed_by = models.CharField(max_length=255, null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    actor_kind = models.CharField(max_length=32, null=True, blank=True)
    actor_id = models.CharField(max_length=255, null=True, blank=True)
    actor_reason = models.CharField(max_length=255, null=True, blank=True)
    on_behalf_of = models.CharField(max_length=255, null=True, blank=True)
    attribution_status = models.CharField(max_length=32, null=True, blank=True)
    context_json = models.JSONField(null=True, blank=True)
    explicit_carrier_json = models.JSONField(null=True, blank=True)
    attempts = models.IntegerField(db_default=0)
    transient_count = models.IntegerField(db_default=0)
    deferral_count = models.IntegerField(db_default=0)
    recorded_at = models.DateTimeField(db_default=Now())
    fire_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(db_default=Now())
    settled_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)

    class Meta:
        db_table = tables.qualified(tables.COMMANDS)
        verbose_name = "workflow command"
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "seq"], name="workflow_commands_wf_seq_uniq"
            ),
            models.CheckConstraint(
                condition=_in("state", CommandState), name="workflow_commands_state_check"
            ),
            models.CheckConstraint(
                condition=_in("kind", CommandKind), name="workflow_commands_kind_check"
            ),
            models.CheckConstraint(
                # set exactly when kind is TIMER: IN alone is NULL (not false)
                # for a NULL timer_kind, and a CHECK admits NULL
                condition=(
                    Q(kind="TIMER") & Q(timer_kind__isnull=False) & _in("timer_kind", TimerKind)
                )
                | (~Q(kind="TIMER") & Q(timer_kind__isnull=True)),
                name="workflow_commands_timer_kind_check",
            ),
        ]
        indexes = [
            models.Index(
                fields=["workflow", "seq"],
                name="wf_cmd_active_seq_idx",
                condition=Q(state__in=["PENDING", "DEFERRED", "CLAIMED"]),
            ),
            models.Index(
                fields=["available_at"],
                name="wf_cmd_active_avail_idx",
                condition=Q(state__in=["PENDING", "DEFERRED", "CLAIMED"]),
            ),
            models.Index(
                fields=["workflow"],
                name="wf_cmd_parked_dead_idx",
                condition=Q(state__in=["PARKED", "DEAD"]),
            ),
        ]
        triggers = [CommandNotifyTrigger()]

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq} ({self.state})"


class WorkflowCommandQueue(models.Model):
    """Per-instance next command sequence and open-signal counter."""

    workflow = models.OneToOneField(
        WorkflowInstance,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_column="workflow_id",
        primary_key=True,
        related_name="command_queue",
    )
    next_seq = models.BigIntegerField()
    open_signals = models.IntegerField(db_default=0)

    class Meta:
        db_table = tables.qualified(tables.COMMAND_QUEUES)
        verbose_name = "workflow command queue"

    def __str__(self) -> str:
        return f"queue of {self.workflow_id} (next {self.next_seq})"


class ServiceCallState(models.TextChoices):
    """States of a service outbox row (``workflow_service_outbox.state``)."""

    PENDING = "PENDING"  # waiting for a relay (first call or a retry's backoff)
    CLAIMED = "CLAIMED"  # a relay holds the lease and is calling the handler
    DELIVERED = "DELIVERED"  # the outcome was recorded on the instance as a signal
    CANCELLED = "CANCELLED"  # the instance ended before the call was delivered


class WorkflowServiceCall(models.Model):
    """One dispatch of a ``service`` step: the outbox row the segment recorded.

    Written in the segment's transaction (so a rolled-back segment leaves
    none), claimed by a relay with ``SKIP LOCKED``, delivered back to the
    instance as a deduplicated signal whose dedup key is ``dispatch_key``.
    The retry policy is copied from the plan, so a relay needs the handler,
    never the plan.
    """

    id = models.BigAutoField(primary_key=True)
    workflow_id = models.UUIDField()
    command_id = models.BigIntegerField(null=True, blank=True)
    step_id = models.CharField(max_length=255)
    branch_token_id = models.UUIDField(null=True, blank=True)
    fork_step_id = models.CharField(max_length=255, null=True, blank=True)
    branch_id = models.CharField(max_length=255, null=True, blank=True)
    dispatch_key = models.CharField(max_length=512)
    handler = models.CharField(max_length=255)
    request_json = models.JSONField(null=True, blank=True)
    policy_json = models.JSONField(db_default={})
    state = models.CharField(max_length=16, db_default=ServiceCallState.PENDING)
    attempts = models.IntegerField(db_default=0)
    claim_token = models.UUIDField(null=True, blank=True)
    claimed_by = models.CharField(max_length=255, null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(null=True, blank=True)
    outcome = models.CharField(max_length=16, null=True, blank=True)
    context_json = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = tables.qualified(tables.SERVICE_OUTBOX)
        verbose_name = "workflow service call"
        constraints = [
            models.UniqueConstraint(
                fields=["workflow_id", "dispatch_key"], name="wf_svc_dispatch_key_uniq"
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in ServiceCallState]),
                name="wf_svc_state_check",
            ),
        ]
        indexes = [
            models.Index(
                fields=["available_at"],
                name="wf_svc_pending_avail_idx",
                condition=Q(state="PENDING"),
            ),
            models.Index(
                fields=["lease_until"],
                name="wf_svc_claimed_lease_idx",
                condition=Q(state="CLAIMED"),
            ),
            models.Index(fields=["workflow_id"], name="wf_svc_workflow_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.handler} for {self.workflow_id} ({self.state})"


class WorkflowEvent(models.Model):
    """One workflow event for external consumers (the events recorder's outbox).

    ``txid`` is the recording transaction's id (``pg_current_xact_id()``):
    consumers read in ``(txid, id)`` order and only below the oldest running
    transaction, so an event committed late is never skipped by a cursor
    that moved past a newer one.
    """

    id = models.BigAutoField(primary_key=True)
    txid = models.BigIntegerField()
    workflow_id = models.UUIDField()
    event_type = models.CharField(max_length=64)
    step_id = models.CharField(max_length=255, null=True, blank=True)
    fork_step_id = models.CharField(max_length=255, null=True, blank=True)
    branch_id = models.CharField(max_length=255, null=True, blank=True)
    command_id = models.BigIntegerField(null=True, blank=True)
    definition_id = models.CharField(max_length=255)
    definition_version = models.IntegerField()
    data_json = models.JSONField(db_default={})
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.EVENTS)
        verbose_name = "workflow event"
        indexes = [
            models.Index(fields=["txid", "id"], name="wf_event_txid_id_idx"),
            models.Index(fields=["workflow_id", "id"], name="wf_event_workflow_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} of {self.workflow_id}"


class WorkflowEventConsumer(models.Model):
    """A named consumer's acknowledged position in ``workflow_events``."""

    id = models.BigAutoField(primary_key=True)
    consumer = models.CharField(max_length=255)
    last_txid = models.BigIntegerField(db_default=0)
    last_id = models.BigIntegerField(db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = tables.qualified(tables.EVENT_CONSUMERS)
        verbose_name = "workflow event consumer"
        # a named constraint, not unique=True: Django names the extra
        # varchar_pattern_ops index of a unique CharField after the qualified
        # table, which would differ between placements
        constraints = [models.UniqueConstraint(fields=["consumer"], name="wf_event_consumer_uniq")]

    def __str__(self) -> str:
        return f"{self.consumer} at ({self.last_txid}, {self.last_id})"
