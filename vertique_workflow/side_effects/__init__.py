"""Side effects: the durable hand-off of a transition's intents to the outside world.

A step that must reach outside the database (a ``service`` step's call, a
workflow event) never does it inside the segment: it asks for a
``RecordSideEffect`` or ``EmitEvent`` effect, and the segment runs the
*recorder* installed for that effect's kind in the segment's own
transaction. The transition and its records commit or roll back together;
delivering them (the relay, a task backend, an event consumer) happens
after the commit, at least once. Recorders are responsible for durable
hand-off only (the reference's ``WorkflowSideEffectRecorder``).

Recorders are listed in ``VERTIQUE_WORKFLOW["RECORDERS"]`` (dotted paths of
classes, instantiated once per process); each names the ``kind`` it records.
A required effect with no recorder of its kind fails the transition with
``SIDE_EFFECT_RECORDER_MISSING``; events are optional: recorded by the
``event`` recorder when installed (``events.EventsRecorder``) and sent as
``workflow_event`` after the commit when it has receivers.
"""

from __future__ import annotations

from .handlers import (
    ServiceCall,
    register_service_handler,
    service_handler,
    unregister_service_handler,
)
from .recorders import (
    RecordBatch,
    SideEffectRecorder,
    installed_recorders,
    record,
    recorder_for,
    reset_recorders,
)
from .signals import workflow_event

__all__ = [
    "RecordBatch",
    "ServiceCall",
    "SideEffectRecorder",
    "installed_recorders",
    "record",
    "recorder_for",
    "register_service_handler",
    "reset_recorders",
    "service_handler",
    "unregister_service_handler",
    "workflow_event",
]
