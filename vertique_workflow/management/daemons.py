"""What the long-running commands (``workflow_executor``, ``workflow_relay``) share.

Both log through the ``vertique_workflow`` loggers at the level ``-v`` asks
for and run against one database alias of the workflow tables; one place
for each, so the two commands cannot drift apart.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import CommandError
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from ..conf import workflow_settings
from ..store import db

# -v 1: startup report and the counters line; -v 2: also one line per command
# (instance, kind, outcome, step reached, milliseconds); -v 3: debug
LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}


def configure_logging(stream: Any, verbosity: int) -> None:
    """Send the ``vertique_workflow`` loggers to ``stream`` unless logging is configured."""
    logger = logging.getLogger("vertique_workflow")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(LOG_LEVELS.get(verbosity, logging.DEBUG))


def use_database(option: str | None) -> str:
    """The workflow tables' alias (``--database`` or ``DATABASE``), checked and put in use.

    Refuses a database that lacks migrations of this release
    (:func:`require_migrated`).
    """
    alias = option or workflow_settings.DATABASE
    if alias not in connections:
        raise CommandError(f"unknown database alias {alias!r}")
    require_migrated(alias)
    db.use_alias(alias)
    return alias


APP_LABEL = "vertique_workflow"


def require_migrated(alias: str) -> None:
    """Refuse to start against a database that lacks this release's migrations of the app.

    The statements of a release use what its migrations create (since 0011 every
    claim calls ``workflow_timer_held_back``): started before ``migrate``, an
    executor would fail each claim and retry it forever. Read once at start-up,
    from Django's record of applied migrations.
    """
    executor = MigrationExecutor(connections[alias])
    leaves = [node for node in executor.loader.graph.leaf_nodes() if node[0] == APP_LABEL]
    missing = [
        migration.name
        for migration, backwards in executor.migration_plan(leaves)
        if migration.app_label == APP_LABEL and not backwards
    ]
    if missing:
        database = "" if alias == "default" else f" --database {alias}"
        raise CommandError(
            f"the database {alias!r} lacks {len(missing)} migration(s) of {APP_LABEL}: "
            f"{', '.join(missing)}; run `manage.py migrate{database}` first"
        )


def poll_ms(option: int | None) -> int:
    """``--poll-interval`` in ms (``POLL_INTERVAL_MS`` without it), at least 1."""
    value = option or workflow_settings.POLL_INTERVAL_MS
    if value < 1:
        raise CommandError("--poll-interval must be at least 1 ms")
    return int(value)
