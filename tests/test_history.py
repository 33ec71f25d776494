"""History: who asked (attribution), the pre-0003 baseline, state versions, oversized patches."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

import vertique_workflow as wf
from tests.flows.workflows import Billing, Gate
from vertique_workflow import tables
from vertique_workflow.engine.decision_log import HistoryEntry
from vertique_workflow.models import WorkflowCommand, WorkflowHistory, WorkflowInstance
from vertique_workflow.store import db, history
from vertique_workflow.store import segment as segment_store
from vertique_workflow.testing import run_until_idle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("reset_gates")]

INSTANCES = tables.qualified(tables.INSTANCES)
HISTORY = tables.qualified(tables.HISTORY)
ACTOR = ("actor_kind", "actor_id", "actor_reason", "attribution_status")


def rows(instance_id) -> list[WorkflowHistory]:
    return list(WorkflowHistory.objects.filter(workflow_id=instance_id).order_by("sequence"))


def actor_of(entry: WorkflowHistory) -> tuple:
    return tuple(getattr(entry, column) for column in ACTOR)


def entry(instance_id, event_type: str) -> WorkflowHistory:
    return WorkflowHistory.objects.get(workflow_id=instance_id, event_type=event_type)


def mark_pre_0003(instance_id) -> None:
    """What migration 0003 does to an existing instance: its first segment owes a baseline."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {INSTANCES} SET baseline_logged = FALSE WHERE id = %s",
            [instance_id],
        )


def baseline_logged(instance_id) -> bool:
    return WorkflowInstance.objects.get(pk=instance_id).baseline_logged


# -- attribution -------------------------------------------------------------


def test_a_deferred_command_carries_its_own_actor():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    WorkflowCommand.objects.create(
        workflow_id=ref.id,
        seq=2,
        kind="MIGRATION",
        target_json={"version": 2},
        state="PENDING",
        actor_kind="SYSTEM",
        actor_reason="timer",
        attribution_status="VERIFIED",
    )
    assert run_until_idle().outcomes == ["DEFERRED"]
    deferred = entry(ref.id, "COMMAND_DEFERRED")
    assert actor_of(deferred) == ("SYSTEM", None, "timer", "VERIFIED")


def test_a_deferred_command_without_an_actor_is_logged_none_absent():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    WorkflowCommand.objects.create(
        workflow_id=ref.id, seq=2, kind="MIGRATION", target_json={"version": 2}, state="PENDING"
    )
    assert run_until_idle().outcomes == ["DEFERRED"]
    assert actor_of(entry(ref.id, "COMMAND_DEFERRED")) == ("NONE", None, None, "ABSENT")


