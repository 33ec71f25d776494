"""Describe the workflow objects of one schema, as PostgreSQL itself reports them.

The description is plain data (dicts of strings) so a test can compare it with
``expected_schema.EXPECTED`` and print a readable difference. Schema names are
stripped from definitions so one expectation serves both placements.
"""

from __future__ import annotations

import re
from typing import Any

from vertique_workflow import tables


def _strip(text: str, schema: str) -> str:
    text = text.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    return re.sub(r"\s+", " ", text).strip()


def describe(conn: Any, schema: str) -> dict[str, Any]:
    out: dict[str, Any] = {"tables": {}}
    cur = conn.cursor()
    for table in (*tables.ALL_TABLES, *tables.SIDE_EFFECT_TABLES):
        cur.execute(
            """SELECT column_name, data_type,
                      COALESCE(character_maximum_length::text, ''), is_nullable,
                      COALESCE(column_default, ''), is_identity, COALESCE(identity_generation, ''),
                      COALESCE(domain_name::text, '')
               FROM information_schema.columns
               WHERE table_schema = %s AND table_name = %s ORDER BY column_name""",
            (schema, table),
        )
        columns = {
            name: " ".join(
                part
                for part in (
                    f"{dtype}({length})" if length else dtype,
                    f"DOMAIN {domain}" if domain else "",
                    "NULL" if nullable == "YES" else "NOT NULL",
                    f"DEFAULT {_strip(default, schema)}" if default else "",
                    f"IDENTITY {generation}" if identity == "YES" else "",
                )
                if part
            )
            for name, dtype, length, nullable, default, identity, generation, domain in (
                cur.fetchall()
            )
        }
        cur.execute(
            """SELECT con.conname, pg_get_constraintdef(con.oid)
               FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %s AND c.relname = %s AND con.contype <> 'n'
               ORDER BY con.conname""",
            (schema, table),
        )
        constraints = {name: _strip(definition, schema) for name, definition in cur.fetchall()}
        cur.execute(
            """SELECT i.relname, pg_get_indexdef(i.oid)
               FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
               JOIN pg_class c ON c.oid = x.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %s AND c.relname = %s AND i.relnamespace = n.oid
               ORDER BY i.relname""",
            (schema, table),
        )
        indexes = {name: _strip(definition, schema) for name, definition in cur.fetchall()}
        cur.execute(
            """SELECT t.tgname, pg_get_triggerdef(t.oid)
               FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %s AND c.relname = %s AND NOT t.tgisinternal""",
            (schema, table),
        )
        triggers = {name: _strip(definition, schema) for name, definition in cur.fetchall()}
        if columns:
            out["tables"][table] = {
                "columns": columns,
                "constraints": constraints,
                "indexes": indexes,
                "triggers": triggers,
            }
    cur.execute(
        """SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname = %s AND (p.proname LIKE 'pgtrigger%%' OR p.proname LIKE '%%workflow%%')
           ORDER BY 1""",
        (schema,),
    )
    out["functions"] = [row[0] for row in cur.fetchall()]
    cur.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND c.relkind = 'S' AND c.relname LIKE 'workflow%%' ORDER BY 1""",
        (schema,),
    )
    out["sequences"] = [row[0] for row in cur.fetchall()]
    cur.execute(
        """SELECT t.typname, format_type(t.typbasetype, t.typtypmod), con.conname,
                  pg_get_constraintdef(con.oid)
           FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
           LEFT JOIN pg_constraint con ON con.contypid = t.oid
           WHERE n.nspname = %s AND t.typtype = 'd' AND t.typname LIKE 'workflow%%'
           ORDER BY 1, 3""",
        (schema,),
    )
    out["domains"] = {
        name: f"{base} CONSTRAINT {constraint} {_strip(definition, schema)}" if constraint else base
        for name, base, constraint, definition in cur.fetchall()
    }
    return out


def workflow_objects_in(conn: Any, schema: str) -> list[str]:
    """Every relation, function or trigger of the schema whose name is workflow-related."""
    cur = conn.cursor()
    cur.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND (c.relname LIKE '%%workflow%%' OR c.relname LIKE 'wf\\_%%')
           UNION ALL
           SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname = %s AND p.proname LIKE '%%workflow%%'
           UNION ALL
           SELECT t.typname::text FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE n.nspname = %s AND t.typtype = 'd' AND t.typname LIKE '%%workflow%%'
           UNION ALL
           SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %s AND t.tgname LIKE '%%workflow%%'""",
        (schema, schema, schema, schema),
    )
    return sorted(row[0] for row in cur.fetchall())
