"""0009: less work on every claim and every settlement of a command (issue 14).

Two changes to ``workflow_commands``, each measured with callgrind on a
one-thread drain (docs/performance.md, "Dead entries of one instant" and
"The timer check, shorter"):

1. ``wf_cmd_active_avail_idx`` stores every entry on its own
   (``deduplicate_items = off``). Commands recorded in one transaction share
   ``available_at`` (its ``now()``), and B-tree deduplication keeps equal keys
   in one posting list. A claim leaves two dead versions of its command in the
   index (PENDING, then CLAIMED once settled); PostgreSQL marks an index entry
   dead when a scan finds its row dead to every transaction, but a posting list
   only when all of its rows are, so in a batch recorded together the dead
   versions stayed unmarked and every later claim read the table for each of
   them again: about 250 a claim in a 2,000-instance drain, 5 without
   deduplication. The index holds active commands only, so storing each entry
   costs little space. The setting applies to what is inserted from now on
   (PostgreSQL takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go on);
   posting lists already stored go with their entries.

2. ``workflow_commands_timer_kind_check`` is spelled with one comparison of two
   truth values instead of two alternatives: ``(kind = 'TIMER') = (timer_kind
   IS NOT NULL) AND timer_kind = ANY (...)``, the same verdict for every row
   (a NULL ``timer_kind`` makes the second half NULL, which a CHECK admits, as
   before). PostgreSQL reads a table's checks back from their stored text for
   every statement that writes the table (a claim, a settlement): this one was
   more than half of that text (2,199 of 3,840 characters), now 1,488. Adding
   it validates the existing rows under the table's ACCESS EXCLUSIVE lock, as
   0006 did: on a very large command log expect one scan of it.

Django's model state is unchanged (the model's ``Q`` conditions and index
stay the rule of ``Model.validate_constraints`` and of ``makemigrations``);
only the database changes. Reversing restores 0006's check and the index's
default.
"""

from django.db import migrations

from vertique_workflow import tables

COMMANDS = tables.sql_names()["commands"]
AVAILABILITY_INDEX = tables.qualified("wf_cmd_active_avail_idx")
TIMER_KINDS = "'{FIRE,TIMEOUT,DUE,REMINDER}'::text[]"


def timer_check(condition: str) -> str:
    return f"""
ALTER TABLE {COMMANDS}
    DROP CONSTRAINT workflow_commands_timer_kind_check,
    ADD CONSTRAINT workflow_commands_timer_kind_check CHECK ({condition})
"""


# set exactly when kind is TIMER, and then one of the four
ONE_COMPARISON = timer_check(
    f"(kind::text = 'TIMER') = (timer_kind IS NOT NULL) AND timer_kind::text = ANY ({TIMER_KINDS})"
)
# 0006's spelling
TWO_ALTERNATIVES = timer_check(
    f"(kind::text = 'TIMER' AND timer_kind IS NOT NULL AND timer_kind::text = ANY ({TIMER_KINDS}))"
    " OR (NOT kind::text = 'TIMER' AND timer_kind IS NULL)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0008_command_state_without_statistics"),
    ]

    operations = [
        # bound the wait for the table's lock, as 0006 and 0008 do (docs/migrations.md)
        migrations.RunSQL("SET LOCAL lock_timeout = '30s'", migrations.RunSQL.noop),
        migrations.RunSQL(
            f"ALTER INDEX {AVAILABILITY_INDEX} SET (deduplicate_items = off)",
            f"ALTER INDEX {AVAILABILITY_INDEX} RESET (deduplicate_items)",
        ),
        migrations.RunSQL(ONE_COMPARISON, TWO_ALTERNATIVES),
    ]
