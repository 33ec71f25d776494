"""``manage.py workflow_retention``: archive ended instances, purge archived ones.

    workflow_retention [--archive STATUS=AGE ...] [--purge-archived AGE]
                       [--batch N] [--max-seconds S] [--dry-run]

AGE is a number with a unit: ``30d``, ``12h``, ``90m``, ``3600s``. Without
``--archive`` / ``--purge-archived`` the settings ``RETENTION_ARCHIVE`` and
``RETENTION_PURGE_ARCHIVED_SECONDS`` apply. Prints a line per batch and a
summary. Safe from cron on several nodes at once: two runs never take the
same instance, and running work is skipped (see ``vertique_workflow.retention``).
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import retention
from ...conf import workflow_settings
from ...exceptions import WorkflowError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_age(text: str) -> float:
    """Seconds of an AGE like ``30d``; CommandError for anything else."""
    match = AGE.match(text.strip())
    if match is None:
        raise CommandError(f"{text!r} is not an age: use a number and a unit s, m, h or d (30d)")
    return float(match.group(1)) * UNITS[match.group(2)]


def parse_archive(values: list[str]) -> dict[str, float]:
    ages: dict[str, float] = {}
    for value in values:
        status, sep, age = value.partition("=")
        status = status.strip().upper()
        if not sep or not status:
            raise CommandError(f"--archive takes STATUS=AGE (COMPLETED=30d), not {value!r}")
        if status not in retention.STATUSES:
            raise CommandError(
                f"unknown status {status!r}: one of {', '.join(sorted(retention.STATUSES))}"
            )
        if status in ages:
            raise CommandError(f"--archive names {status} twice")
        ages[status] = parse_age(age)
    return ages


class Command(BaseCommand):
    help = "Archive ended workflow instances and purge archived ones, in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--archive",
            action="append",
            default=[],
            metavar="STATUS=AGE",
            help="archive instances of STATUS last changed more than AGE ago (repeatable)",
        )
        parser.add_argument(
            "--purge-archived",
            metavar="AGE",
            help="purge instances archived more than AGE ago (with every row of theirs)",
        )
        parser.add_argument(
            "--batch", type=int, metavar="N", help="instances per batch (RETENTION_BATCH)"
        )
        parser.add_argument(
            "--max-seconds",
            type=float,
            metavar="S",
            help="stop starting batches after S seconds (a later run goes on)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        given = bool(options["archive"]) or options["purge_archived"] is not None
        ages = parse_archive(options["archive"]) if given else None
        purge = None
        if options["purge_archived"] is not None:
            purge = parse_age(options["purge_archived"])
        elif not given:
            purge = workflow_settings.RETENTION_PURGE_ARCHIVED_SECONDS
        if given and not ages:
            ages = {}
        batch = options["batch"]
        if batch is not None and batch < 1:
            raise CommandError("--batch must be at least 1")
        if options["max_seconds"] is not None and options["max_seconds"] <= 0:
            raise CommandError("--max-seconds must be positive")
        planned = workflow_settings.RETENTION_ARCHIVE if ages is None else ages
        if not planned and purge is None:
            self.stdout.write(
                "nothing to do: give --archive STATUS=AGE and/or --purge-archived AGE, "
                "or set RETENTION_ARCHIVE / RETENTION_PURGE_ARCHIVED_SECONDS"
            )
            return
        totals: dict[str, int] = {}

        def progress(result: retention.BatchResult) -> None:
            what = f"archive {result.status}" if result.action == "archive" else "purge"
            totals[what] = totals.get(what, 0) + result.processed
            self.stdout.write(
                f"{what}: batch of {result.candidates}: {result.processed} "
                f"{'archived' if result.action == 'archive' else 'purged'}, {result.busy} busy, "
                f"{result.left_alone} left alone ({totals[what]} so far)"
            )

        try:
            summary = retention.sweep(
                archive_ages=planned,
                purge_archived_age=purge,
                batch=batch,
                max_seconds=options["max_seconds"],
                progress=progress if options["verbosity"] >= 1 else None,
            )
        except WorkflowError as exc:
            raise CommandError(str(exc)) from None
        archived = ", ".join(f"{n} {status}" for status, n in summary.archived.items()) or "none"
        self.stdout.write(
            f"retention {'done' if summary.complete else 'stopped at --max-seconds'}: "
            f"archived {archived}; purged {summary.purged}; {summary.busy} busy (a later run "
            f"takes them), {summary.left_alone} left alone (active commands); "
            f"{summary.batches} batches in {summary.seconds:.1f} s"
        )
