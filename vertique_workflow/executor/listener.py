"""One LISTEN connection per executor process; notifications wake idle workers.

The connection is psycopg's own (outside Django's connection handling and
any transaction) and issues nothing but LISTEN. A notification is only a
hint: workers peek the database for what is claimable. A connection that
cannot be opened or is lost degrades the process to polling; the listener
logs one warning for the outage (the exception class only, never connection
details) and tries again once per poll interval.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from ..store import wakeup

logger = logging.getLogger("vertique_workflow.executor")


def connect_kwargs(settings_dict: dict[str, Any]) -> dict[str, Any]:
    """psycopg.connect() arguments from a Django DATABASES entry."""
    params: dict[str, Any] = {
        "dbname": settings_dict.get("NAME") or "postgres",
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": settings_dict.get("PORT") or None,
    }
    options = dict(settings_dict.get("OPTIONS") or {})
    for key in (
        "pool",
        "isolation_level",
        "server_side_binding",
        "assume_role",
        "cursor_factory",
        "context",
        "prepare_threshold",
    ):
        options.pop(key, None)
    params.update(options)
    return {key: value for key, value in params.items() if value is not None}


class CommandListener(threading.Thread):
    """LISTEN thread: calls ``wake()`` for every notification (and once after reconnecting)."""

    def __init__(
        self, settings_dict: dict[str, Any], wake: Callable[[], None], poll_interval: float
    ) -> None:
        super().__init__(name="vertique-workflow-listener", daemon=True)
        self._kwargs = connect_kwargs(settings_dict)
        self._wake = wake
        self._poll_interval = poll_interval
        self._stop = threading.Event()
        self.listening = threading.Event()
        self.notifications = 0
        self.outages = 0

    def stop(self) -> None:
        """Ask the thread to close its connection; it notices within a second."""
        self._stop.set()

    def run(self) -> None:
        degraded = False
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    autocommit=True, connect_timeout=5, **self._kwargs
                ) as connection:
                    wakeup.listen(connection)
                    self.listening.set()
                    if degraded:
                        logger.info("command listener recovered; wake-ups resume")
                        degraded = False
                    self._wake()  # anything recorded while we were away
                    while not self._stop.is_set():
                        for _notify in connection.notifies(timeout=1.0):
                            self.notifications += 1
                            self._wake()
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stop.is_set():
                    return
                if not degraded:
                    self.outages += 1
                    logger.warning(
                        "command listener lost (%s); polling every %.0f ms until it is back",
                        type(exc).__name__,
                        self._poll_interval * 1000,
                    )
                    degraded = True
                self._stop.wait(self._poll_interval)
        self.listening.clear()
