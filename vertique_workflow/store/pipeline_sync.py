"""A pipeline's Sync sent with the interpreter lock released.

libpq's ``PQpipelineSync`` appends the Sync message and sends the whole
pipeline to the server: the ``send`` system call that delivers the
statements and wakes the server's backend. psycopg's C implementation calls
it holding the interpreter lock (its ``send_query_prepared`` and
``is_busy`` release it, ``pipeline_sync`` does not), so in an executor of
several worker threads every other worker waits while one sends, and longer
when the backend it woke takes its core before the send returns. The
executor sends two pipelines a segment (the execution lock and fence, the
persist and its ``COMMIT``); measured on two cores, a drain of 3,000
three-action instances by one executor process of four threads ran 1,286/s
with psycopg's call against 1,454/s with this one (medians of ten drains
each, alternated; docs/performance.md).

:func:`sync` calls the same libpq function through :mod:`ctypes`, which
releases the lock around a foreign call. The function is looked up through
psycopg's own compiled ``pq`` module (``dlsym`` on its handle searches the
libraries it was linked against), so it is the libpq psycopg uses, the one
whose connection pointer it hands out — the bundled copy of
``psycopg[binary]`` or the system's for ``psycopg[c]``. Where that lookup is
not possible (psycopg's pure-Python implementation, whose own ctypes calls
already release the lock; a platform whose loader does not search
dependencies, such as Windows) psycopg's ``pipeline_sync`` is called as
before.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Any

from psycopg import errors, pq

_SYNC_FAILED = "failed to sync pipeline"


def _libpq_pipeline_sync() -> Callable[[int], int] | None:
    """libpq's ``PQpipelineSync`` of psycopg's compiled ``pq`` module, via ctypes; None: none."""
    implementation = getattr(pq, "__impl__", "python")
    if implementation not in ("c", "binary"):
        return None
    module = sys.modules.get(f"psycopg_{implementation}.pq")
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).PQpipelineSync
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_LIBPQ_SYNC = _libpq_pipeline_sync()


def releases_gil() -> bool:
    """Whether :func:`sync` releases the interpreter lock (a ctypes call of libpq's function)."""
    return _LIBPQ_SYNC is not None


def sync(pgconn: Any) -> None:
    """Mark the pipeline's Sync on ``pgconn`` and send the pipeline, as ``pgconn.pipeline_sync()``.

    Raises psycopg's ``OperationalError`` as psycopg's call would: the
    connection is closed, not in pipeline mode, or the send failed.
    """
    if _LIBPQ_SYNC is None:
        pgconn.pipeline_sync()
        return
    pointer = pgconn.pgconn_ptr
    if pointer is None:
        raise errors.OperationalError("the connection is closed")
    outcome = _LIBPQ_SYNC(pointer)
    if outcome == 0:
        raise errors.OperationalError("connection not in pipeline mode")
    if outcome != 1:
        raise errors.OperationalError(_SYNC_FAILED)
