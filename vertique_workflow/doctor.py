"""The doctor: what needs a human, and the action that fixes each finding.

``diagnose()`` reads the workflow tables (bounded reads on a connection of
their own, no lock) and returns a :class:`DoctorReport`: one
:class:`Finding` per kind of trouble found, each with a count, up to
``limit`` examples and the fix. Nothing is a finding on a healthy database.
``manage.py workflow_doctor`` prints it and exits 1 when something is found
(for monitoring); the admin shows it on the instance list's *Doctor* page.

The kinds, in the order they are reported:

- ``STRANDED``: RUNNING or PENDING with no active command — no executor will
  ever run it (a PENDING instance whose START was dead-lettered is a dead
  letter instead).
- ``WAITING_FOREVER``: WAITING with nothing that could wake it: no scheduled
  timer, no open task, no signal its version declares, no live child, no
  service call in flight, no active command.
- ``DEAD_LETTERS``: commands that spent their attempts (or failed for good).
- ``PARKED_SIGNALS``: signals parked longer than ``DOCTOR_PARKED_AFTER_SECONDS``
  (the instance does not wait for them).
- ``DEFERRED_FOREVER``: commands deferred ``DOCTOR_DEFERRALS`` times or more:
  no node that saw them has the plan (names the version, its plan hash and
  the node that deferred it last).
- ``LEASE_EXPIRING``: active commands whose attempts were spent by expired
  leases, not by errors (a process dies, or segments outlive LEASE_SECONDS).
- ``STUCK_SERVICE_CALLS``: service calls held by a relay past their lease, or
  due for longer than ``DOCTOR_SERVICE_STUCK_SECONDS`` (no relay runs).
- ``NOTIFY_QUEUE``: the LISTEN/NOTIFY queue fuller than
  ``DOCTOR_NOTIFY_QUEUE_PERCENT`` (a listener that stopped reading).
- ``STALE_STATISTICS``: workflow tables with many changes since their last
  analyze, analyzed longer than ``DOCTOR_STALE_STATS_SECONDS`` ago or never:
  the claim's plans degrade on stale statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import tables
from .conf import workflow_settings
from .store import doctor as reads

# a table's statistics are stale only with this many changes since the analyze
# (and 10 % of its rows): small tables are planned well whatever their stats
STALE_MIN_CHANGES = 1000


@dataclass(frozen=True)
class Finding:
    """One kind of trouble: how many, some examples, and what fixes it."""

    kind: str
    title: str
    count: int
    examples: list[dict[str, Any]]
    fix: str


@dataclass(frozen=True)
class DoctorReport:
    findings: list[Finding]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "findings": [
                {
                    "kind": f.kind,
                    "title": f.title,
                    "count": f.count,
                    "fix": f.fix,
                    "examples": f.examples,
                }
                for f in self.findings
            ],
            "figures": self.figures,
        }


def _examples(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> tuple[int, list[dict]]:
    """(total count, example dicts) of rows whose last column is ``count(*) OVER ()``."""
    if not rows:
        return 0, []
    return int(rows[0][-1]), [dict(zip(names, row[:-1], strict=True)) for row in rows]


INSTANCE_COLUMNS = ("instance_id", "definition_id", "version", "status", "step", "updated_at")


def diagnose(*, limit: int = 100) -> DoctorReport:
    """Everything that needs a human now, at most ``limit`` examples per finding."""
    with reads.session():  # one connection for all the reads
        return _diagnose(limit)


def _diagnose(limit: int) -> DoctorReport:
    limit = max(1, min(int(limit), 1000))
    s = workflow_settings
    findings: list[Finding] = []

    def add(kind: str, title: str, rows: list[tuple[Any, ...]], names: tuple, fix: str) -> None:
        count, examples = _examples(rows, names)
        if count:
            findings.append(Finding(kind, title, count, examples, fix))

    add(
        "STRANDED",
        "Instances RUNNING or PENDING with no command that could run them",
        reads.read(reads.STRANDED, {"limit": limit}),
        INSTANCE_COLUMNS,
        "Nothing will run these: cancel them (admin: Cancel; wf.cancel(id, reason=...)). If "
        "their command rows were edited or deleted by hand, restore them from a backup.",
    )
    add(
        "WAITING_FOREVER",
        "Instances WAITING with nothing that could ever wake them",
        reads.read(reads.WAITING_FOREVER, {"limit": limit}),
        INSTANCE_COLUMNS,
        "No timer, task, declared signal, child or service call can wake these: cancel them "
        "(admin: Cancel; wf.cancel(id, reason=...)), or migrate them to a version that goes on "
        "(wf.migrate(id, to_version=N)).",
    )
    add(
        "DEAD_LETTERS",
        "Dead-lettered commands",
        reads.read(reads.DEAD_LETTERS, {"limit": limit}),
        ("instance_id", "command_id", "kind", "attempts", "last_error", "settled_at"),
        "Fix the cause named in last_error, then retry: python manage.py workflow_retry "
        "--dead-letters (or wf.retry(id); admin: Retry).",
    )
    add(
        "PARKED_SIGNALS",
        f"Signals parked for more than {s.DOCTOR_PARKED_AFTER_SECONDS} s",
        reads.read(reads.PARKED_OLD, {"limit": limit, "age": s.DOCTOR_PARKED_AFTER_SECONDS}),
        ("instance_id", "command_id", "signal", "recorded_at"),
        "The instance does not wait for these signals: drive it to the wait that accepts them "
        "(send the signal it waits for), retry it if it FAILED (parked signals run after the "
        "retry), or cancel it.",
    )
    add(
        "DEFERRED_FOREVER",
        f"Commands deferred {s.DOCTOR_DEFERRALS} times or more (no node has their plan)",
        reads.read(reads.DEFERRED_FOREVER, {"limit": limit, "deferrals": s.DOCTOR_DEFERRALS}),
        (
            "instance_id",
            "command_id",
            "definition_scope",
            "definition_id",
            "version",
            "plan_hash",
            "deferrals",
            "last_deferred_by",
            "last_error",
        ),
        "No executor that saw these has code (or a published document) for that definition "
        "version: deploy it (the version's code in a workflows.py, or python manage.py "
        "workflow_definitions publish), or migrate the instances to a version the nodes have.",
    )
    add(
        "LEASE_EXPIRING",
        "Commands whose attempts are spent by expired leases",
        reads.read(reads.LEASE_EXPIRING, {"limit": limit, "attempts": 2}),
        ("instance_id", "command_id", "kind", "state", "attempts", "claimed_by", "lease_until"),
        "Executors die or stall while running these (OOM kills, segments longer than "
        "LEASE_SECONDS): look at the executor logs of claimed_by; raise LEASE_SECONDS above "
        "the longest segment (SEGMENT_DEADLINE_MS bounds it).",
    )
    add(
        "STUCK_SERVICE_CALLS",
        f"Service calls held past their lease or due for more than "
        f"{s.DOCTOR_SERVICE_STUCK_SECONDS} s",
        reads.read(
            reads.STUCK_SERVICE_CALLS, {"limit": limit, "age": s.DOCTOR_SERVICE_STUCK_SECONDS}
        ),
        (
            "instance_id",
            "call_id",
            "handler",
            "state",
            "attempts",
            "claimed_by",
            "lease_until",
            "available_at",
            "last_error",
        ),
        "No relay serves these: run manage.py workflow_executor without --no-relay, or "
        "manage.py workflow_relay; a call CLAIMED past its lease is a relay that died or a "
        "handler that hangs (its step's timeout bounds the next attempt).",
    )
    usage = float(reads.read(reads.NOTIFY_QUEUE, {})[0][0] or 0.0)
    figures: dict[str, Any] = {"notification_queue_usage": usage}
    if notify_queue_full(usage, s.DOCTOR_NOTIFY_QUEUE_PERCENT):
        findings.append(
            Finding(
                "NOTIFY_QUEUE",
                f"The LISTEN/NOTIFY queue is {usage:.0%} full",
                1,
                [{"usage": usage}],
                "A session LISTENs and stopped reading (a stuck process, a transaction left "
                "open by a listener): find it in pg_stat_activity and end it. Executors fall "
                "back to polling when notifications stop.",
            )
        )
    stale = _stale_tables(s.DOCTOR_STALE_STATS_SECONDS)
    figures["tables"] = stale[1]
    if stale[0]:
        findings.append(
            Finding(
                "STALE_STATISTICS",
                "Workflow tables changed a lot since their statistics were taken",
                len(stale[0]),
                stale[0][:limit],
                "Run ANALYZE on these tables, and check autovacuum runs on them "
                "(autovacuum_enabled, pg_stat_all_tables.last_autoanalyze): the claim's "
                "plans degrade on stale statistics.",
            )
        )
    return DoctorReport(findings, figures)


def notify_queue_full(usage: float, percent: int) -> bool:
    """Whether ``pg_notification_queue_usage()`` (a fraction) reaches ``percent``."""
    return usage * 100 >= percent


def _stale_tables(max_age: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    names = [*tables.ALL_TABLES, *tables.SIDE_EFFECT_TABLES]
    rows = reads.read(reads.TABLE_STATS, {"schema": tables.configured_schema(), "tables": names})
    stale, figures = [], []
    for name, live, changed, analyzed_at, age in rows:
        entry = {
            "table": name,
            "live_rows": int(live or 0),
            "changed_since_analyze": int(changed or 0),
            "last_analyzed": analyzed_at,
        }
        figures.append(entry)
        many = entry["changed_since_analyze"] >= max(STALE_MIN_CHANGES, entry["live_rows"] // 10)
        old = analyzed_at is None or float(age) > max_age
        if many and old:
            stale.append(entry)
    return stale, figures
