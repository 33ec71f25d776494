"""What a page of instances is waiting for and whether it needs attention, in a few queries.

Why a module: the instance list shows, per row, the open task, the
scheduled timer, the live branches, the dead letters and the stuck commands.
Read per row, that is five queries a row; here it is one query per kind for
the whole page (``workflow_id IN (<the page's ids>)``, each served by an
index on ``workflow_id``), whatever the page size. The same conditions, as
``EXISTS`` subqueries, are the list's filters.

"Stuck" follows the execution probe: a command claimed under a lease that
has expired, or an open command (PENDING, DEFERRED, CLAIMED) first
available longer than ``STUCK_AFTER_SECONDS`` ago. Dead letters are
counted on their own.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Count, Exists, F, OuterRef, Q, When
from django.db.models.functions import Left, Now

from ..conf import workflow_settings
from ..definitions import catalog
from ..models import WorkflowBranchToken, WorkflowCommand, WorkflowTask, WorkflowTimer
from ..pins import resident_plan

OPEN_TASK = ("OPEN", "COMPLETING")
LIVE_BRANCH = ("RUNNING", "WAITING", "RETRY_SCHEDULED", "FAILED")
ACTIVE_COMMAND = ("PENDING", "DEFERRED", "CLAIMED")
ENDED = ("COMPLETED", "COMPENSATED", "CANCELLED", "EXPIRED")
LAST_ERROR_CHARS = 300


def stuck_condition() -> Q:
    """Commands that are stuck: claimed under an expired lease, or open too long.

    Reads the ``_since`` annotation (fire time of a timer, else recording time).
    """
    age = datetime.timedelta(seconds=float(workflow_settings.STUCK_AFTER_SECONDS))
    return Q(state="CLAIMED", lease_until__lt=Now()) | Q(
        Q(state__in=ACTIVE_COMMAND) & Q(**{"_since__lt": Now() - age})
    )


def since() -> Case:
    return Case(When(kind="TIMER", then=F("fire_at")), default=F("recorded_at"))


def stuck_commands() -> Any:
    """A queryset of the stuck commands."""
    return WorkflowCommand.objects.annotate(_since=since()).filter(stuck_condition())


def exists_condition(name: str) -> Q:
    """The instance-list filter conditions, as EXISTS subqueries on the page's rows."""
    mine = OuterRef("pk")
    if name == "task":
        return Q(Exists(WorkflowTask.objects.filter(workflow_id=mine, status__in=OPEN_TASK)))
    if name == "timer":
        return Q(Exists(WorkflowTimer.objects.filter(workflow_id=mine, status="SCHEDULED")))
    if name == "branches":
        return Q(
            Exists(WorkflowBranchToken.objects.filter(workflow_id=mine, status__in=LIVE_BRANCH))
        )
    if name == "dead":
        return Q(Exists(WorkflowCommand.objects.filter(workflow_id=mine, state="DEAD")))
    if name == "parked":
        return Q(Exists(WorkflowCommand.objects.filter(workflow_id=mine, state="PARKED")))
    if name == "stuck":
        return Q(Exists(stuck_commands().filter(workflow_id=mine)))
    if name == "failed":
        return Q(status="FAILED")
    if name == "attention":
        return exists_condition("failed") | exists_condition("dead") | exists_condition("stuck")
    if name == "signal":
        return waiting_at_wait_steps()
    raise ValueError(name)


def waiting_at_wait_steps() -> Q:
    """WAITING instances standing at a ``wait`` step of a plan in this node's catalog."""
    condition = Q(pk__in=[])
    for plan in catalog.all():
        steps = [step.id for step in plan.steps.values() if step.kind == "wait"]
        if steps:
            condition |= Q(
                definition_id=plan.id,
                definition_version=plan.version,
                current_step_id__in=steps,
            )
    return Q(status="WAITING") & condition


