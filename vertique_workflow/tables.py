"""Placement: where the workflow tables live, and the only builder of their names.

``VERTIQUE_WORKFLOW["SCHEMA"]`` places every table, index, sequence, trigger
and trigger function in one schema. Models take ``db_table`` from here and the
SQL in ``store/`` renders its statements with :func:`sql_names`, so the ORM and
raw SQL cannot disagree about where a table is.

The schema is validated when this module is imported (which happens while
Django loads the models, before any query): a value that is not one plain
PostgreSQL identifier, or is a reserved word, raises ``ImproperlyConfigured``.
Nothing user-supplied is ever interpolated into SQL unvalidated.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

INSTANCES = "workflow_instances"
HISTORY = "workflow_history"
DEDUP = "workflow_dedup"
TIMERS = "workflow_timers"
TASKS = "workflow_tasks"
BRANCH_TOKENS = "workflow_branch_tokens"
JOIN_STATES = "workflow_join_states"
DEFINITIONS = "workflow_definitions"
ACTIVATIONS = "workflow_definition_activations"
COMMANDS = "workflow_commands"
COMMAND_QUEUES = "workflow_command_queues"
# side effects (issue 12): tables of their own, in migration 0004, beside the
# eleven reference tables
SERVICE_OUTBOX = "workflow_service_outbox"
EVENTS = "workflow_events"
EVENT_CONSUMERS = "workflow_event_consumers"

ALL_TABLES = (
    INSTANCES,
    HISTORY,
    DEDUP,
    TIMERS,
    TASKS,
    BRANCH_TOKENS,
    JOIN_STATES,
    DEFINITIONS,
    ACTIVATIONS,
    COMMANDS,
    COMMAND_QUEUES,
)

SIDE_EFFECT_TABLES = (SERVICE_OUTBOX, EVENTS, EVENT_CONSUMERS)

NOTIFY_CHANNEL = "vertique_workflow_commands"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")
_MAX_IDENTIFIER_BYTES = 63

# PostgreSQL's reserved key words (pg_get_keywords() catcode 'R'), plus the
# pg_ prefix that PostgreSQL keeps for system schemas.
RESERVED_WORDS = frozenset(
    [
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "both",
        "case",
        "cast",
        "check",
        "collate",
        "column",
        "constraint",
        "create",
        "current_catalog",
        "current_date",
        "current_role",
        "current_time",
        "current_timestamp",
        "current_user",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "false",
        "fetch",
        "for",
        "foreign",
        "from",
        "grant",
        "group",
        "having",
        "in",
        "initially",
        "intersect",
        "into",
        "lateral",
        "leading",
        "limit",
        "localtime",
        "localtimestamp",
        "not",
        "null",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "placing",
        "primary",
        "references",
        "returning",
        "select",
        "session_user",
        "some",
        "symmetric",
        "system_user",
        "table",
        "then",
        "to",
        "trailing",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "variadic",
        "when",
        "where",
        "window",
        "with",
    ]
)


def validate_schema(value: object) -> str | None:
    """Return the schema name to use, or raise ``ImproperlyConfigured``.

    ``None`` (or an absent setting) means unqualified names.
    """
    if value is None:
        return None
    prefix = "VERTIQUE_WORKFLOW['SCHEMA']"
    if not isinstance(value, str):
        raise ImproperlyConfigured(
            f"{prefix} must be a string or None, not {type(value).__name__}."
        )
    if not _IDENTIFIER.match(value) or len(value.encode()) > _MAX_IDENTIFIER_BYTES:
        raise ImproperlyConfigured(
            f"{prefix} must be one plain PostgreSQL identifier (letters, digits, _ and $, "
            f"starting with a letter or _, at most 63 bytes); got {value!r}."
        )
    if value.lower() in RESERVED_WORDS:
        raise ImproperlyConfigured(
            f"{prefix} {value!r} is a reserved word in PostgreSQL; choose another schema name."
        )
    if value.lower().startswith("pg_"):
        raise ImproperlyConfigured(
            f"{prefix} {value!r} starts with pg_, which PostgreSQL reserves for system schemas."
        )
    return value


def configured_schema() -> str | None:
    """The validated schema of the current settings (read now, not cached)."""
    raw = (getattr(settings, "VERTIQUE_WORKFLOW", None) or {}).get("SCHEMA")
    return validate_schema(raw)


def quote(identifier: str) -> str:
    """Double-quote an identifier that was validated or is one of ours."""
    return '"' + identifier.replace('"', '""') + '"'


SCHEMA: str | None = configured_schema()


def qualified(table: str, schema: str | None = SCHEMA) -> str:
    """``"schema"."table"`` with a placement, the bare table name without one.

    This is the form Django accepts as ``db_table`` and raw SQL accepts as a
    table reference.
    """
    if schema is None:
        return table
    return f"{quote(schema)}.{quote(table)}"


def qualified_object(name: str, schema: str | None = SCHEMA) -> str:
    """Qualify a function or sequence name the same way as tables."""
    return qualified(name, schema)


def sql_names(schema: str | None = SCHEMA) -> dict[str, str]:
    """Format arguments for the SQL templates of ``store/``: ``{instances}`` etc."""
    return {
        table.removeprefix("workflow_"): qualified(table, schema)
        for table in (*ALL_TABLES, *SIDE_EFFECT_TABLES)
    }
