"""``manage.py workflow_diagram``: a workflow's diagram as SVG on stdout.

workflow_diagram ID [--version N] [--scope S]        the definition's picture
workflow_diagram ID --instance UUID [--upto SEQ]     an instance's, marked

Without ``--version`` the version a new start in the scope would run is
drawn (the registry's selection: the scope's activation, else its highest
AVAILABLE version). With ``--instance`` the instance's pinned plan is drawn
with its current and visited steps; ``--upto`` shows where it stood right
after that history entry.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import operations
from ...definitions.plan import Plan
from ...diagram import Marks, instance_marks, render_svg
from ...exceptions import WorkflowError
from ...pins import DEFAULT_SCOPE, resident_plan, resolve_start_pin


class Command(BaseCommand):
    help = "Write the SVG diagram of a workflow definition (or of one instance) to stdout."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # --version is the definition version here, not Django's own version flag
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("definition_id", metavar="ID", help="the workflow definition id")
        parser.add_argument(
            "--version",
            type=int,
            metavar="N",
            dest="definition_version",
            help="the version to draw (default: the one a new start in the scope runs)",
        )
        parser.add_argument(
            "--scope", default=DEFAULT_SCOPE, metavar="S", help="the definition scope"
        )
        parser.add_argument(
            "--instance", metavar="UUID", help="mark where this instance stands (its pinned plan)"
        )
        parser.add_argument(
            "--upto",
            type=int,
            metavar="SEQ",
            help="with --instance: where it stood right after history entry SEQ",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        definition_id: str = options["definition_id"]
        if options["upto"] is not None and not options["instance"]:
            raise CommandError("--upto needs --instance")
        try:
            if options["instance"]:
                plan, marks = self._instance(definition_id, options)
            else:
                plan, marks = self._definition(definition_id, options), None
        except WorkflowError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(render_svg(plan, marks), ending="")

    def _instance(self, definition_id: str, options: dict[str, Any]) -> tuple[Plan, Marks]:
        if options["definition_version"] is not None:
            raise CommandError("--version goes without --instance: an instance has its own pin")
        view = operations.get(options["instance"])
        if view.definition_id != definition_id:
            raise CommandError(
                f"instance {view.id} is a {view.definition_id!r} workflow, not {definition_id!r}"
            )
        return instance_marks(view.id, upto_sequence=options["upto"])

    def _definition(self, definition_id: str, options: dict[str, Any]) -> Plan:
        scope: str = options["scope"]
        version: int | None = options["definition_version"]
        if version is None:
            pin = resolve_start_pin(definition_id, scope, None)
            scope, version = pin.scope, pin.version
            plan = pin.plan or resident_plan(definition_id, version, scope=scope)
        else:
            if version < 1:
                raise CommandError("--version must be a positive integer")
            plan = resident_plan(definition_id, version, scope=scope)
            if plan is None and scope != DEFAULT_SCOPE:
                plan = resident_plan(definition_id, version, scope=DEFAULT_SCOPE)
        if plan is None:
            raise CommandError(
                f"no plan of workflow {definition_id[:255]!r} version {version} in scope "
                f"{scope[:255]!r} on this node"
            )
        return plan
