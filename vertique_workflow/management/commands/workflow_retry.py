"""``manage.py workflow_retry``: repair FAILED instances and dead-lettered commands.

workflow_retry ID [ID ...]          retry these instances
workflow_retry --failed             every FAILED instance
workflow_retry --dead-letters       every instance holding dead-lettered commands
    [--definition ID] [--dry-run] [--reason TEXT] [--limit N]

Each retry records a RETRY command in a transaction of its own (``wf.retry``);
an executor then runs it. Fix the cause first (deploy the code, restore the
record). Instances with nothing to retry are skipped and counted.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import operations
from ...context import Actor
from ...exceptions import WorkflowConflict, WorkflowNotFound
from ...store import instances

PAGE = 500


class Command(BaseCommand):
    help = "Retry FAILED workflow instances and re-offer their dead-lettered commands."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID", help="instance ids to retry")
        parser.add_argument("--failed", action="store_true", help="select every FAILED instance")
        parser.add_argument(
            "--dead-letters",
            action="store_true",
            help="select every instance holding dead-lettered commands",
        )
        parser.add_argument("--definition", metavar="ID", help="only instances of this definition")
        parser.add_argument(
            "--dry-run", action="store_true", help="list what would be retried, record nothing"
        )
        parser.add_argument("--reason", help="stored as the reason of the retries (audit)")
        parser.add_argument(
            "--limit", type=int, default=None, metavar="N", help="retry at most N instances"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids: list[str] = options["ids"]
        selecting = options["failed"] or options["dead_letters"]
        if ids and (selecting or options["definition"]):
            raise CommandError("give instance ids or a filter (--failed/--dead-letters), not both")
        if not ids and not selecting:
            raise CommandError("give instance ids, or select with --failed and/or --dead-letters")
        if options["definition"] and not selecting:
            raise CommandError("--definition narrows --failed/--dead-letters")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        targets = [self._parse(value) for value in ids] if ids else None
        actor = Actor.system("workflow_retry", reason=options["reason"])
        retried = skipped = seen = 0
        for instance_id, label in self._targets(targets, options):
            if options["limit"] is not None and seen >= options["limit"]:
                break
            seen += 1
            if options["dry_run"]:
                self.stdout.write(f"would retry {instance_id} ({label})")
                continue
            try:
                receipt = operations.retry(instance_id, actor=actor, reason=options["reason"])
            except (WorkflowConflict, WorkflowNotFound) as exc:
                skipped += 1
                self.stdout.write(f"skipped {instance_id}: {exc}")
                continue
            retried += 1
            state = "already queued" if receipt.duplicate else "queued"
            self.stdout.write(f"retry of {instance_id} {state} (command {receipt.command_id})")
            if retried % 100 == 0:
                self.stderr.write(f"... {retried} retried, {skipped} skipped")
        if options["dry_run"]:
            self.stdout.write(f"dry run: {seen} instance(s) would be retried")
        else:
            self.stdout.write(f"{retried} retried, {skipped} skipped")

    def _parse(self, value: str) -> uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError:
            raise CommandError(f"not an instance id: {value[:64]!r}") from None

    def _targets(self, ids: list[uuid.UUID] | None, options: dict[str, Any]) -> Any:
        if ids is not None:
            for instance_id in ids:
                yield instance_id, "given"
            return
        after = uuid.UUID(int=0)
        while True:
            page = instances.retry_candidates(
                definition_id=options["definition"],
                failed=options["failed"],
                dead=options["dead_letters"],
                after=after,
                limit=PAGE,
            )
            for instance_id, definition_id, version, status, dead in page:
                yield instance_id, f"{definition_id} v{version}, {status}, {dead} dead"
            if len(page) < PAGE:
                return
            after = page[-1][0]
