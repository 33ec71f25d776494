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
    errors.extend(check_integer_settings())
    errors.extend(check_retention_archive())
    return errors


def check_retention_archive() -> list[checks.CheckMessage]:
    """E023: RETENTION_ARCHIVE maps instance statuses to non-negative ages in seconds."""
    from .models import InstanceStatus

    value = workflow_settings.user_settings.get("RETENTION_ARCHIVE")
    if value is None:
        return []
    problem = None
    if not isinstance(value, dict):
        problem = f"is a {type(value).__name__}, not a dict"
    else:
        for status, age in value.items():
            if status not in InstanceStatus.values:
                problem = f"names an unknown status {status!r}"
            elif isinstance(age, bool) or not isinstance(age, (int, float)) or age < 0:
                problem = f"gives {status} an age that is not a non-negative number of seconds"
            if problem:
                break
    if problem is None:
        return []
    return [
        checks.Error(
            f"{SETTING_NAME}['RETENTION_ARCHIVE'] {problem}.",
            hint="Map statuses to ages in seconds, e.g. {'COMPLETED': 2592000}.",
            id="vertique_workflow.E023",
        )
    ]


def check_integer_settings() -> list[checks.CheckMessage]:
    """E004: every integer setting is an int (not a bool) within its range.

    The ranges live with the defaults (``conf.DEFAULTS``), so a key added
    there with a ``minimum`` is checked here without further code. A lock or
    statement timeout of 0 would mean "wait forever", so timeouts start at 1;
    every maximum is PostgreSQL's integer limit. The message names the key,
    the value's type (or the number) and the range, never other value text.
    """
    errors: list[checks.CheckMessage] = []
    user = workflow_settings.user_settings
    for key, default in DEFAULTS.items():
        if key not in user:
            continue
        problem = default.range_error(user[key])
        if problem is None:
            continue
        hint = f"The default is {default.value!r}."
        if default.note:
            hint = f"{default.note} {hint}"
        errors.append(
            checks.Error(
                f"{SETTING_NAME}[{key!r}] {problem}; it must be {default.range_text()}.",
                hint=hint,
                id="vertique_workflow.E004",
            )
        )
    return errors


@checks.register(checks.Tags.compatibility)
def check_service_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every ``service`` step of a registered plan names a handler this process can call.

    An unregistered name would leave every call of that step failing in the
    relay; it is refused at startup instead (``vertique_workflow.E020``),
    naming the workflow, the version, the step and the handler. Recorder
    paths that cannot be imported are ``E021``; the Django Tasks recorder
    installed without Django's Tasks framework (Django 6.0+ or the
    ``django-tasks`` backport) is ``E022``.
    """
    from .definitions import catalog
    from .side_effects import installed_recorders
    from .side_effects.handlers import handler_names

    errors: list[checks.CheckMessage] = []
    try:
        installed_recorders()
    except ImproperlyConfigured as exc:
        from .side_effects.django_tasks import MISSING_FRAMEWORK

        code = "E022" if MISSING_FRAMEWORK in str(exc) else "E021"
        errors.append(checks.Error(str(exc), id=f"vertique_workflow.{code}"))
    known = handler_names()
    for plan in catalog.all():
        for step in plan.steps.values():
            spec = step.service
            if spec is not None and spec.handler not in known:
                errors.append(
                    checks.Error(
                        f"workflow {plan.id!r} v{plan.version} step {step.id!r} names the "
                        f"service handler {spec.handler!r}, which is not registered.",
                        hint="Register it with @vertique_workflow.service_handler(name) in a "
                        "module Django imports, or list it in "
                        "VERTIQUE_WORKFLOW['SERVICE_HANDLERS'].",
                        id="vertique_workflow.E020",
                    )
                )
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
