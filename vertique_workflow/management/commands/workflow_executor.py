"""``manage.py workflow_executor``: run recorded workflow commands.

Run one or more of these processes, on one or more machines, against the
same database. A node that never runs it only records (start, signal,
cancel from views); see docs/executor.md.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ... import tables
from ...conf import workflow_settings
from ...definitions import catalog
from ...exceptions import WorkflowDefinitionError
from ...executor.daemon import Executor, ExecutorOptions, startup_report
from ...executor.startup_heap import kept_from_collector
from ...registry import ensure_synced, stranded_instances, stranded_summary
from ..daemons import configure_logging, poll_ms, use_database

# -v 1: startup report and the counters line; -v 2: also one line per command
# (instance, kind, outcome, step reached, milliseconds); -v 3: debug


class Command(BaseCommand):
    help = "Run recorded workflow commands (woken by LISTEN/NOTIFY, polling as a fallback)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=workflow_settings.EXECUTOR_CONCURRENCY,
            help="worker threads, each with its own connection",
        )
        parser.add_argument(
            "--poll-interval",
            type=int,
            default=None,
            metavar="MS",
            help="fallback poll interval (default POLL_INTERVAL_MS)",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="exit 0 once the probe says nothing is in flight or claimable",
        )
        parser.add_argument(
            "--max-commands",
            type=int,
            default=None,
            metavar="N",
            help="stop after handling N commands",
        )
        parser.add_argument(
            "--database",
            default=None,
            metavar="ALIAS",
            help="database alias of the workflow tables (default DATABASE)",
        )
        parser.add_argument(
            "--no-relay",
            action="store_true",
            help="do not serve the service outbox here (run manage.py workflow_relay instead)",
        )
        parser.add_argument(
            "--stats-interval",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="seconds between the counters log lines",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not workflow_settings.EXECUTOR_ENABLED:
            raise CommandError(
                "this node is record-only (VERTIQUE_WORKFLOW['EXECUTOR_ENABLED'] is False); "
                "run the executor on a node whose settings enable it"
            )
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["max_commands"] is not None and options["max_commands"] < 1:
            raise CommandError("--max-commands must be at least 1")
        alias = use_database(options["database"])
        configure_logging(self.stderr._out, options["verbosity"])
        interval_ms = poll_ms(options["poll_interval"])
        executor_options = ExecutorOptions(
            concurrency=options["concurrency"],
            poll_interval=interval_ms / 1000.0,
            until_idle=options["until_idle"],
            max_commands=options["max_commands"],
            database=alias,
            stats_interval=options["stats_interval"],
            grace_seconds=float(workflow_settings.SHUTDOWN_GRACE_SECONDS),
            log_commands=options["verbosity"] >= 2,
            relay=not options["no_relay"],
        )
        try:
            ensure_synced()
        except WorkflowDefinitionError as exc:
            raise CommandError(str(exc)) from exc
        log = logging.getLogger("vertique_workflow.executor")
        stranded = stranded_summary(stranded_instances())
        if stranded is not None:
            log.error("stranded instances: %s", stranded)
        connections[alias].close()
        log.info(startup_report(executor_options, catalog.all(), tables.SCHEMA))
        executor = Executor(executor_options)
        executor.install_signal_handlers()
        with kept_from_collector() as frozen:
            if frozen:
                log.debug("%s start-up objects kept out of the cyclic garbage collector", frozen)
            code = executor.run()
        if code:
            sys.exit(code)
