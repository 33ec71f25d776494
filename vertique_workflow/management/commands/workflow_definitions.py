"""``manage.py workflow_definitions``: record, list and manage registry versions.

workflow_definitions sync
workflow_definitions list [--scope S] [--id ID] [--status STATUS ...]
workflow_definitions validate FILE [FILE ...]
workflow_definitions load FILE [--scope S] [--format yaml|json] [--publish] [--activate]
workflow_definitions publish ID VERSION [--scope S]
workflow_definitions show ID VERSION [--scope S]
workflow_definitions deprecate ID VERSION [--scope S]
workflow_definitions reinstate ID VERSION [--scope S]
workflow_definitions retire ID VERSION [--scope S]
workflow_definitions activate ID VERSION [--scope S] [--target-scope T]
workflow_definitions deactivate ID [--scope S]

Every refusal is a ``CommandError`` (one line, exit status 1) and writes
nothing: a bad document names its file, line and path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import document_plans, registry
from ...exceptions import WorkflowError
from ...store import definitions as store
from ...store import documents as document_store

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

        validate = actions.add_parser(
            "validate",
            help="Compile documents without writing anything; print id, version and plan hash.",
        )
        validate.add_argument("files", metavar="FILE", nargs="+")

        load = actions.add_parser(
            "load",
            help="Load a document as a CANDIDATE (the same text again is a no-op), optionally "
            "publish and activate it.",
        )
        load.add_argument("file", metavar="FILE")
        load.add_argument("--scope", default=store.DEFAULT_SCOPE)
        load.add_argument(
            "--format",
            choices=document_store.FORMATS,
            help="Document format (default: from the file name: .yaml, .yml or .json).",
        )
        load.add_argument(
            "--publish", action="store_true", help="Then publish it (CANDIDATE -> AVAILABLE)."
        )
        load.add_argument(
            "--activate",
            action="store_true",
            help="Then make it the current version of the scope (needs it AVAILABLE).",
        )

        helps = {
            "publish": "CANDIDATE -> AVAILABLE: compile the stored document here and publish it.",
            "show": "Print the stored document text (verified against its digest).",
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

    def do_validate(self, options: dict[str, Any]) -> None:
        failed = []
        for name in options["files"]:
            try:
                path, text, document_format = _read(name, None)
                plan = document_plans.compile_text(
                    text, document_format=document_format, source=str(path)
                )
            except WorkflowError as exc:
                failed.append(name)
                self.stderr.write(str(exc))
                continue
            self.stdout.write(
                f"{name}: {plan.id} v{plan.version} hash {plan.plan_hash[:12]} (valid)"
            )
        if failed:
            raise CommandError(f"{len(failed)} of {len(options['files'])} document(s) invalid")

    def do_load(self, options: dict[str, Any]) -> None:
        path, text, document_format = _read(options["file"], options["format"])
        scope = options["scope"]
        record, outcome = registry.load_document_outcome(
            text, format=document_format, scope=scope, source=str(path)
        )
        key = f"{scope}/{record.definition_id} v{record.version}"
        if outcome == "INSERTED":
            self.stdout.write(
                f"{key} loaded as CANDIDATE (hash {record.plan_hash[:12]}, from {options['file']})"
            )
        else:
            self.stdout.write(f"{key} unchanged ({record.status}): the same text is stored")
        status = record.status
        if options["publish"]:
            if status == "AVAILABLE":
                self.stdout.write(f"{key} already AVAILABLE: not published again")
            else:
                registry.publish(record.definition_id, record.version, scope)
                status = "AVAILABLE"
                self.stdout.write(f"{key} published (AVAILABLE)")
        if options["activate"]:
            if status != "AVAILABLE":
                raise CommandError(
                    f"{key} is {status}, not activated: only an AVAILABLE version can be "
                    "activated (add --publish)"
                )
            registry.activate(record.definition_id, record.version, scope)
            self.stdout.write(f"scope {scope}: {record.definition_id} now starts {key}")

    def do_publish(self, options: dict[str, Any]) -> None:
        registry.publish(options["definition_id"], options["version"], options["scope"])
        self._done("published (AVAILABLE)", options)

    def do_show(self, options: dict[str, Any]) -> None:
        scope, definition_id, version = (
            options["scope"],
            options["definition_id"],
            options["version"],
        )
        key = f"{scope}/{definition_id} v{version}"
        stored = document_store.find_document(scope, definition_id, version)
        if stored is None:
            record = store.find_definition(scope, definition_id, version)
            if record is None:
                raise CommandError(f"workflow definition {key} does not exist")
            raise CommandError(f"workflow definition {key} is a {record.kind} row: no document")
        self.stdout.write(stored.text, ending="" if stored.text.endswith("\n") else "\n")

    def do_list(self, options: dict[str, Any]) -> None:
        records = store.list_definitions(
            scope=options["scope"],
            definition_id=options["definition_id"],
            statuses=options["status"],
        )
        counts = store.instance_counts(
            scope=options["scope"], definition_id=options["definition_id"]
        )
        header = (
            "SCOPE",
            "ID",
            "VERSION",
            "STATUS",
            "KIND",
            "HASH",
            "LIVE",
            "FAILED",
            "CONTRACT",
            "FAILURE",
        )
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
                    r.failure_reason or "-",
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


def _read(name: str, document_format: str | None) -> tuple[Path, str, str]:
    """The file's path, UTF-8 text and format (given, else from its extension)."""
    from ...definitions.documents import document_format_of

    path = Path(name)
    if document_format is None:
        document_format = document_format_of(name)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CommandError(f"{name}: cannot read the file ({exc.strerror or exc})") from None
    try:
        return path, data.decode("utf-8"), document_format
    except UnicodeDecodeError as exc:
        raise CommandError(f"{name}: not UTF-8 (byte {exc.start})") from None
