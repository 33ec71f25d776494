"""Settings of the test suite: a real PostgreSQL from the PG* environment.

``scripts/with_postgres.py`` exports PGHOST/PGPORT/PGUSER for a throwaway
server; a user-configured ``DATABASE_URL`` or ``PG*`` server is used as is.
``VERTIQUE_TEST_SCHEMA`` runs the whole suite with a schema placement.
"""

from __future__ import annotations

import json
import os

from vertique_workflow.dev_database import database_settings

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    # the admin's CSS in the browser tests' screenshots (the live server serves it)
    "django.contrib.staticfiles",
    "pgtrigger",
    "vertique_workflow",
    "tests.flows.apps.FlowsConfig",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
DATABASES = {"default": database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

VERTIQUE_WORKFLOW = {
    "SCHEMA": os.environ.get("VERTIQUE_TEST_SCHEMA") or None,
    "POLL_INTERVAL_MS": 200,
    "MAX_ATTEMPTS": 5,
    "BACKOFF_BASE_MS": 10,
    "BACKOFF_MAX_MS": 50,
    # subprocess tests add (or misspell) keys through this variable
    **json.loads(os.environ.get("VERTIQUE_TEST_SETTINGS_JSON") or "{}"),
}
