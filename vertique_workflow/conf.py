"""The one place that reads ``settings.VERTIQUE_WORKFLOW``.

Every tunable of the app has a documented default here (``docs/settings.md``
lists them all). Other modules read ``workflow_settings.<NAME>``, never the
Django setting itself, so a default lives in exactly one place and a
misspelled key is reported by a system check instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

SETTING_NAME = "VERTIQUE_WORKFLOW"


# The largest PostgreSQL integer: timeouts are set as integer milliseconds, and
# attempts and open-signal counts are compared with integer columns.
INT4_MAX = 2**31 - 1


@dataclass(frozen=True)
class Default:
    """One setting: its default, what it means, and for an integer its range.

    A setting is an integer setting when its default is an int (``bool`` is
    not) or when it declares a ``minimum``; the system check
    ``vertique_workflow.E004`` then refuses any other type and any value
    outside ``minimum``..``maximum``. Adding a validated key is one entry::

        "MAX_THINGS": Default(100, "What it bounds.", minimum=1),

    ``note`` explains in the check's hint why the bounds are what they are.
    An integer setting whose default is None also admits None.
    """

    value: Any
    doc: str
    minimum: int | None = None
    maximum: int = INT4_MAX
    note: str = ""

    @property
    def is_integer(self) -> bool:
        return is_int(self.value) or self.minimum is not None

    def range_error(self, value: Any) -> str | None:
        """What is wrong with ``value`` (its type or number, never other text), or None."""
        if not self.is_integer or (value is None and self.value is None):
            return None
        if value is None:
            return "is None, not an int"
        if not is_int(value):
            return f"is a {type(value).__name__}, not an int"
        if (self.minimum is not None and value < self.minimum) or value > self.maximum:
            return f"is {value}"
        return None

    def range_text(self) -> str:
        if self.minimum is None:
            return f"an integer of at most {self.maximum}"
        return f"an integer from {self.minimum} to {self.maximum}"


def is_int(value: Any) -> bool:
    """An int that is not a bool (``True`` is no lock timeout)."""
    return isinstance(value, int) and not isinstance(value, bool)


NO_TIMEOUT = "0 would disable the timeout: wait forever."

DEFAULTS: dict[str, Default] = {
    "SCHEMA": Default(None, "Schema holding every workflow table; None = unqualified names."),
    "DATABASE": Default("default", "Database alias the workflow tables live in."),
    "LOCK_TIMEOUT_MS": Default(
        5000, "lock_timeout for the per-instance execution lock wait.", minimum=1, note=NO_TIMEOUT
    ),
    "DEFINITION_LOCK_TIMEOUT_MS": Default(
        30000, "lock_timeout for registry mutations.", minimum=1, note=NO_TIMEOUT
    ),
    "PUBLICATION_CLAIM_TIMEOUT_SECONDS": Default(
        60,
        "Age at which a publication claim (a PUBLISHING row) is stale and may be claimed again.",
        minimum=1,
        note="0 would make every claim stale at once: two publishers could run together.",
    ),
    "DOCUMENT_DIRS": Default(
        (), "Folders whose *.yaml, *.yml and *.json definition documents startup records."
    ),
    "ACTIVATE_ON_DEPLOY": Default(
        True, "Startup activates a newly recorded version (code or packaged document)."
    ),
    "POLL_INTERVAL_MS": Default(
        1000, "Executor fallback poll interval (and listener retry).", minimum=1
    ),
    "LEASE_SECONDS": Default(
        60, "How long a claim stays valid before another node may take it.", minimum=1
    ),
    "SEGMENT_DEADLINE_MS": Default(
        30000,
        "Bound of one whole segment transaction (not per statement).",
        minimum=1,
        note=NO_TIMEOUT,
    ),
    "MAX_ATTEMPTS": Default(
        10, "Attempts a command may spend before it is dead-lettered.", minimum=1
    ),
    "BACKOFF_BASE_MS": Default(
        1000, "First retry delay after a failed attempt (doubles, jittered).", minimum=1
    ),
    "BACKOFF_MAX_MS": Default(120000, "Upper bound of the retry delay.", minimum=1),
    "STUCK_AFTER_SECONDS": Default(
        300, "Age after which the probe lists a command as stuck.", minimum=1
    ),
    "OPEN_SIGNALS_CAP": Default(1000, "Open (unapplied) signals one instance may hold.", minimum=1),
    "MAX_PAYLOAD_BYTES": Default(
        1048576,
        "Largest start/signal payload and stored state, bytes of compact UTF-8 JSON.",
        minimum=1,
    ),
    "HISTORY_PATCH_MAX_BYTES": Default(
        65536,
        "Largest decision patch stored; larger => baseline.",
        minimum=2,
        note="Below 2 even the empty patch [] of an unchanged state is a full baseline.",
    ),
    "REDACTED_FIELDS": Default((), "State/payload keys kept out of every history column."),
    "DURABLE_CONTEXT": Default((), "Dotted paths of contextvars carried to the executor."),
    "RECORDERS": Default(
        ("vertique_workflow.side_effects.outbox.ServiceOutboxRecorder",),
        "Dotted paths of side-effect recorder classes run in the segment (one per kind).",
    ),
    "SERVICE_HANDLERS": Default(
        {}, "Service handler names mapped to dotted paths (besides @service_handler)."
    ),
    "RELAY_BATCH": Default(10, "Dispatches one relay claim takes at most.", minimum=1),
    "RELAY_CONCURRENCY": Default(
        2, "Handler calls the relay of workflow_executor/workflow_relay makes at once.", minimum=1
    ),
    "RELAY_LEASE_MARGIN_SECONDS": Default(
        30,
        "Lease of a claimed dispatch beyond its step's timeout (then another relay may take it).",
        minimum=1,
    ),
    "SERVICE_TASK_BACKEND": Default(
        "default", "TASKS backend alias the Django Tasks recorder enqueues service calls on."
    ),
    "SERVICE_TASK_QUEUE": Default(
        "default", "Queue name of the Django Tasks recorder's service-call tasks."
    ),
    "RETENTION_ARCHIVE": Default(
        {},
        "Statuses mapped to the age in seconds after which manage.py workflow_retention "
        "archives them (e.g. {'COMPLETED': 2592000}); {} archives nothing.",
    ),
    "RETENTION_PURGE_ARCHIVED_SECONDS": Default(
        None,
        "Age of an archive after which workflow_retention purges the instance; None: never.",
        minimum=1,
    ),
    "RETENTION_BATCH": Default(
        500, "Instances one retention batch (one transaction) takes.", minimum=1
    ),
    "DOCTOR_PARKED_AFTER_SECONDS": Default(
        3600, "Age after which the doctor reports a parked signal.", minimum=1
    ),
    "DOCTOR_DEFERRALS": Default(
        5, "Deferrals after which the doctor reports a command no node can run.", minimum=1
    ),
    "DOCTOR_SERVICE_STUCK_SECONDS": Default(
        600, "How long past its lease or due time a service call is reported stuck.", minimum=1
    ),
    "DOCTOR_NOTIFY_QUEUE_PERCENT": Default(
        50, "LISTEN/NOTIFY queue usage (percent) the doctor reports.", minimum=1, maximum=100
    ),
    "DOCTOR_STALE_STATS_SECONDS": Default(
        86400, "Age of a busy table's last analyze the doctor reports as stale.", minimum=1
    ),
    "PREPARED_STATEMENTS": Default(
        True,
        "The executor's hot statements are prepared once per connection (False behind a "
        "transaction-pooling proxy that cannot keep prepared statements).",
    ),
    "EXECUTOR_ENABLED": Default(True, "False: this node only records (writes no CODE rows)."),
    "EXECUTOR_CONCURRENCY": Default(4, "Worker threads of manage.py workflow_executor.", minimum=1),
    "SHUTDOWN_GRACE_SECONDS": Default(
        30, "How long running segments may finish on SIGTERM.", minimum=0
    ),
    "NODE_ID": Default(None, "Executor node id; None = <hostname>:<pid>."),
    "DOCUMENT_INPUT_LIMIT": Default(
        262144,
        "Largest workflow document accepted, raw UTF-8 bytes (checked before parsing).",
        minimum=1,
    ),
}


class WorkflowSettings:
    """Attribute access to the merged settings (user values over defaults).

    The merged dict is cached and dropped on ``setting_changed`` so tests that
    use ``override_settings`` see their values.
    """

    _cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, SETTING_NAME, None) or {}
        if not isinstance(value, dict):
            return {}
        return value

    def _merged(self) -> dict[str, Any]:
        if self._cache is None:
            merged = {key: default.value for key, default in DEFAULTS.items()}
            merged.update({k: v for k, v in self.user_settings.items() if k in DEFAULTS})
            self._cache = merged
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"{SETTING_NAME} has no setting {name!r}")
        return self._merged()[name]

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.user_settings) - set(DEFAULTS))

    def reload(self) -> None:
        self._cache = None


workflow_settings = WorkflowSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        workflow_settings.reload()


setting_changed.connect(_reload)
