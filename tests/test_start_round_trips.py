"""How many times ``start()`` waits on the server (counted on the wire, ``tests/wire.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

import vertique_workflow as wf
from vertique_workflow.store import pipelined_start

from .wire import client_waits

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_first_start_of_an_id_outside_a_transaction_waits_on_the_server_twice():
    """The key + selection read; then admission lock, pin rows and record at once.

    The reference's admission is two statements (the shared lock, then the
    rows under it), sent with the record in one pipeline, one transaction
    committed at its Sync (``store.pipelined_start``); the key and the
    selection read share one statement.
    """
    wf.start("order", {"amount": 0}, idempotency_key="warm")  # prepares the statements
    pipelined_start.forget_all()  # as in a process that has not started "order" yet
    waits, ref = traced_start("traced", 1)
    assert waits == ["Sync", "Sync"], waits
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_a_later_start_of_the_id_waits_once():
    """The selection remembered: the admission lock and the guarded record, one pipeline."""
    wf.start("order", {"amount": 0}, idempotency_key="warm")
    waits, ref = traced_start("traced", 1)
    assert waits == ["Sync"], waits
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_a_replayed_start_writes_nothing_and_reads_its_instance():
    first = wf.start("order", {"amount": 2}, idempotency_key="same")
    wf.start("order", {"amount": 2}, idempotency_key="same")  # prepares the replay's read
    waits = client_waits(lambda: wf.start("order", {"amount": 2}, idempotency_key="same"))
    # the guarded record (nothing written: the key exists), then the key + selection read
    # and the instance read of the replay, each in autocommit
    assert waits == ["Sync", "Sync", "Sync"], waits
    again = wf.start("order", {"amount": 2}, idempotency_key="same")
    assert (again.id, again.created) == (first.id, False)


def test_a_first_start_in_the_callers_transaction_adds_no_begin_or_commit_of_its_own():
    wf.start("order", {"amount": 0}, idempotency_key="warm")
    with transaction.atomic():
        pipelined_start.forget_all()  # as in a process that has not started "order" yet
        wf.start("order", {"amount": 0}, idempotency_key="outer-warm")  # prepares this path
        pipelined_start.forget_all()
        waits = client_waits(lambda: wf.start("order", {"amount": 3}, idempotency_key="inner"))
    # the key + selection read, then the writes in a savepoint (a refusal leaves the
    # caller's transaction usable): admission lock, pin rows, record
    shape = [w if not w.startswith("Query") else w.split('"')[1].split()[0] for w in waits]
    assert shape == ["Sync", "SAVEPOINT", "Sync", "Sync", "Sync", "RELEASE"], waits


def test_a_later_start_in_the_callers_transaction_waits_once():
    """Savepoint, admission lock, guarded record and release: one pipeline, no commit."""
    wf.start("order", {"amount": 0}, idempotency_key="warm")
    with transaction.atomic():
        wf.start("order", {"amount": 0}, idempotency_key="outer-warm")
        waits, ref = traced_start("inner", 3)
        assert waits == ["Sync"], waits
    assert ref.created and wf.get(ref.id).status == "PENDING"


def test_a_signal_outside_a_transaction_is_one_read_and_one_pipeline_in_one_transaction():
    """BEGIN; key + instance + declared names; lock and write in one pipeline; COMMIT.

    One commit for the reads and the writes, every statement prepared (a
    ``Query`` between BEGIN and COMMIT would be an unprepared Django cursor).
    """
    ref = wf.start("order", {"amount": 5}, idempotency_key="for-signals")
    wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="warm")  # prepares the statements
    waits = client_waits(lambda: wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="traced"))
    assert waits == ['Query "BEGIN"', "Sync", "Sync", 'Query "COMMIT"'], waits


def test_a_signal_in_the_callers_transaction_is_one_read_one_pipeline_and_a_release():
    """The pipeline opens the signal's own savepoint; its release is the third wait."""
    ref = wf.start("order", {"amount": 5}, idempotency_key="for-signals")
    with transaction.atomic():
        wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="warm")
        receipts = []
        waits = client_waits(
            lambda: receipts.append(
                wf.signal(ref.id, "paid", {"amount_paid": 5}, dedup_key="traced")
            )
        )
        assert waits == ["Sync", "Sync", "Sync"], waits
    (receipt,) = receipts
    assert receipt.command_id is not None and not receipt.duplicate


def traced_start(key: str, amount: int) -> tuple[list[str], Any]:
    """The waits of one start of "order" with ``key``, and its reference."""
    started = []
    waits = client_waits(
        lambda: started.append(wf.start("order", {"amount": amount}, idempotency_key=key))
    )
    (ref,) = started
    return waits, ref
