"""Many plain instance rows at once, for tests that need the planner to see a big table."""

from __future__ import annotations

from django.db import connection

from vertique_workflow.tables import sql_names

T = sql_names()


def seed_plain_instances(count: int) -> None:
    """``count`` COMPLETED rows in three scopes, updated over 90 days, then ANALYZE.

    Rows only (no history, commands or definitions row): enough for plans of
    the instance list, not for anything that runs them.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {T["instances"]} (id, definition_id, definition_version, plan_hash,
                status, scope_key, definition_scope_key, created_at, updated_at, completed_at)
            SELECT gen_random_uuid(), 'seeded', 1, 'seeded', 'COMPLETED',
                   (ARRAY['default', 'default', 'tenant-a', 'tenant-b'])[1 + g %% 4], 'default',
                   now() - make_interval(secs => g * 7), now() - make_interval(secs => g * 7),
                   now() - make_interval(secs => g * 7)
            FROM generate_series(1, %s) AS g
            """,
            [count],
        )
        cursor.execute(f"ANALYZE {T['instances']}")
