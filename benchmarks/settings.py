"""Settings of the benchmark: the workflow app plus the benchmark's workflows."""

from __future__ import annotations

from vertique_workflow.dev_database import database_settings

SECRET_KEY = "benchmark-only"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "pgtrigger",
    "vertique_workflow",
    "benchmarks.bench_flows",
]
DATABASES = {"default": database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
VERTIQUE_WORKFLOW = {"POLL_INTERVAL_MS": 200}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"vertique_workflow": {"level": "WARNING"}},
}
