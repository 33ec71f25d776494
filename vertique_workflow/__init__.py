"""vertique_workflow: durable Django workflows on PostgreSQL alone."""

from __future__ import annotations

__version__ = "0.1.0"
