"""Statements for tests and tooling that touch every workflow table at once."""

from __future__ import annotations

from . import db

TRUNCATE_ALL = "TRUNCATE " + ", ".join(db.T.values()) + " RESTART IDENTITY CASCADE"


def truncate_all() -> None:
    db.execute(TRUNCATE_ALL)
