"""A durable context variable used by the context tests."""

from __future__ import annotations

import contextvars

TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
