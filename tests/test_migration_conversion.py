"""0001 -> 0002 -> 0003 with rows present: values kept, running work converted."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import connect, run_manage
from tests.conftest import connect as connect_to
from tests.conftest import run_manage as run_manage_in

pytestmark = pytest.mark.slow

A = uuid.UUID("00000000-0000-0000-0000-00000000000a")
B = uuid.UUID("00000000-0000-0000-0000-00000000000b")
T_STEP, T_TIMEOUT, T_DUE, T_REMINDER, T_FIRED = (uuid.uuid4() for _ in range(5))
TASK = uuid.uuid4()
BR_RETRY, BR_RETRY_NO_TIME, BR_RUNNING = (uuid.uuid4() for _ in range(3))
HANDLER = "jobs/delayed/vertique.workflow.timer.fire/execute"


def seed_pre_0002(conn) -> None:
    conn.execute(
        """INSERT INTO workflow_instances (id, definition_id, definition_version, plan_hash,
               status, current_step_id, state_json, business_key, metadata, version)
           VALUES (%s, 'order', 1, 'h1', 'WAITING', 'wait', '{"n": 1}', 'BK-1',
                   '{"context": {"tenant": "t1"}}', 3),
                  (%s, 'order', 1, 'h1', 'COMPLETED', 'done', '{"n": 2}', NULL, '{}', 7)""",
        (A, B),
    )
    conn.execute(
        """INSERT INTO workflow_history (workflow_id, sequence, event_type, payload_json)
           VALUES (%s, 1, 'STARTED', '{"x": 1}'), (%s, 2, 'WAITING', NULL)""",
        (A, A),
    )
    conn.execute(
        """INSERT INTO workflow_dedup (kind, scope, key, workflow_id, fingerprint, result_json)
           VALUES ('START', 'order', 'k1', %s, 'fp1', '{"id": "a"}')""",
        (A,),
    )
    conn.execute(
        """INSERT INTO workflow_timers (id, workflow_id, step_id, purpose, fire_at, status,
               task_id, delayed_job_execution_id, metadata)
           VALUES (%s, %s, 'wait', 'SIGNAL_TIMEOUT', '2030-01-01T00:00:03Z', 'SCHEDULED', NULL,
                   gen_random_uuid(), '{"context": {"tenant": "t1"}, "identity": {"user": "ann"}}'),
                  (%s, %s, 'sleep', 'STEP', '2030-01-01T00:00:01Z', 'SCHEDULED', NULL,
                   gen_random_uuid(), '{}'),
                  (%s, %s, 'review', 'TASK_DUE', '2030-01-01T00:00:02Z', 'SCHEDULED', %s,
                   gen_random_uuid(), '{}'),
                  (%s, %s, 'review', 'TASK_REMINDER', '2030-01-01T00:00:04Z', 'SCHEDULED', %s,
                   gen_random_uuid(), '{}'),
                  (%s, %s, 'sleep', 'STEP', '2020-01-01T00:00:00Z', 'FIRED', NULL,
                   gen_random_uuid(), '{}')""",
        (T_TIMEOUT, A, T_STEP, A, T_DUE, A, TASK, T_REMINDER, A, TASK, T_FIRED, A),
    )
    conn.execute(
        """INSERT INTO workflow_tasks (id, workflow_id, step_id, name, status, assignee)
           VALUES (%s, %s, 'review', 'Review', 'OPEN', 'ann')""",
        (TASK, A),
    )
    conn.execute(
        """INSERT INTO workflow_branch_tokens (id, workflow_id, fork_step_id, branch_id, status,
               retry_at, metadata)
           VALUES (%s, %s, 'fork', 'b1', 'RETRY_SCHEDULED', '2030-01-01T00:00:05Z', '{}'),
                  (%s, %s, 'fork', 'b2', 'RETRY_SCHEDULED', NULL, '{}'),
                  (%s, %s, 'fork', 'b3', 'RUNNING', NULL, '{}')""",
        (BR_RETRY, B, BR_RETRY_NO_TIME, B, BR_RUNNING, B),
    )
    conn.execute("CREATE TABLE job_executions (id serial PRIMARY KEY, handler text, state text)")
    conn.execute(
        """INSERT INTO job_executions (handler, state) VALUES
             (%s, 'ENQUEUED'), (%s, 'PROCESSING'), (%s, 'FAILED'), (%s, 'ABANDONED'),
             (%s, 'SUCCEEDED'), (%s, 'CANCELLED'), (%s, 'DEAD_LETTER'),
             ('other/handler', 'ENQUEUED')""",
        (HANDLER,) * 7,
    )


PLACEMENTS = pytest.mark.parametrize(
    "schema", [None, "workflow_data"], ids=["unqualified", "named-schema"]
)


@PLACEMENTS
def test_rows_survive_and_running_work_is_converted(scratch_database, schema):
    db = scratch_database

    def connect(dbname):
        # the raw SQL below names tables unqualified; the search path finds the placement
        path = f"-csearch_path={schema},public" if schema else ""
        return connect_to(dbname, options=path)

    def run_manage(*args, **kwargs):
        return run_manage_in(*args, schema=schema, **kwargs)

    run_manage("migrate", "vertique_workflow", "0001", "-v", "0", dbname=db)
    with connect(db) as conn:
        seed_pre_0002(conn)

    run_manage("migrate", "vertique_workflow", "0002", "-v", "0", dbname=db)
    with connect(db) as conn:
        assert conn.execute(
            "SELECT kind, scope_key, dedup_namespace, key, fingerprint, result_json "
            "FROM workflow_dedup"
        ).fetchall() == [("START", "default", "order", "k1", "fp1", {"id": "a"})]
        assert conn.execute(
            "SELECT id, scope_key, definition_scope_key, state_json, version, business_key "
            "FROM workflow_instances ORDER BY id"
        ).fetchall() == [
            (A, "default", "default", {"n": 1}, 3, "BK-1"),
            (B, "default", "default", {"n": 2}, 7, None),
        ]
        assert conn.execute("SELECT scope_key FROM workflow_tasks").fetchall() == [("default",)]

    run_manage("migrate", "vertique_workflow", "0003", "-v", "0", dbname=db)
    with connect(db) as conn:
        commands = conn.execute(
            """SELECT workflow_id, seq, kind, state, timer_kind, timer_id, task_id, target_json,
                      fire_at IS NOT DISTINCT FROM available_at, context_json, actor_kind
               FROM workflow_commands ORDER BY workflow_id, seq"""
        ).fetchall()
        timers = dict(
            conn.execute(
                """SELECT t.id, c.seq FROM workflow_timers t
               LEFT JOIN workflow_commands c ON c.id = t.command_id"""
            ).fetchall()
        )
        metadata = conn.execute(
            "SELECT metadata FROM workflow_timers WHERE id = %s", (T_TIMEOUT,)
        ).fetchone()[0]
        queues = conn.execute(
            "SELECT workflow_id, next_seq, open_signals FROM workflow_command_queues "
            "ORDER BY workflow_id"
        ).fetchall()
        branches = dict(conn.execute("SELECT branch_id, status FROM workflow_branch_tokens"))
        baselines = conn.execute(
            "SELECT DISTINCT baseline_logged FROM workflow_instances"
        ).fetchall()
        jobs = conn.execute("SELECT handler, state FROM job_executions ORDER BY id").fetchall()
        history = conn.execute(
            "SELECT sequence, event_type, payload_json, entry_version, patch_json "
            "FROM workflow_history ORDER BY sequence"
        ).fetchall()

    a_commands = [c for c in commands if c[0] == A]
    # timers of one instance get ascending sequences by fire time
    assert [(c[1], c[2], c[4], c[5], c[6]) for c in a_commands] == [
        (1, "TIMER", "FIRE", T_STEP, None),
        (2, "TIMER", "DUE", T_DUE, TASK),
        (3, "TIMER", "TIMEOUT", T_TIMEOUT, None),
        (4, "TIMER", "REMINDER", T_REMINDER, TASK),
    ]
    assert all(c[3] == "PENDING" and c[7] is None and c[8] and c[9] is None for c in a_commands)
    assert all(c[10] == "SYSTEM" for c in commands)
    assert timers == {T_STEP: 1, T_DUE: 2, T_TIMEOUT: 3, T_REMINDER: 4, T_FIRED: None}
    assert metadata == {"context": {"tenant": "t1"}}, "identity namespace is stripped"

    b_commands = [c for c in commands if c[0] == B]
    assert [(c[2], c[7]["branchId"]) for c in b_commands] == [("RETRY", "b2"), ("RETRY", "b1")]
    assert branches == {"b1": "RUNNING", "b2": "RUNNING", "b3": "RUNNING"}

    assert queues == [(A, 5, 0), (B, 3, 0)]
    assert baselines == [(False,)]
    assert jobs == [
        (HANDLER, "SUCCEEDED"),
        (HANDLER, "CANCELLED"),
        (HANDLER, "DEAD_LETTER"),
        ("other/handler", "ENQUEUED"),
    ]
    assert history == [(1, "STARTED", {"x": 1}, 1, None), (2, "WAITING", None, 1, None)]

    # the conversion refuses to be undone while commands exist
    result = run_manage("migrate", "vertique_workflow", "0002", dbname=db, check=False)
    assert result.returncode != 0
    assert "cannot be reversed while workflow_commands holds commands" in result.stderr


def test_conversion_without_job_table_succeeds(scratch_database):
    run_manage("migrate", "vertique_workflow", "0002", "-v", "0", dbname=scratch_database)
    with connect(scratch_database) as conn:
        conn.execute(
            """INSERT INTO workflow_instances (id, definition_id, definition_version, plan_hash,
                   status, current_step_id, state_json)
               VALUES (%s, 'd', 1, 'h', 'WAITING', 's', '{}')""",
            (A,),
        )
    run_manage("migrate", "vertique_workflow", "-v", "0", dbname=scratch_database)
    with connect(scratch_database) as conn:
        assert conn.execute("SELECT count(*) FROM workflow_commands").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM workflow_command_queues").fetchone() == (0,)


NAP, RECEIPT, REVIEW = (uuid.uuid4() for _ in range(3))
REVIEW_TASK = uuid.uuid4()


def test_converted_timers_run_on_the_reshaped_engine(scratch_database):
    """Timers of a pre-0003 database (a timer step, a signal timeout, a task due date) fire."""
    db = scratch_database
    run_manage("migrate", "vertique_workflow", "0001", "-v", "0", dbname=db)
    with connect(db) as conn:
        conn.execute(
            """INSERT INTO workflow_instances (id, definition_id, definition_version, plan_hash,
                   status, current_step_id, state_json, metadata, version)
               VALUES (%s, 'nap', 1, 'old', 'WAITING', 'sleep', '{"asleep": true}', '{}', 2),
                      (%s, 'receipt-wait', 1, 'old', 'WAITING', 'receipt', '{}', '{}', 1),
                      (%s, 'review', 1, 'old', 'WAITING', 'review', '{"manager": "ann"}',
                       '{}', 1)""",
            (NAP, RECEIPT, REVIEW),
        )
        conn.execute(
            """INSERT INTO workflow_tasks (id, workflow_id, step_id, name, status, assignee)
               VALUES (%s, %s, 'review', 'Review the claim', 'OPEN', 'ann')""",
            (REVIEW_TASK, REVIEW),
        )
        conn.execute(
            """INSERT INTO workflow_timers (id, workflow_id, step_id, purpose, fire_at, status,
                   task_id, delayed_job_execution_id, metadata)
               VALUES (gen_random_uuid(), %s, 'sleep', 'STEP', now() - interval '1 hour',
                       'SCHEDULED', NULL, gen_random_uuid(), '{}'),
                      (gen_random_uuid(), %s, 'receipt', 'SIGNAL_TIMEOUT',
                       now() - interval '1 hour', 'SCHEDULED', NULL, gen_random_uuid(), '{}'),
                      (gen_random_uuid(), %s, 'review', 'TASK_DUE', now() - interval '1 hour',
                       'SCHEDULED', %s, gen_random_uuid(), '{}')""",
            (NAP, RECEIPT, REVIEW, REVIEW_TASK),
        )
    run_manage("migrate", "vertique_workflow", "-v", "0", dbname=db)
    run_manage("workflow_executor", "--until-idle", dbname=db)
    with connect(db) as conn:
        instances = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, status, state_json FROM workflow_instances"
            ).fetchall()
        }
        timers = conn.execute("SELECT DISTINCT status FROM workflow_timers").fetchall()
        commands = conn.execute(
            "SELECT DISTINCT kind, state FROM workflow_commands ORDER BY 1"
        ).fetchall()
        task = conn.execute(
            "SELECT status FROM workflow_tasks WHERE id = %s", (REVIEW_TASK,)
        ).fetchone()
        baselines = conn.execute(
            "SELECT count(*) FROM workflow_history WHERE event_type = 'STATE_BASELINE'"
        ).fetchone()
    assert instances[NAP] == ("COMPLETED", {"asleep": False, "woke": True})
    assert instances[RECEIPT] == ("COMPLETED", {"expired": True})
    assert instances[REVIEW] == ("COMPLETED", {"manager": "ann", "outcome": "escalated"})
    assert timers == [("FIRED",)]
    assert commands == [("TIMER", "COMPLETE")]
    assert task == ("CANCELLED",)
    assert baselines == (3,), "each converted instance logs one baseline at its first segment"
