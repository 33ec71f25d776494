"""System checks: misconfiguration is reported at startup, not at first use."""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

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
