"""What the client sends on the wire: libpq's protocol trace of Django's own connection.

Each Sync (extended protocol: the prepared statements of ``store/``) or Query
(simple protocol: Django's cursors, BEGIN, COMMIT) is a point where the
client waits for the server, so the list counts statements and round trips
alike, whichever cursor ran them (Django's query capture sees only its own).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from django.db import connection
from psycopg import pq


def client_waits(run: Callable[[], Any]) -> list[str]:
    """The Sync and Query messages the client sent while ``run()`` ran, in order."""
    return [
        (f"Query {text.strip()}" if kind == "Query" else "Sync")
        for kind, text in client_messages(run)
        if kind in ("Sync", "Query")
    ]


def client_messages(run: Callable[[], Any]) -> list[tuple[str, str]]:
    """Every message the client sent while ``run()`` ran: (type, the trace's rest of the line).

    A statement's text may span lines of the trace: read it with :func:`client_trace`.
    """
    lines = [line.split("\t") for line in client_trace(run).splitlines()]
    return [
        (fields[2], "\t".join(fields[3:]))
        for fields in lines
        if len(fields) > 2 and fields[0] == "F"
    ]


def client_trace(run: Callable[[], Any]) -> str:
    """libpq's protocol trace of Django's connection while ``run()`` ran, as written."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            run()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return trace.read()
