"""Django admin: browse instances, their history, commands, queues, timers, tasks and branches.

Everything here is read-only. The rows are the engine's state and logs:
changing them by hand would break invariants the engine relies on (dense
history sequences, command states and the open-signal counter, timer rows
linked to their commands). Changes go through the API (``start``,
``signal``, ``cancel``, ...), which takes the execution lock and records
history. Staff users need the ``view`` permission of a model to see it.

Not registered: the four models with a composite primary key
(``WorkflowDedup``, ``WorkflowJoinState``, ``WorkflowDefinition``,
``WorkflowDefinitionActivation``). Django (5.2 up to 6.1 at least) refuses
to register such a model with the admin (``AdminSite.register`` raises
``ImproperlyConfigured``); see docs/execution.md.

Query cost: list filters on status-like columns offer the fixed values of
the model's choices (no ``SELECT DISTINCT`` over a large table), a search
term that is a UUID is an equality on the indexed id columns, list pages
skip the unfiltered total count and the filter facet counts, the commands
list joins its instance in the same query, and an instance's page shows
only the latest rows of its history and commands (with links to all).

The package: ``common`` (helpers, read-only base classes), ``instances``,
``history``, ``commands`` (the command log and queues), ``tasks`` (timers,
tasks, branch tokens), ``side_effects`` (service calls, workflow events).
Importing the modules registers their admins.
"""

from __future__ import annotations

from django.contrib import admin as _django_admin

from . import commands, history, instances, side_effects, tasks, views  # noqa: F401
from .common import (
    INLINE_ROWS,
    LAST_ERROR_PREVIEW,
    LatestRowsFormSet,
    ReadOnlyAdmin,
    ReadOnlyInline,
    actor_text,
    admin_url,
    choices_filter,
    command_link,
    filtered_changelist_url,
    instance_link,
    latest_rows_formset,
    pretty_json,
)

# the views of the composite-key tables and whole JSON values, on Django's default site
views.install(_django_admin.site)
install_views = views.install

__all__ = [
    "INLINE_ROWS",
    "LAST_ERROR_PREVIEW",
    "LatestRowsFormSet",
    "ReadOnlyAdmin",
    "ReadOnlyInline",
    "actor_text",
    "admin_url",
    "choices_filter",
    "command_link",
    "commands",
    "filtered_changelist_url",
    "history",
    "install_views",
    "instance_link",
    "instances",
    "latest_rows_formset",
    "pretty_json",
    "tasks",
    "views",
]
