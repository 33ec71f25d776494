"""Settings of the example project: a small Django site using vertique_workflow.

For local demonstration only (``./scripts/demo``): DEBUG is on and the secret
key is public. The database comes from ``DATABASE_URL`` or the ``PG*``
variables (see ``vertique_workflow.dev_database``).
"""

from __future__ import annotations

from pathlib import Path

from vertique_workflow.dev_database import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-not-secret"  # demo only, never deploy this
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgtrigger",
    "vertique_workflow",
    "expenses",
    "orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": database_settings()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# the demo has no login page of its own: deciding an expense sends you to the admin's
LOGIN_URL = "admin:login"

# Every key and its default: docs/settings.md. The demo keeps the default
# placement (unqualified table names, the "default" database) but gives up on a
# failing step after 3 quick attempts (the defaults: 10 attempts over minutes),
# so a dead letter shows at once.
VERTIQUE_WORKFLOW: dict[str, object] = {
    "MAX_ATTEMPTS": 3,
    "BACKOFF_BASE_MS": 100,
    "BACKOFF_MAX_MS": 500,
}
