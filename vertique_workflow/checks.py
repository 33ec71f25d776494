"""System checks: misconfiguration is reported at startup, not at first use."""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from . import tables
from .conf import DEFAULTS, SETTING_NAME, workflow_settings


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    raw = getattr(settings, SETTING_NAME, None)
    if raw is not None and not isinstance(raw, dict):
        return [
            checks.Error(
                f"{SETTING_NAME} must be a dict, not {type(raw).__name__}.",
                id="vertique_workflow.E001",
            )
        ]
    for key in workflow_settings.unknown_keys():
        close = difflib.get_close_matches(str(key).upper(), list(DEFAULTS), n=1, cutoff=0.75)
        hint = f"Did you mean {close[0]!r}?" if close else f"Known keys: {', '.join(DEFAULTS)}."
        errors.append(
            checks.Error(
                f"{SETTING_NAME} has an unknown key {key!r}.",
                hint=hint,
                id="vertique_workflow.E002",
            )
        )
    try:
        tables.configured_schema()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="vertique_workflow.E003"))
    return errors


@checks.register(checks.Tags.database)
def check_stranded_instances(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Warn about unfinished instances standing at a step their version's code lost.

    A database check (Django runs those in ``migrate`` and in
    ``check --database ALIAS``, not on every command): it reads the
    workflow database alias. An absent, unreachable or unmigrated database
    (or a broken placement setting, reported by E003) skips it silently.
    """
    from . import registry
    from .store import db

    alias = db.alias()
    if not databases or alias not in databases:
        return []
    try:
        groups = registry.stranded_instances()
    except (DatabaseError, ImproperlyConfigured):
        return []
    return [
        checks.Warning(group.describe(), hint=group.fix(), id="vertique_workflow.W001")
        for group in groups
    ]