@dataclass
class Facts:
    """What one instance of the page waits for and why it needs attention."""

    tasks: list[dict[str, Any]] = field(default_factory=list)
    timers: list[dict[str, Any]] = field(default_factory=list)
    branches: dict[str, int] = field(default_factory=dict)  # status -> count
    branch_steps: set[str] = field(default_factory=set)
    dead: int = 0
    parked: int = 0
    stuck: int = 0
    dead_error: str | None = None
    signals: tuple[str, ...] = ()
    step_kind: str | None = None

    def waiting_for(self) -> list[str]:
        found = []
        if self.signals:
            found.append("signal " + ", ".join(self.signals))
        for task in self.tasks:
            who = task["assignee"] or "candidates"
            found.append(f"task {task['name']} ({who}, {task['status']})")
        for timer in self.timers:
            found.append(f"timer {timer['purpose']} at {timer['fire_at']:%Y-%m-%d %H:%M:%S}")
        if self.branches:
            counts = ", ".join(f"{n} {status}" for status, n in sorted(self.branches.items()))
            found.append(f"branches ({counts})")
        if self.parked:
            found.append(f"{self.parked} parked signal(s)")
        return found

    def attention(self, status: str) -> list[str]:
        reasons = []
        if status == "FAILED":
            reasons.append("FAILED")
        if self.dead:
            reasons.append(f"{self.dead} dead letter(s)")
        if self.stuck:
            reasons.append(f"{self.stuck} stuck command(s)")
        return reasons


def _plan_step(row: Any) -> Any:
    try:
        plan = resident_plan(
            row.definition_id, row.definition_version, scope=row.definition_scope_key
        )
    except Exception:  # a plan this node cannot build: no step facts, never a failing list
        return None
    if plan is None or row.current_step_id is None:
        return None
    return plan.steps.get(row.current_step_id)


def page_facts(rows: list[Any]) -> dict[Any, Facts]:
    """Facts of a page of instances: four queries, whatever the number of rows."""
    facts = {row.pk: Facts() for row in rows}
    ids = list(facts)
    if not ids:
        return facts
    for task in WorkflowTask.objects.filter(workflow_id__in=ids, status__in=OPEN_TASK).values(
        "workflow_id", "name", "assignee", "status", "step_id"
    ):
        facts[task["workflow_id"]].tasks.append(task)
    for timer in (
        WorkflowTimer.objects.filter(workflow_id__in=ids, status="SCHEDULED")
        .order_by("fire_at")
        .values("workflow_id", "purpose", "fire_at", "step_id")
    ):
        facts[timer["workflow_id"]].timers.append(timer)
    for group in (
        WorkflowBranchToken.objects.filter(workflow_id__in=ids, status__in=LIVE_BRANCH)
        .values("workflow_id", "status", "current_step_id")
        .annotate(n=Count("id"))
        .order_by()
    ):
        item = facts[group["workflow_id"]]
        item.branches[group["status"]] = item.branches.get(group["status"], 0) + group["n"]
        if group["current_step_id"] and group["status"] in ("RUNNING", "WAITING"):
            item.branch_steps.add(group["current_step_id"])
    commands = (
        WorkflowCommand.objects.filter(workflow_id__in=ids)
        .filter(Q(state__in=("DEAD", "PARKED")) | Q(state__in=ACTIVE_COMMAND))
        .annotate(_since=since())
        .values("workflow_id")
        .annotate(
            dead=Count("id", filter=Q(state="DEAD")),
            parked=Count("id", filter=Q(state="PARKED")),
            stuck=Count("id", filter=stuck_condition()),
        )
        .order_by()
    )
    dead_ids = []
    for group in commands:
        item = facts[group["workflow_id"]]
        item.dead, item.parked, item.stuck = group["dead"], group["parked"], group["stuck"]
        if item.dead:
            dead_ids.append(group["workflow_id"])
    if dead_ids:
        latest: dict[Any, str] = defaultdict(str)
        for command in (
            WorkflowCommand.objects.filter(workflow_id__in=dead_ids, state="DEAD")
            .annotate(error=Left("last_error", LAST_ERROR_CHARS))
            .order_by("workflow_id", "-seq")
            .distinct("workflow_id")
            .values("workflow_id", "kind", "error")
        ):
            latest[command["workflow_id"]] = f"{command['kind']}: {command['error'] or ''}"
        for workflow_id, text in latest.items():
            facts[workflow_id].dead_error = text
    for row in rows:
        if row.status not in ENDED:
            step = _plan_step(row)
            if step is not None:
                facts[row.pk].step_kind = step.kind
                if step.kind == "wait" and row.status == "WAITING":
                    facts[row.pk].signals = tuple(step.signals)
    return facts
