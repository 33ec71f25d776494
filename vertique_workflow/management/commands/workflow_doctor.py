"""``manage.py workflow_doctor``: what needs a human, each with the action that fixes it.

    workflow_doctor [--json] [--limit N]

Exits 0 and prints "healthy" when nothing is found, and exits 1 after
printing the findings otherwise — for monitoring (a cron job, a health check).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import doctor


class Command(BaseCommand):
    help = "List what needs a human (stranded instances, dead letters, ...) and how to fix it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--limit", type=int, default=20, metavar="N", help="examples per finding (20)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        report = doctor.diagnose(limit=options["limit"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), default=str, indent=2))
        elif report.healthy:
            self.stdout.write("healthy: nothing needs a human")
        else:
            for finding in report.findings:
                self.stdout.write(f"{finding.kind}: {finding.title} ({finding.count})")
                for example in finding.examples:
                    shown = ", ".join(f"{k}={v}" for k, v in example.items() if v is not None)
                    self.stdout.write(f"    {shown}")
                if finding.count > len(finding.examples):
                    self.stdout.write(f"    ... and {finding.count - len(finding.examples)} more")
                self.stdout.write(f"  fix: {finding.fix}")
        if not report.healthy:
            self.stdout.flush()
            sys.exit(1)
