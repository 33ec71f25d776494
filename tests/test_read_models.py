"""Read models: wf.instances keyset pages, wf.history pages, wf.count_non_terminal."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
from django.db import connection, connections

import vertique_workflow as wf
from tests.conftest import in_threads
from vertique_workflow.models import WorkflowInstance
from vertique_workflow.store import read_models
from vertique_workflow.testing import run_until_idle

pytestmark = pytest.mark.django_db(transaction=True)


def start(n: int, *, prefix: str, amount: int = 5, scope: str = "default") -> list[Any]:
    return [
        wf.start(
            "order",
            {"amount": amount},
            idempotency_key=f"{prefix}-{i}",
            business_key=f"{prefix}-{i}",
            scope=scope,
        ).id
        for i in range(n)
    ]


def all_pages(**filters: Any) -> list[wf.InstanceSummary]:
    seen: list[wf.InstanceSummary] = []
    cursor = None
    while True:
        page = wf.instances(cursor=cursor, **filters)
        seen.extend(page.items)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def test_pages_are_newest_change_first_and_cover_every_instance_once():
    ids = start(23, prefix="a")
    rows = all_pages(limit=5)
    assert sorted(r.id for r in rows) == sorted(ids)
    keys = [(r.updated_at, r.id) for r in rows]
    assert keys == sorted(keys, key=lambda k: (-k[0].timestamp(), str(k[1])))
    first = wf.instances(limit=5)
    assert len(first) == 5 and first.next_cursor is not None


def test_each_filter_narrows_the_list():
    waiting = start(3, prefix="w", amount=5)
    done = start(2, prefix="d", amount=0)
    tenant = start(2, prefix="t", amount=5, scope="tenant-a")
    run_until_idle()
    ids = lambda **f: {r.id for r in all_pages(limit=2, **f)}  # noqa: E731
    assert ids(status="COMPLETED") == set(done)
    assert ids(status=["WAITING"], scope="default") == set(waiting)
    assert ids(scope="tenant-a") == set(tenant)
    assert ids(scope="nowhere") == set()
    assert ids(business_key="d-1") == {done[1]}
    assert ids(definition_id="order", definition_version=1) == set(waiting + done + tenant)
    assert ids(definition_id="shipment") == set()
    assert ids(definition_version=2) == set()
    newest = max(r.updated_at for r in all_pages())
    assert ids(updated_after=newest) == {r.id for r in all_pages() if r.updated_at == newest}
    assert ids(updated_before=newest) == {r.id for r in all_pages() if r.updated_at < newest}


def test_archived_instances_are_hidden_unless_asked():
    archived, kept = start(2, prefix="x")
    WorkflowInstance.objects.filter(id=archived).update(
        archived_at=datetime.datetime.now(datetime.UTC)
    )
    assert {r.id for r in all_pages()} == {kept}
    listed = {r.id: r for r in all_pages(include_archived=True)}
    assert set(listed) == {archived, kept}
    assert listed[archived].archived_at is not None and listed[kept].archived_at is None


def test_bad_arguments_are_refused_clearly():
    for bad in (
        {"status": "SLEEPING"},
        {"status": []},
        {"limit": 0},
        {"limit": "10"},
        {"definition_version": "1"},
        {"updated_after": "yesterday"},
        {"updated_after": datetime.datetime(2026, 1, 1)},
        {"cursor": "not-a-cursor"},
    ):
        with pytest.raises(wf.WorkflowValidationError):
            wf.instances(**bad)


def test_a_task_cursor_is_not_an_instance_cursor():
    from vertique_workflow.store import tasks

    task_cursor = tasks.encode_cursor(datetime.datetime.now(datetime.UTC), "0" * 32)
    with pytest.raises(wf.WorkflowValidationError):
        wf.instances(cursor=task_cursor)


def test_limit_is_capped():
    start(3, prefix="c")
    assert len(wf.instances(limit=10_000)) == 3
    _, params, limit = read_models.instance_page_sql(limit=10_000)
    assert limit == read_models.QUERY_LIMIT_MAX and params["limit"] == limit + 1


def test_pages_never_skip_or_repeat_under_concurrent_inserts():
    before = set(start(40, prefix="p"))
    paging_started = threading.Event()
    stop = threading.Event()

    def insert() -> int:
        paging_started.wait(30)
        made = 0
        while not stop.is_set() and made < 200:
            start(1, prefix=f"late-{made}")
            made += 1
        connections.close_all()
        return made

    def page_through() -> list[Any]:
        seen: list[Any] = []
        cursor = None
        try:
            while True:
                page = wf.instances(limit=3, cursor=cursor)
                paging_started.set()
                seen.extend(r.id for r in page.items)
                if page.next_cursor is None:
                    return seen
                cursor = page.next_cursor
        finally:
            stop.set()
            connections.close_all()

    made, seen = in_threads(insert, page_through)
    assert len(seen) == len(set(seen)), "a row was repeated across pages"
    assert before <= set(seen), "a row that existed before paging began was skipped"
    assert made >= 1


# -- plans ---------------------------------------------------------------------


def seed_instances(count: int) -> None:
    """Many instance rows at once (two scopes, spread updated_at), then ANALYZE."""
    from tests.scale_rows import seed_plain_instances

    seed_plain_instances(count)


def plan_of(sql: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (COSTS OFF) " + sql, params)
        return "\n".join(r[0] for r in cursor.fetchall())


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"scope": "default"}, "idx_workflow_instances_scope_updated_at"),
        ({}, "idx_workflow_instances_scope_updated_at"),
        ({"status": "COMPLETED"}, "wf_inst_status_updated_idx"),
        ({"status": ["FAILED", "COMPLETED"]}, "wf_inst_status_updated_idx"),
    ],
    ids=["scope", "all-scopes", "status", "statuses"],
)
def test_list_pages_are_index_ranges_not_table_sorts(filters: dict[str, Any], index: str):
    seed_instances(30_000)
    first = wf.instances(limit=50, **filters)
    assert len(first) == 50
    status = filters.get("status")
    sql, params, _ = read_models.instance_page_sql(
        limit=50,
        cursor=first.next_cursor,
        scope=filters.get("scope"),
        statuses=[status] if isinstance(status, str) else status,
    )
    plan = plan_of(sql, params)
    assert index in plan, plan
    assert "Seq Scan" not in plan, plan
    if filters.get("scope"):
        assert "Sort" not in plan, plan  # the index order is the page order


# -- history pages -------------------------------------------------------------


def test_history_pages_carry_attribution_decisions_and_open_commands():
    (instance,) = start(1, prefix="h")
    run_until_idle()
    wf.signal(instance, "paid", {"amount_paid": 5}, dedup_key="pay-1")
    full = wf.history_of(instance)
    pages: list[wf.HistoryEntryView] = []
    cursor = None
    while True:
        page = wf.history(instance, limit=2, cursor=cursor)
        pages.extend(page.entries)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert [e.sequence for e in pages] == [e["sequence"] for e in full]
    assert [e.event_type for e in pages] == [e["event_type"] for e in full]
    decision = next(e for e in pages if e.event_type == "DECISION")
    assert decision.patch is not None and decision.state_version_after is not None
    assert decision.plan_hash and decision.definition_id == "order"
    assert all(e.actor_kind for e in pages)
    # the unapplied signal is the open command
    assert [(c.kind, c.state, c.signal_name) for c in page.open_commands] == [
        ("SIGNAL", "PENDING", "paid")
    ]
    # newest first, and the state at an entry
    newest = wf.history(instance, limit=1, newest_first=True)
    assert newest.entries[0].sequence == full[-1]["sequence"]
    with pytest.raises(wf.WorkflowValidationError):
        wf.history(instance, cursor=newest.next_cursor)  # other direction
    state = newest.state_at(decision.sequence)
    assert state["reserved"] is True
    run_until_idle()
    assert wf.history(instance).open_commands == []


def test_history_of_a_missing_instance_is_not_found():
    with pytest.raises(wf.WorkflowNotFound):
        wf.history("00000000-0000-0000-0000-000000000000")
    with pytest.raises(wf.WorkflowNotFound):
        wf.history("nope")


# -- count_non_terminal --------------------------------------------------------


def test_count_non_terminal_counts_live_instances_of_that_version_and_scope():
    start(3, prefix="live", amount=5)
    start(2, prefix="ended", amount=0)
    start(1, prefix="other", amount=5, scope="tenant-a")
    run_until_idle()
    archived = WorkflowInstance.objects.filter(status="WAITING", scope_key="default").first()
    WorkflowInstance.objects.filter(id=archived.id).update(
        archived_at=datetime.datetime.now(datetime.UTC)
    )
    tenant = WorkflowInstance.objects.get(scope_key="tenant-a")
    assert tenant.definition_scope_key == "default"  # pinned to the default scope's definition
    # 3 live in the default scope (one archived: still counted) + the tenant's, pinned to default
    assert wf.count_non_terminal("order", 1) == 4
    assert wf.count_non_terminal("order", 1, scope="tenant-a") == 0
    assert wf.count_non_terminal("order", 2) == 0
    assert wf.count_non_terminal("shipment", 1) == 0
    with pytest.raises(wf.WorkflowValidationError):
        wf.count_non_terminal("order", "1")  # type: ignore[arg-type]


def test_the_summary_fields_follow_the_selected_columns():
    """InstanceSummary is built positionally from the page statement's columns."""
    import dataclasses

    renamed = {"current_step_id": "current_step", "scope_key": "scope"}
    columns = [renamed.get(c, c) for c in read_models.INSTANCE_COLUMNS.split(", ")]
    assert [f.name for f in dataclasses.fields(wf.InstanceSummary)] == columns
