"""0017: the segment's persist fails itself unless it wrote (issue 14).

Creates ``workflow_persisted_once(written bigint)``, which returns its
argument when it is 1 and raises SQLSTATE 40001 otherwise. The persist
statement (``store/segment.py``) ends with it: a persist that wrote neither
the instance nor the command's completion fails, so the transaction's
``COMMIT``, sent in the same pipeline to save the segment one wait on the
server, never runs after it and the segment's earlier writes roll back. The
executor retries a 40001 as transient, as it did the same conflict found in
Python before.

Created in the workflow schema when one is configured; it reads no table.
Nothing is locked but the catalog. Reversing drops the function; the code of
this release calls it: reverse only to run an earlier release.
"""

from django.db import migrations

from vertique_workflow.store import segment


class Migration(migrations.Migration):
    dependencies = [
        ("vertique_workflow", "0016_notify_condition_in_function"),
    ]

    operations = [
        migrations.RunSQL(
            segment.persisted_once_function_sql(), segment.drop_persisted_once_function_sql()
        ),
    ]
