"""Statements of the executor's wake-up path and its observers."""

from __future__ import annotations

from typing import Any

from ..tables import NOTIFY_CHANNEL
from . import db

T = db.T

LISTEN = f"LISTEN {NOTIFY_CHANNEL}"

QUEUE_USAGE = "SELECT pg_notification_queue_usage()"

# Lag: how long the oldest claimable command has been available.
LAG_SECONDS = f"""
SELECT COALESCE(extract(epoch FROM now() - min(c.available_at)), 0)
FROM {T["commands"]} c
WHERE c.state IN ('PENDING', 'DEFERRED') AND c.available_at <= now()
"""


def queue_usage() -> float:
    row = db.fetchone(QUEUE_USAGE)
    return float(row[0]) if row else 0.0


def lag_seconds() -> float:
    row = db.fetchone(LAG_SECONDS)
    return float(row[0]) if row and row[0] is not None else 0.0


def listen(connection: Any) -> None:
    """Issue LISTEN on a dedicated psycopg connection (outside Django's)."""
    connection.execute(LISTEN)
