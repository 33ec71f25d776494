"""The service outbox recorder: a transition's dispatches become rows, in its transaction.

Installed by default (``RECORDERS``). The rows are claimed by the relay
(``side_effects/relay.py``), which runs inside ``workflow_executor`` and as
``manage.py workflow_relay``. A rolled-back segment leaves no row: the
insert is part of the segment's transaction.
"""

from __future__ import annotations

from .recorders import RecordBatch

__all__ = ["ServiceOutboxRecorder", "wake_relays"]

_wake_callbacks: list = []


def wake_relays() -> None:
    """Tell this process's relays that dispatches were committed (no wait for their poll)."""
    for callback in list(_wake_callbacks):
        callback()


class ServiceOutboxRecorder:
    """Records ``service`` dispatches in ``workflow_service_outbox`` (one insert per batch)."""

    kind = "service"

    def record(self, batch: RecordBatch) -> None:
        from django.db import transaction

        from ..store import db, outbox

        rows = [{**row, "command_id": batch.command_id} for row in batch.dispatches()]
        outbox.insert_calls(rows)
        if _wake_callbacks:
            transaction.on_commit(wake_relays, using=db.alias())
