"""Statements about database sessions themselves (the deadline watchdog's)."""

from __future__ import annotations

from typing import Any

TERMINATE_BACKEND = "SELECT pg_terminate_backend(%s)"


def terminate_backend(connection: Any, backend_pid: int) -> bool:
    """End another session (its transaction rolls back, its locks are released)."""
    row = connection.execute(TERMINATE_BACKEND, (backend_pid,)).fetchone()
    return bool(row and row[0])
