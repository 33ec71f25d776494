"""Workflow events: the ``event`` recorder, its consumers, and the ``workflow_event`` signal.

The engine derives a transition's events (``engine/emitted.py``) only when
someone listens: ``EventsRecorder`` is in ``VERTIQUE_WORKFLOW["RECORDERS"]``
or ``workflow_event`` has receivers. The recorder inserts them into
``workflow_events`` in the segment's transaction (one statement), so they
exist exactly when the transition committed; consumers read them with
``events(consumer)`` and move their position with ``ack_events``. The
signal is sent once per event after the commit, for in-process listeners.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ..engine.effects import EmitEvent
from ..engine.emitted import (
    EVENT_TYPES,
    SERVICE_DISPATCHED,
    SIGNAL_APPLIED,
    STEP_ENTERED,
    TASK_COMPLETED,
    TASK_OPENED,
    WORKFLOW_CANCELLED,
    WORKFLOW_COMPLETED,
    WORKFLOW_FAILED,
    WORKFLOW_STARTED,
    WORKFLOW_WAITING,
)
from .signals import workflow_event

__all__ = [
    "EVENT_TYPES",
    "SERVICE_DISPATCHED",
    "SIGNAL_APPLIED",
    "STEP_ENTERED",
    "TASK_COMPLETED",
    "TASK_OPENED",
    "WORKFLOW_CANCELLED",
    "WORKFLOW_COMPLETED",
    "WORKFLOW_FAILED",
    "WORKFLOW_STARTED",
    "WORKFLOW_WAITING",
    "EventsRecorder",
    "WorkflowEventView",
    "ack_events",
    "events",
    "listening",
]

logger = logging.getLogger("vertique_workflow.events")

SENDER = "vertique_workflow"


@dataclass(frozen=True)
class WorkflowEventView:
    """One workflow event as a consumer or a signal receiver sees it.

    ``id`` and ``txid`` are its position in ``workflow_events`` (None when
    no events recorder is installed and only the signal carries it);
    ``cursor`` is what ``ack_events`` takes.
    """

    id: int | None
    txid: int | None
    workflow_id: Any
    event_type: str
    step_id: str | None
    fork_step_id: str | None
    branch_id: str | None
    command_id: int | None
    definition_id: str
    definition_version: int
    data: dict[str, Any] = field(default_factory=dict)
    recorded_at: datetime.datetime | None = None

    @property
    def cursor(self) -> tuple[int, int]:
        """The ``(txid, id)`` an acknowledgement of this event moves a consumer to."""
        if self.txid is None or self.id is None:
            raise ValueError("this event was not recorded in workflow_events")
        return (self.txid, self.id)


def listening() -> bool:
    """Whether anyone wants events: an ``event`` recorder, or a ``workflow_event`` receiver.

    The segment asks once per drive; when False the engine derives none.
    """
    from . import recorders

    built = recorders._recorders  # the hot path: no lock once the recorders are built
    if built is None:
        built = recorders.installed_recorders()
    return recorders.EVENT_KIND in built or workflow_event.has_listeners()


def _row(
    effect: EmitEvent,
    workflow_id: Any,
    command_id: int | None,
    definition_id: str,
    definition_version: int,
) -> dict[str, Any]:
    return {
        "workflow_id": str(workflow_id),
        "event_type": effect.event_type,
        "step_id": effect.step_id,
        "fork_step_id": effect.fork_step_id,
        "branch_id": effect.branch_id,
        "command_id": command_id,
        "definition_id": definition_id,
        "definition_version": definition_version,
        "data": effect.data,
    }


def views_of(
    effects: Sequence[EmitEvent],
    workflow_id: Any,
    command_id: int | None,
    definition_id: str,
    definition_version: int,
    positions: Sequence[tuple[int, int, Any]] | None = None,
) -> list[WorkflowEventView]:
    """The views of a transition's events (with their stored positions when recorded)."""
    out = []
    for n, effect in enumerate(effects):
        event_id, txid, at = positions[n] if positions else (None, None, None)
        out.append(
            WorkflowEventView(
                event_id,
                txid,
                workflow_id,
                effect.event_type,
                effect.step_id,
                effect.fork_step_id,
                effect.branch_id,
                command_id,
                definition_id,
                definition_version,
                dict(effect.data),
                at,
            )
        )
    return out


