"""The doctor: one planted case of each kind is found; a healthy database reports nothing."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings

import vertique_workflow as wf
from tests.admin_support import url
from vertique_workflow import doctor, registry, tables
from vertique_workflow.models import WorkflowCommand, WorkflowInstance
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)

T = tables.sql_names()


def sql(statement: str, params: Any = ()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def analyze() -> None:
    """Fresh statistics: earlier tests of this database changed the tables (autovacuum may be
    off on the test server), and stale statistics are a finding of their own."""
    for name in T.values():
        sql(f"ANALYZE {name}")


def kinds(report: doctor.DoctorReport) -> dict[str, doctor.Finding]:
    return {finding.kind: finding for finding in report.findings}


def example_ids(finding: doctor.Finding) -> set[Any]:
    return {example["instance_id"] for example in finding.examples}


def healthy_mix() -> None:
    """Work in every normal state: ended, waiting on a timer, a task, a declared signal."""
    wf.start("order", {"amount": 0}, idempotency_key="h-done")
    wf.start("order", {"amount": 5}, idempotency_key="h-signal")
    wf.start("nap", {}, idempotency_key="h-timer")
    wf.start("review", {"manager": "ann"}, idempotency_key="h-task")
    run_until_idle()


def test_a_healthy_database_reports_nothing():
    healthy_mix()
    analyze()
    report = doctor.diagnose()
    assert report.findings == [] and report.healthy
    assert report.figures["notification_queue_usage"] < 0.01  # measured, not a finding
    assert {t["table"] for t in report.figures["tables"]} >= {tables.INSTANCES, tables.COMMANDS}


def test_a_stranded_instance_is_found_with_its_fix():
    ref = wf.start("order", {"amount": 0}, idempotency_key="stranded")
    WorkflowCommand.objects.filter(workflow_id=ref.id).update(state="COMPLETE")  # lost its START
    found = kinds(doctor.diagnose())["STRANDED"]
    assert example_ids(found) == {ref.id} and found.count == 1
    assert "cancel" in found.fix


def test_a_waiting_instance_nothing_can_wake_is_found():
    registry.sync_code_definitions()  # the pinned rows say which signals each version declares
    ref = wf.start("nap", {}, idempotency_key="forever")
    run_until_idle()
    assert wf.get(ref.id).status == "WAITING"
    # the timer is lost (a hand edit): nothing else can wake a nap (it declares no signal)
    sql(f"UPDATE {T['timers']} SET status = 'CANCELLED' WHERE workflow_id = %s", [ref.id])
    WorkflowCommand.objects.filter(workflow_id=ref.id, state="PENDING").update(state="CANCELLED")
    waiting = wf.start("order", {"amount": 5}, idempotency_key="declared")  # waits on "paid"
    run_until_idle()
    found = kinds(doctor.diagnose())["WAITING_FOREVER"]
    assert example_ids(found) == {ref.id}  # not the order: "paid" could still wake it
    assert waiting.id not in example_ids(found)
    assert "migrate" in found.fix


def test_dead_letters_parked_signals_deferrals_and_expiring_leases_are_found():
    dead = wf.start("order", {"amount": 5}, idempotency_key="dead").id
    parked = wf.start("two-waits", {}, idempotency_key="parked").id
    deferred = wf.start("order", {"amount": 5}, idempotency_key="deferred").id
    expiring = wf.start("order", {"amount": 5}, idempotency_key="expiring").id
    run_until_idle()
    wf.signal(dead, "paid", {"amount_paid": 5}, dedup_key="d")
    WorkflowCommand.objects.filter(workflow_id=dead, kind="SIGNAL").update(
        state="DEAD", last_error="HANDLER_FAILED: the action kept failing"
    )
    wf.signal(parked, "second", None, dedup_key="early")  # waits for "first": parked
    run_until_idle()
    sql(
        f"UPDATE {T['commands']} SET recorded_at = now() - interval '2 hours' "
        "WHERE workflow_id = %s AND state = 'PARKED'",
        [parked],
    )
    wf.signal(deferred, "paid", {"amount_paid": 5}, dedup_key="p")
    WorkflowCommand.objects.filter(workflow_id=deferred, kind="SIGNAL").update(
        state="DEFERRED", deferral_count=6, claimed_by="node-a:12"
    )
    wf.signal(expiring, "paid", {"amount_paid": 5}, dedup_key="p")
    WorkflowCommand.objects.filter(workflow_id=expiring, kind="SIGNAL").update(attempts=3)
    found = kinds(doctor.diagnose())
    assert example_ids(found["DEAD_LETTERS"]) == {dead}
    assert "workflow_retry" in found["DEAD_LETTERS"].fix
    assert example_ids(found["PARKED_SIGNALS"]) == {parked}
    assert found["PARKED_SIGNALS"].examples[0]["signal"] == "second"
    deferral = found["DEFERRED_FOREVER"]
    assert example_ids(deferral) == {deferred}
    (example,) = deferral.examples
    assert (example["definition_id"], example["version"]) == ("order", 1)
    assert example["last_deferred_by"] == "node-a:12" and example["plan_hash"]
    assert example_ids(found["LEASE_EXPIRING"]) == {expiring}
    assert "LEASE_SECONDS" in found["LEASE_EXPIRING"].fix


def test_a_stuck_service_call_is_found():
    ref = wf.start("svc-charge", {"amount": 5}, idempotency_key="svc")
    run_until_idle(services=False)  # recorded, never called: no relay runs
    sql(
        f"UPDATE {T['service_outbox']} SET available_at = now() - interval '2 hours' "
        "WHERE workflow_id = %s",
        [ref.id],
    )
    found = kinds(doctor.diagnose())["STUCK_SERVICE_CALLS"]
    assert example_ids(found) == {ref.id}
    assert found.examples[0]["handler"] == "test.charge" and "relay" in found.fix
    assert "WAITING_FOREVER" not in kinds(doctor.diagnose())  # the call can still wake it


def test_a_busy_table_with_stale_statistics_is_found():
    analyze()
    dedup = T["dedup"]
    sql(f"ALTER TABLE {dedup} SET (autovacuum_enabled = false)")
    try:
        sql(f"SELECT pg_stat_reset_single_table_counters('{dedup}'::regclass)")
        sql(
            f"INSERT INTO {dedup} (kind, scope_key, dedup_namespace, key, workflow_id, "
            "fingerprint) SELECT 'START', 'default', 'stats', g::text, gen_random_uuid(), 'x' "
            "FROM generate_series(1, 1500) AS g"
        )
        sql("SELECT pg_stat_force_next_flush()")
        sql("SELECT 1")  # the flush happens as this session goes idle
        found = kinds(doctor.diagnose())["STALE_STATISTICS"]
        assert [e["table"] for e in found.examples] == [tables.DEDUP]
        assert found.examples[0]["changed_since_analyze"] >= 1500
        assert "ANALYZE" in found.fix
    finally:
        sql(f"ALTER TABLE {dedup} RESET (autovacuum_enabled)")


def test_the_notification_queue_threshold_is_a_setting():
    healthy_mix()
    analyze()
    with override_settings(
        VERTIQUE_WORKFLOW={**settings.VERTIQUE_WORKFLOW, "DOCTOR_NOTIFY_QUEUE_PERCENT": 1}
    ):
        report = doctor.diagnose()
    # a test server's queue is empty: the figure is read, and below even 1 %
    assert report.healthy and report.figures["notification_queue_usage"] < 0.01


def doctor_command(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("workflow_doctor", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


def test_the_command_exits_1_when_something_is_found_and_0_when_healthy():
    healthy_mix()
    analyze()
    assert doctor_command() == (0, "healthy: nothing needs a human\n")
    ref = wf.start("order", {"amount": 0}, idempotency_key="cmd")
    WorkflowCommand.objects.filter(workflow_id=ref.id).update(state="COMPLETE")
    status, output = doctor_command()
    assert status == 1
    assert "STRANDED:" in output and str(ref.id) in output and "fix: " in output
    status, output = doctor_command("--json")
    report = json.loads(output)
    assert status == 1 and report["healthy"] is False
    assert report["findings"][0]["kind"] == "STRANDED"
    assert report["findings"][0]["examples"][0]["instance_id"] == str(ref.id)


def test_the_admin_doctor_page_lists_findings_with_their_actions():
    ref = wf.start("order", {"amount": 0}, idempotency_key="adm")
    WorkflowCommand.objects.filter(workflow_id=ref.id).update(state="COMPLETE")
    admin_user = User.objects.create_superuser("doc", "doc@example.com", "pw")
    client = Client()
    client.force_login(admin_user)
    page = client.get(url(WorkflowInstance, "doctor"))
    assert page.status_code == 200
    body = page.content.decode()
    assert "Instances RUNNING or PENDING with no command" in body
    assert url(WorkflowInstance, "change", ref.id) in body
    assert url(WorkflowInstance, "cancel", ref.id) in body
    # linked from the instance list
    assert (
        url(WorkflowInstance, "doctor")
        in client.get(url(WorkflowInstance, "changelist")).content.decode()
    )


def test_the_admin_doctor_page_needs_staff_with_view_permission():
    User.objects.create_user("plain", password="pw", is_staff=True)
    client = Client()
    assert client.get(url(WorkflowInstance, "doctor")).status_code == 302  # to the login
    client.login(username="plain", password="pw")
    assert client.get(url(WorkflowInstance, "doctor")).status_code == 403


def test_a_diagnosis_opens_one_connection_and_leaves_no_transaction(monkeypatch):
    from vertique_workflow.store import db as store_db

    opened = []
    original = store_db.separate_cursor

    def counting() -> Any:
        opened.append(1)
        return original()

    monkeypatch.setattr(store_db, "separate_cursor", counting)
    healthy_mix()
    dead = wf.start("order", {"amount": 5}, idempotency_key="one-conn")
    sql(
        f"UPDATE {T['commands']} SET state = 'DEAD' WHERE workflow_id = %s AND kind = 'START'",
        [dead.id],
    )
    report = doctor.diagnose()
    assert "DEAD_LETTERS" in kinds(report)
    assert len(opened) == 1
    assert not connection.in_atomic_block


def test_a_dead_start_is_a_dead_letter_only_and_counts_are_exact_beyond_the_limit():
    ids = [wf.start("order", {"amount": 5}, idempotency_key=f"dead-{i}").id for i in range(3)]
    # PENDING instances whose START was dead-lettered: a retry repairs them
    sql(
        f"UPDATE {T['commands']} SET state = 'DEAD' WHERE workflow_id = ANY(%s::uuid[])",
        [[str(i) for i in ids]],
    )
    found = kinds(doctor.diagnose(limit=2))
    assert "STRANDED" not in found  # reported once, as dead letters
    assert found["DEAD_LETTERS"].count == 3 and len(found["DEAD_LETTERS"].examples) == 2


def test_a_version_with_no_recorded_signal_declaration_is_not_waiting_forever():
    registry.sync_code_definitions()
    ref = wf.start("nap", {}, idempotency_key="undeclared")
    run_until_idle()
    sql(f"UPDATE {T['timers']} SET status = 'CANCELLED' WHERE workflow_id = %s", [ref.id])
    WorkflowCommand.objects.filter(workflow_id=ref.id, state="PENDING").update(state="CANCELLED")
    assert example_ids(kinds(doctor.diagnose())["WAITING_FOREVER"]) == {ref.id}
    # a row from before the column existed admits every signal name (as wf.signal does)
    sql(f"UPDATE {T['definitions']} SET signal_names_json = NULL WHERE definition_id = 'nap'")
    assert "WAITING_FOREVER" not in kinds(doctor.diagnose())


@pytest.mark.parametrize(
    ("usage", "percent", "full"),
    [(0.0, 1, False), (0.0099, 1, False), (0.01, 1, True), (0.49, 50, False), (0.5, 50, True)],
)
def test_the_notification_queue_is_a_finding_from_its_threshold_on(usage, percent, full):
    assert doctor.notify_queue_full(usage, percent) is full
