"""``workflow_event``: the Django signal in-process listeners receive after a segment commits."""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["workflow_event"]

workflow_event = Signal()
"""Sent once per workflow event after the transaction that recorded it committed.

Receivers get ``sender`` (the string ``"vertique_workflow"``) and ``event``
(a ``vertique_workflow.side_effects.WorkflowEventView``). A receiver that
raises is logged and does not disturb the others or the workflow.
"""
