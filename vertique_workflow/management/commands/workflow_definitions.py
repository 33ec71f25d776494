"""``manage.py workflow_definitions``: record, list and manage registry versions.

workflow_definitions sync
workflow_definitions list [--scope S] [--id ID] [--status STATUS ...]
workflow_definitions deprecate ID VERSION [--scope S]
workflow_definitions reinstate ID VERSION [--scope S]
workflow_definitions retire ID VERSION [--scope S]
workflow_definitions activate ID VERSION [--scope S] [--target-scope T]
workflow_definitions deactivate ID [--scope S]
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import registry
from ...exceptions import WorkflowError
from ...store import definitions as store

STATUSES = ("CANDIDATE", "PUBLISHING", "AVAILABLE", "DEPRECATED", "RETIRED")


class Command(BaseCommand):
    help = "Record code definitions and manage definition versions and activations."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        actions.add_parser("sync", help="Record every code workflow of this project as a CODE row.")

        listing = actions.add_parser(
            "list",
            help="List registry rows (no document text) with their instance counts: LIVE "
            "(pending, running, waiting, compensating) and FAILED.",
        )
        listing.add_argument("--scope", help="Only this scope.")
        listing.add_argument("--id", dest="definition_id", help="Only this definition id.")
        listing.add_argument(
            "--status", action="append", choices=STATUSES, help="Only this status (repeatable)."
        )

        helps = {
            "deprecate": "AVAILABLE -> DEPRECATED (no new starts; running instances continue).",
            "reinstate": "DEPRECATED or RETIRED -> AVAILABLE.",
            "retire": "CANDIDATE or DEPRECATED -> RETIRED (refused while instances pin it).",
            "activate": "Make a version current for new starts in a scope.",
        }
        for name, text in helps.items():
            sub = actions.add_parser(name, help=text)
            sub.add_argument("definition_id", metavar="ID")
            sub.add_argument("version", metavar="VERSION", type=int)
            sub.add_argument("--scope", default=store.DEFAULT_SCOPE)
            if name == "activate":
                sub.add_argument(
                    "--target-scope",
                    help="Scope holding the version's row: the scope itself (default) or "
                    "'default' (the scope follows a default-scope version).",
                )

        deactivate = actions.add_parser("deactivate", help="Remove a scope's activation record.")
        deactivate.add_argument("definition_id", metavar="ID")
        deactivate.add_argument("--scope", default=store.DEFAULT_SCOPE)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            getattr(self, f"do_{action}")(options)
        except WorkflowError as exc:
            raise CommandError(str(exc)) from exc

    def do_sync(self, options: dict[str, Any]) -> None:
        outcomes = registry.sync_code_definitions()
        if not outcomes:
            self.stdout.write("no code workflows found")
        for (definition_id, version), outcome in outcomes.items():
            self.stdout.write(f"{definition_id} v{version}: {outcome}")

    def do_list(self, options: dict[str, Any]) -> None:
        records = store.list_definitions(
            scope=options["scope"],
            definition_id=options["definition_id"],
            statuses=options["status"],
        )
        counts = store.instance_counts(
            scope=options["scope"], definition_id=options["definition_id"]
        )
        header = ("SCOPE", "ID", "VERSION", "STATUS", "KIND", "HASH", "LIVE", "FAILED", "CONTRACT")
        lines = [header]
        for r in records:
            live, failed = counts.get((r.scope_key, r.definition_id, r.version), (0, 0))
            lines.append(
                (
                    r.scope_key,
                    r.definition_id,
                    str(r.version),
                    r.status,
                    r.kind,
                    r.plan_hash[:12],
                    str(live),
                    str(failed),
                    r.contract_name,
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        for line in lines:
            self.stdout.write(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(line, widths, strict=True)
                ).rstrip()
            )

    def do_deprecate(self, options: dict[str, Any]) -> None:
        registry.deprecate(options["definition_id"], options["version"], options["scope"])
        self._done("deprecated", options)

    def do_reinstate(self, options: dict[str, Any]) -> None:
        registry.reinstate(options["definition_id"], options["version"], options["scope"])
        self._done("reinstated", options)

    def do_retire(self, options: dict[str, Any]) -> None:
        registry.retire(options["definition_id"], options["version"], options["scope"])
        self._done("retired", options)

    def do_activate(self, options: dict[str, Any]) -> None:
        target = options["target_scope"] or options["scope"]
        registry.activate(options["definition_id"], options["version"], options["scope"], target)
        self.stdout.write(
            f"scope {options['scope']}: {options['definition_id']} now starts "
            f"{target}/{options['definition_id']} v{options['version']}"
        )

    def do_deactivate(self, options: dict[str, Any]) -> None:
        removed = registry.deactivate(options["definition_id"], options["scope"])
        what = "removed" if removed else "no record to remove"
        self.stdout.write(
            f"scope {options['scope']}: activation of {options['definition_id']} {what}"
        )

    def _done(self, verb: str, options: dict[str, Any]) -> None:
        self.stdout.write(
            f"{options['scope']}/{options['definition_id']} v{options['version']} {verb}"
        )
