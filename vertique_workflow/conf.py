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


@dataclass(frozen=True)
class Default:
    value: Any
    doc: str


DEFAULTS: dict[str, Default] = {
    "SCHEMA": Default(None, "Schema holding every workflow table; None = unqualified names."),
    "DATABASE": Default("default", "Database alias the workflow tables live in."),
    "LOCK_TIMEOUT_MS": Default(5000, "lock_timeout for the per-instance execution lock wait."),
    "DEFINITION_LOCK_TIMEOUT_MS": Default(30000, "lock_timeout for registry mutations."),
    "POLL_INTERVAL_MS": Default(1000, "Executor fallback poll interval (and listener retry)."),
    "LEASE_SECONDS": Default(60, "How long a claim stays valid before another node may take it."),
    "SEGMENT_DEADLINE_MS": Default(30000, "statement_timeout bounding one segment transaction."),
    "MAX_ATTEMPTS": Default(5, "Claims a command may spend before it is dead-lettered."),
    "BACKOFF_BASE_MS": Default(200, "First retry delay after a failed attempt (doubles)."),
    "BACKOFF_MAX_MS": Default(60000, "Upper bound of the retry delay."),
    "STUCK_AFTER_SECONDS": Default(300, "Age after which the probe lists a command as stuck."),
    "OPEN_SIGNALS_CAP": Default(1000, "Open (unapplied) signals one instance may hold."),
    "MAX_PAYLOAD_BYTES": Default(
        1048576, "Largest start/signal payload and stored state, bytes of compact UTF-8 JSON."
    ),
    "HISTORY_PATCH_MAX_BYTES": Default(65536, "Largest decision patch stored; larger => baseline."),
    "REDACTED_FIELDS": Default((), "State/payload keys kept out of every history column."),
    "DURABLE_CONTEXT": Default((), "Dotted paths of contextvars carried to the executor."),
    "RECORDERS": Default((), "Dotted paths of side-effect recorders run in the segment."),
    "EXECUTOR_ENABLED": Default(True, "False: this node only records (writes no CODE rows)."),
    "EXECUTOR_CONCURRENCY": Default(4, "Worker threads of manage.py workflow_executor."),
    "SHUTDOWN_GRACE_SECONDS": Default(30, "How long running segments may finish on SIGTERM."),
    "NODE_ID": Default(None, "Executor node id; None = <hostname>:<pid>."),
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