def test_entries_a_segment_writes_about_other_commands_carry_those_commands_actors():
    """A RETRY segment (by ops) writes entries naming a dead START (by ann) and re-offers a
    dead signal (by bob): each entry is attributed to the command it names."""
    Gate.fail_times = 100
    ref = wf.start("shipment", {"ref": "A-1"}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    Gate.fail_times = 0
    wf.retry(ref.id, actor=wf.Actor.user("ops"), reason="carrier back")
    run_until_idle()
    assert entry(ref.id, "COMMAND_SUPERSEDED").actor_id == "ann"
    assert entry(ref.id, "WORKFLOW_RETRIED").actor_id == "ops"
    # the persist sends the segment's command, executor and pin once: an entry that
    # names a command of its own keeps it, every other entry takes the segment's
    start = WorkflowCommand.objects.get(workflow_id=ref.id, kind="START")
    retry = WorkflowCommand.objects.get(workflow_id=ref.id, kind="RETRY")
    superseded, retried = entry(ref.id, "COMMAND_SUPERSEDED"), entry(ref.id, "WORKFLOW_RETRIED")
    assert (superseded.command_id, retried.command_id) == (start.id, retry.id)
    for logged in (superseded, retried):
        assert logged.executor_id == retry.claimed_by
        assert (logged.definition_id, logged.definition_version) == ("shipment", 1)
    started_again = [r for r in rows(ref.id) if r.event_type == "DECISION"]
    assert started_again and {r.actor_id for r in started_again} == {"ops"}

    billing = wf.start("billing", {}, idempotency_key="k2", actor=wf.Actor.user("ann"))
    run_until_idle()
    Billing.fail_times = 100
    wf.signal(billing.id, "charge", None, dedup_key="c1", actor=wf.Actor.user("bob"))
    run_until_idle()
    Billing.fail_times = 0
    wf.retry(billing.id, actor=wf.Actor.user("ops"))
    run_until_idle()
    reoffered = entry(billing.id, "COMMAND_REOFFERED")
    assert (reoffered.actor_kind, reoffered.actor_id) == ("USER", "bob")
    # the re-offered signal then runs its own segment, under its own actor
    assert entry(billing.id, "SIGNAL_APPLIED").actor_id == "bob"


def test_a_segment_whose_entries_name_only_its_command_persists_without_joining_it(
    monkeypatch,
):
    """The common segment's persist takes the statement without the attribution join
    (``segment.OWN_PERSIST``); its entries carry the same actor the join gives."""
    sent = []

    def recording(original):
        def record(sql, *args):
            sent.append(sql)
            return original(sql, *args)

        return record

    # the persist runs as either, by whether it carries its transaction's COMMIT
    for name in ("fetchone_prepared", "fetchone_prepared_then_commit"):
        monkeypatch.setattr(db, name, recording(getattr(db, name)))
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    assert segment_store.OWN_PERSIST in sent
    assert segment_store.PERSIST not in sent and segment_store.PERSIST_SIGNAL not in sent
    written = rows(ref.id)
    command = WorkflowCommand.objects.get(workflow_id=ref.id, kind="START")
    assert actor_of(command)[:2] == ("USER", "ann")
    assert written and {actor_of(r) for r in written} == {actor_of(command)}
    assert {r.command_id for r in written} == {command.id}


def test_a_parked_signal_is_attributed_to_its_own_command_in_every_entry():
    """A signal parked early, re-queued by the segment of another command and rejected
    when the instance ends in a third: every entry naming it carries its sender."""
    ref = wf.start("two-waits", {}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    wf.signal(ref.id, "extra", None, dedup_key="x1", actor=wf.Actor.user("eve"))
    wf.signal(ref.id, "second", None, dedup_key="s2", actor=wf.Actor.user("bob"))
    run_until_idle()
    wf.signal(ref.id, "first", None, dedup_key="s1", actor=wf.Actor.user("cy"))
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    by_command = {c.id: c.actor_id for c in WorkflowCommand.objects.filter(workflow_id=ref.id)}
    named = [r for r in rows(ref.id) if r.command_id is not None]
    assert named
    for r in named:
        assert r.actor_id == by_command[r.command_id], (r.event_type, r.command_id)
    rejected = entry(ref.id, "COMMAND_REJECTED")
    assert rejected.actor_id == "eve"


def test_an_entry_that_has_an_actor_is_never_overwritten():
    ref = wf.start("two-waits", {}, idempotency_key="k1", actor=wf.Actor.user("ann"))
    run_until_idle()
    wf.signal(ref.id, "second", None, dedup_key="s2", actor=wf.Actor.user("bob"))
    run_until_idle()
    wf.cancel(ref.id, reason="no longer needed", actor=wf.Actor.user("carol"))
    # the canceller is stored on the entry about bob's signal, not bob
    assert entry(ref.id, "COMMAND_CANCELLED").actor_id == "carol"
    before = {r.sequence: actor_of(r) for r in rows(ref.id)}
    last = max(before)
    # an entry with no actor, as history written before actors were logged
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {HISTORY} (workflow_id, sequence, event_type) "
            "VALUES (%s, %s, 'LEGACY_NOTE')",
            [ref.id, last + 1],
        )
    system = {"actor_kind": "SYSTEM", "actor_reason": "backfill", "attribution_status": "VERIFIED"}
    with transaction.atomic():
        assert history.attribute_history(ref.id, 1, system) == 1
    after = {r.sequence: actor_of(r) for r in rows(ref.id)}
    assert {s: a for s, a in after.items() if s <= last} == before
    assert after[last + 1] == ("SYSTEM", None, "backfill", "VERIFIED")


def test_attribute_history_starts_at_its_sequence():
    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    with connection.cursor() as cur:
        for sequence in (100, 101):
            cur.execute(
                f"INSERT INTO {HISTORY} (workflow_id, sequence, event_type) "
                "VALUES (%s, %s, 'LEGACY_NOTE')",
                [ref.id, sequence],
            )
    with transaction.atomic():
        assert history.attribute_history(ref.id, 101, {"actor_kind": "SYSTEM"}) == 1
    assert WorkflowHistory.objects.get(workflow_id=ref.id, sequence=100).actor_kind is None
    assert WorkflowHistory.objects.get(workflow_id=ref.id, sequence=101).actor_kind == "SYSTEM"


# -- the pre-0003 baseline ---------------------------------------------------


def baselines(instance_id) -> list[WorkflowHistory]:
    return [r for r in rows(instance_id) if r.event_type == "STATE_BASELINE"]


def test_a_pre_0003_instance_logs_one_baseline_at_its_first_segment():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    WorkflowHistory.objects.filter(workflow_id=ref.id).delete()  # its history predates the log
    mark_pre_0003(ref.id)
    # a parked signal's segment persists nothing: it neither logs nor consumes the baseline
    wf.signal(ref.id, "second", None, dedup_key="s2")
    assert run_until_idle().outcomes == ["PARKED"]
    assert baselines(ref.id) == [] and baseline_logged(ref.id) is False

    wf.signal(ref.id, "first", {"note": "x"}, dedup_key="s1")
    run_until_idle()
    assert wf.get(ref.id).status == "COMPLETED"
    logged = baselines(ref.id)
    assert len(logged) == 1
    assert logged[0].payload_json == {"state": {"log": ["begin"]}}
    assert baseline_logged(ref.id) is True
    last = rows(ref.id)[-1].sequence
    assert wf.state_at(ref.id, last) == wf.get(ref.id).state


def test_a_retry_that_only_re_offers_does_not_consume_the_baseline():
    """The RETRY segment of a WAITING instance logs no decisions: the re-offered signal's
    segment that follows logs the baseline (before: the RETRY consumed it, none was logged)."""
    ref = wf.start("billing", {}, idempotency_key="k1")
    run_until_idle()
    Billing.fail_times = 100
    wf.signal(ref.id, "charge", None, dedup_key="c1")
    run_until_idle()
    mark_pre_0003(ref.id)
    Billing.fail_times = 0
    wf.retry(ref.id)
    run_until_idle()
    retried = entry(ref.id, "WORKFLOW_RETRIED").sequence
    late = [r for r in baselines(ref.id) if r.sequence > retried]
    assert len(late) == 1
    assert late[0].command_id == entry(ref.id, "SIGNAL_APPLIED").command_id
    assert baseline_logged(ref.id) is True
    assert wf.state_at(ref.id, rows(ref.id)[-1].sequence) == wf.get(ref.id).state


def test_a_segment_that_read_the_mark_stale_cannot_log_a_second_baseline():
    """The consumption is guarded by ``baseline_logged = FALSE`` in the persisting update:
    a segment that believes the baseline owed, once another consumed it, writes nothing
    and fails with 40001 (retried as transient)."""
    from vertique_workflow.store import instances
    from vertique_workflow.store import segment as segment_store

    ref = wf.start("order", {"amount": 5}, idempotency_key="k1")
    run_until_idle()
    mark_pre_0003(ref.id)
    stale = instances.get(ref.id)
    assert stale is not None and stale.baseline_logged is False
    with connection.cursor() as cur:  # another segment consumed it (same version)
        cur.execute(
            f"UPDATE {INSTANCES} SET baseline_logged = TRUE WHERE id = %s",
            [ref.id],
        )
    count = WorkflowHistory.objects.filter(workflow_id=ref.id).count()
    with pytest.raises(DatabaseError) as raised, transaction.atomic():
        segment_store.persist(
            instance=stale,
            command_id=0,
            token=None,
            status=stale.status,
            current_step=stale.current_step_id,
            state=stale.state_json,
            error_type=None,
            error_message=None,
            ended=False,
            subject=None,
            entries=[],
            common={},
            actor=history.NO_ACTOR,
            new_version=stale.version + 1,
            legacy_baseline=True,
        )
    assert db.sqlstate(raised.value) == "40001" and db.is_retryable(raised.value)
    assert segment_store.PERSIST_CONFLICT in str(raised.value)
    assert WorkflowHistory.objects.filter(workflow_id=ref.id).count() == count
    assert WorkflowInstance.objects.get(pk=ref.id).version == stale.version


# -- state versions ------------------------------------------------------------


def test_state_versions_follow_the_instance_version_across_segments():
    ref = wf.start("two-waits", {}, idempotency_key="k1")
    run_until_idle()
    versions = [WorkflowInstance.objects.get(pk=ref.id).version]
    seen = [len(rows(ref.id))]
    for name, payload in (("first", {"a": 1}), ("second", {"b": 2})):
        wf.signal(ref.id, name, payload, dedup_key=name)
        run_until_idle()
        versions.append(WorkflowInstance.objects.get(pk=ref.id).version)
        seen.append(len(rows(ref.id)))
    assert wf.get(ref.id).status == "COMPLETED"
    logged = [r for r in rows(ref.id) if r.entry_version == 2]
    segments = [
        [r for r in logged if lo < r.sequence <= hi]
        for lo, hi in zip([0, *seen[:-1]], seen, strict=True)
    ]
    read = 0  # a new instance's version
    previous_after = None
    for segment, written in zip(segments, versions, strict=True):
        assert segment, "every segment logged decisions"
        assert segment[0].state_version_before == read, "a segment starts at the version it read"
        for r in segment:
            if previous_after is not None:
                assert r.state_version_before == previous_after
            step = r.state_version_after - r.state_version_before
            changed = r.event_type == "DECISION" and r.patch_json != []
            assert step == (1 if changed else 0), (r.event_type, r.step_id)
            previous_after = r.state_version_after
        # the instance's version is the version of its state (one past the read at least)
        assert written == max(read + 1, segment[-1].state_version_after)
        read = written
    assert versions == sorted(set(versions)), "strictly increasing across segments"
    afters = [r.state_version_after for r in logged]
    assert afters == sorted(afters)


# -- oversized patches -------------------------------------------------------


@override_settings(VERTIQUE_WORKFLOW={"HISTORY_PATCH_MAX_BYTES": 200})
def test_an_oversized_patch_is_logged_as_a_baseline_and_replay_still_holds():
    ref = wf.start("growing", {"size": 300}, idempotency_key="k1")
    run_until_idle()
    wf.signal(ref.id, "more", None, dedup_key="m1")
    run_until_idle()
    live = wf.get(ref.id).state
    assert len(live["blob"]) == 600
    log = rows(ref.id)
    for step in ("grow", "grow_again"):
        decision = next(r for r in log if r.event_type == "DECISION" and r.step_id == step)
        assert decision.patch_json is None, "too large to log as a patch"
        follower = next(r for r in log if r.sequence == decision.sequence + 1)
        assert follower.event_type == "STATE_BASELINE"
        assert follower.state_version_before == decision.state_version_after
        assert wf.state_at(ref.id, follower.sequence) == follower.payload_json["state"]
    small = [r for r in log if r.event_type == "DECISION" and r.patch_json == []]
    assert small, "unchanged decisions keep their empty patch"
    assert wf.state_at(ref.id, log[-1].sequence) == live


# -- the persist's positional entries --------------------------------------------


def test_fields_a_segment_leaves_out_are_stored_as_sql_null():
    """The persist sends each entry as a JSON array (``history.entry_array``): a field the
    entry does not set reaches the table as NULL, never as a JSON ``null``."""
    ref = wf.start("order", {"amount": 5}, idempotency_key="k-null")
    run_until_idle()
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT event_type, patch_json IS NULL, jsonb_typeof(patch_json), step_id IS NULL, "
            f"outcome IS NULL, state_version_before IS NULL, jsonb_typeof(payload_json), "
            f"command_id IS NOT NULL, executor_id IS NOT NULL, definition_id "
            f"FROM {HISTORY} WHERE workflow_id = %s ORDER BY sequence",
            [ref.id],
        )
        stored = {row[0]: row[1:] for row in cur.fetchall()}
    # an entry with no patch, step, outcome or versions: NULL in each
    assert stored["WORKFLOW_STARTED"] == (
        True,
        None,
        True,
        True,
        True,
        "object",
        True,
        True,
        "order",
    )
    # a decision carries its patch as a JSON array, and the segment's shared columns
    assert stored["DECISION"][:2] == (False, "array")
    assert stored["DECISION"][6:] == (True, True, "order")


def test_an_entry_field_the_history_has_no_column_for_is_refused():
    entry = HistoryEntry("COMMAND_SUPERSEDED", {"commandId": 5}, extra={"comand_id": 5})
    with pytest.raises(ValueError, match="comand_id"):
        history.entry_array(entry, 1)
    named = HistoryEntry("COMMAND_SUPERSEDED", {"commandId": 5}, extra={"command_id": 5})
    assert history.entry_array(named, 2) == [
        2,
        "COMMAND_SUPERSEDED",
        {"commandId": 5},
        None,
        None,
        None,
        1,
        None,
        None,
        5,
    ]
