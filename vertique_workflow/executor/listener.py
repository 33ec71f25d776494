"""One LISTEN connection per executor process; notifications wake idle workers.

The connection is psycopg's own (outside Django's connection handling and
any transaction) and issues nothing but LISTEN. A notification is only a
hint: its payload goes to ``on_notify`` (the executor reads a digits-only
payload as the command's available time and anything else as "peek now"),
and workers peek the database for what is claimable. A connection that
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
from ..store.db import connect_kwargs

logger = logging.getLogger("vertique_workflow.executor")


class CommandListener(threading.Thread):
    """LISTEN thread: ``on_notify(payload)`` per notification, ``wake()`` after (re)connecting."""

    def __init__(
        self,
        settings_dict: dict[str, Any],
        wake: Callable[[], None],
        poll_interval: float,
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(name="vertique-workflow-listener", daemon=True)
        self._kwargs = connect_kwargs(settings_dict)
        self._wake = wake
        self._on_notify = on_notify or (lambda _payload: wake())
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
                    if degraded:
                        logger.info("command listener recovered; wake-ups resume")
                        degraded = False
                    self._wake()  # anything recorded while we were away
                    self.listening.set()  # set after that wake, so a waiter sees it dispatched
                    while not self._stop.is_set():
                        for notify in connection.notifies(timeout=1.0):
                            self.notifications += 1
                            self._on_notify(notify.payload)
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
