"""Database settings from the environment, for the example project and tests.

``DATABASE_URL`` (``postgresql://user:pass@host:port/name``) wins; otherwise the
standard libpq variables ``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD`` and
``PGDATABASE`` are used. ``scripts/with_postgres.py`` exports both for the
throwaway server it starts.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse


def database_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for PostgreSQL (psycopg 3) from ``env``."""
    env = dict(os.environ if env is None else env)
    url = env.get("DATABASE_URL")
    if url:
        parts = urlparse(url)
        if parts.scheme not in ("postgres", "postgresql"):
            raise ValueError("DATABASE_URL must be a postgresql:// URL")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "postgres",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": env.get("PGDATABASE", "postgres"),
        "USER": env.get("PGUSER", ""),
        "PASSWORD": env.get("PGPASSWORD", ""),
        "HOST": env.get("PGHOST", ""),
        "PORT": env.get("PGPORT", ""),
    }