class EventsRecorder:
    """The ``event`` recorder: a transition's events into ``workflow_events``, one insert.

    Opt in with ``"vertique_workflow.side_effects.events.EventsRecorder"`` in
    ``VERTIQUE_WORKFLOW["RECORDERS"]``. Returns the recorded views (with
    their ids and txid), which the seam hands to the signal after commit.
    """

    kind = "event"

    def record(self, batch: Any) -> list[WorkflowEventView]:
        from ..store import events as store

        rows = [
            _row(
                e,
                batch.workflow_id,
                batch.command_id,
                batch.definition_id,
                batch.definition_version,
            )
            for e in batch.effects
        ]
        positions = store.insert(rows)
        return views_of(
            batch.effects,
            batch.workflow_id,
            batch.command_id,
            batch.definition_id,
            batch.definition_version,
            positions,
        )


def send_after_commit(views: Sequence[WorkflowEventView]) -> None:
    """Send ``workflow_event`` once per event when the current transaction commits.

    Nothing is sent when it rolls back. A receiver that raises is logged and
    the others still receive the event (``send_robust``).
    """
    if not views or not workflow_event.has_listeners():
        return
    from ..store import db

    def send() -> None:
        for view in views:
            for receiver, response in workflow_event.send_robust(SENDER, event=view):
                if isinstance(response, Exception):
                    logger.error(
                        "workflow_event receiver %r raised %s for %s of %s",
                        receiver,
                        type(response).__name__,
                        view.event_type,
                        view.workflow_id,
                    )

    transaction.on_commit(send, using=db.alias())


def emit(
    effects: Sequence[EmitEvent],
    workflow_id: Any,
    command_id: int | None,
    definition_id: str,
    definition_version: int,
) -> None:
    """Record ``effects`` (when the recorder is installed) and signal them after commit.

    For events that happen outside a segment (``wf.cancel``), in the
    caller's transaction.
    """
    from .recorders import EVENT_KIND, RecordBatch, recorder_for

    recorder = recorder_for(EVENT_KIND)
    views: Any = None
    if recorder is not None:
        views = recorder.record(
            RecordBatch(
                EVENT_KIND,
                workflow_id,
                command_id,
                definition_id,
                definition_version,
                tuple(effects),
            )
        )
    if not isinstance(views, list):
        views = views_of(effects, workflow_id, command_id, definition_id, definition_version)
    send_after_commit(views)


def _view_of_row(row: dict[str, Any]) -> WorkflowEventView:
    return WorkflowEventView(
        row["id"],
        row["txid"],
        row["workflow_id"],
        row["event_type"],
        row["step_id"],
        row["fork_step_id"],
        row["branch_id"],
        row["command_id"],
        row["definition_id"],
        row["definition_version"],
        row["data_json"] or {},
        row["recorded_at"],
    )


def events(consumer: str, limit: int = 100) -> list[WorkflowEventView]:
    """Up to ``limit`` committed events after ``consumer``'s acknowledged position.

    In ``(txid, id)`` order, and only events of transactions older than every
    transaction still running: an event whose transaction commits late is
    delivered after it commits, never skipped. Reading moves nothing; the
    same events come back until ``ack_events`` acknowledges them.
    """
    from ..store import events as store

    if not consumer:
        raise ValueError("consumer must be a non-empty string")
    if limit < 1:
        raise ValueError("limit must be at least 1")
    return [_view_of_row(r) for r in store.read(consumer, limit)]


def ack_events(consumer: str, event: WorkflowEventView | tuple[int, int]) -> bool:
    """Acknowledge every event of ``consumer`` up to and including ``event`` (or a cursor).

    The position never moves backwards: acknowledging an older event than
    the acknowledged one changes nothing and returns False.
    """
    from ..store import events as store

    if not consumer:
        raise ValueError("consumer must be a non-empty string")
    txid, event_id = event.cursor if isinstance(event, WorkflowEventView) else event
    return store.ack(consumer, int(txid), int(event_id))
