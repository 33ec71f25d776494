"""Statements of the executor's wake-up path and its observers."""

from __future__ import annotations

from typing import Any

from ..tables import NOTIFY_CHANNEL
from . import db

T = db.T

LISTEN = f"LISTEN {NOTIFY_CHANNEL}"

# The observers' sample: read on the executor's own autocommit connection.
SAMPLE = f"""
SELECT pg_notification_queue_usage(),
       COALESCE(extract(epoch FROM now() - min(c.available_at)), 0)::float8
FROM {T["commands"]} c
WHERE c.state IN ('PENDING', 'DEFERRED') AND c.available_at <= now()
"""


def sample(connection: Any) -> tuple[float, float]:
    """(notification queue usage, lag seconds) on a dedicated psycopg connection."""
    row = connection.execute(SAMPLE).fetchone()
    return float(row[0]), float(row[1])


def listen(connection: Any) -> None:
    """Issue LISTEN on a dedicated psycopg connection (outside Django's)."""
    connection.execute(LISTEN)
