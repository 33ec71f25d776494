"""``manage.py workflow_relay``: call service handlers for the outbox's dispatches.

``workflow_executor`` runs a relay in its own process already; run this
command instead (with ``workflow_executor --no-relay``) to call handlers on
other machines than the executors -- e.g. the ones allowed to reach a
payment provider. Any number may run at once: they share the work with
``SKIP LOCKED`` claims. See docs/side-effects.md.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...conf import workflow_settings
from ...executor.segment import default_node_id
from ...side_effects.handlers import handler_names
from ...side_effects.relay import Relay
from ...store import outbox
from ..daemons import configure_logging, poll_ms, use_database


class Command(BaseCommand):
    help = "Call service handlers for the service outbox's due dispatches and record the outcomes."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=workflow_settings.RELAY_CONCURRENCY,
            help="handler calls at once (default RELAY_CONCURRENCY)",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=workflow_settings.RELAY_BATCH,
            help="dispatches one claim takes at most (default RELAY_BATCH)",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="exit 0 once no dispatch is due or held (backoffs included)",
        )
        parser.add_argument(
            "--poll-interval",
            type=int,
            default=None,
            metavar="MS",
            help="how often to look for due dispatches (default POLL_INTERVAL_MS)",
        )
        parser.add_argument(
            "--database",
            default=None,
            metavar="ALIAS",
            help="database alias of the workflow tables (default DATABASE)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("concurrency", "batch"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        use_database(options["database"])
        configure_logging(self.stderr._out, options["verbosity"])
        interval_ms = poll_ms(options["poll_interval"])
        node = f"relay:{default_node_id()}"
        relay = Relay(node, batch=options["batch"], concurrency=options["concurrency"])
        log = logging.getLogger("vertique_workflow.relay")
        names = ", ".join(sorted(handler_names())) or "none"
        log.info("relay %s serving handlers: %s", node, names)
        stop = threading.Event()

        def on_idle() -> None:
            if options["until_idle"] and outbox.next_delay_ms() is None:
                stop.set()

        def handle_signal(signum: int, frame: Any) -> None:
            log.info("signal %s: stopping after the calls in flight", signum)
            stop.set()
            relay.wake()

        signal.signal(signal.SIGTERM, handle_signal)
        signal.signal(signal.SIGINT, handle_signal)
        relay.run(stop, poll_interval=interval_ms / 1000.0, on_idle=on_idle)
        stats = relay.stats
        self.stdout.write(
            f"relay {node}: {stats.called} call(s), {stats.delivered} delivered, "
            f"{stats.retried} retried, {stats.failed} failed, {stats.lost} lost claim(s)"
        )
