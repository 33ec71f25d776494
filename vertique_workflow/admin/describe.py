"""Readable labels and actors of history entries (the findings of issue 11).

Why: every decision is stored as event type ``DECISION`` with its outcome
and details in the payload, so a list of raw rows reads "DECISION,
DECISION, ...". A label names what happened (``SIGNAL_APPLIED paid``,
``DECISION_TAKEN → await_payment``, ``TASK_COMPLETED approve``). And every
entry of a segment carries the actor of the command that caused it, so the
steps the executor ran read as if the starting user ran them: the actor of
an entry the executor wrote is the executor, on behalf of that actor.

The details come from a few payload keys that :func:`with_entry_details`
reads in SQL (never the whole payload, which may be large).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left

# Payload keys a label uses, read as text (bounded) with the row.
DETAIL_KEYS = (
    "signal",
    "chosen",
    "decision",
    "reason",
    "timerKind",
    "status",
    "kind",
    "signals",
    "branchId",
    "forkStepId",
    "step",
)
DETAIL_CHARS = 500

# Entries that record what a caller asked for (the command's own actor is
# who did it); every other entry an executor wrote is a step it ran.
CALLER_EVENTS = frozenset(
    {
        "WORKFLOW_STARTED",
        "SIGNAL_APPLIED",
        "TASK_COMPLETED",
        "TASK_REASSIGNED",
        "WORKFLOW_RETRIED",
        "WORKFLOW_CANCELLED",
        "COMMAND_CANCELLED",
        "TIMER_FIRED",
        "CHILD_ENDED",
        "SERVICE_RESULT",
    }
)


def with_entry_details(queryset: QuerySet) -> QuerySet:
    """History rows with ``_d_<key>`` annotations: the payload keys a label needs, as text."""
    return queryset.annotate(
        **{f"_d_{key}": Left(KT(f"payload_json__{key}"), DETAIL_CHARS) for key in DETAIL_KEYS}
    )


def details_of(entry: Any) -> dict[str, str]:
    """The label keys of an entry: from the annotations, else from a loaded payload."""
    if hasattr(entry, "_d_signal"):
        values = {key: getattr(entry, f"_d_{key}") for key in DETAIL_KEYS}
    else:
        payload = entry.get("payload_json") if isinstance(entry, dict) else entry.payload_json
        payload = payload if isinstance(payload, dict) else {}
        values = {key: payload.get(key) for key in DETAIL_KEYS}
    return {key: str(value) for key, value in values.items() if value not in (None, "")}


def _field(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def entry_label(entry: Any) -> str:
    """What an entry records, in words: the outcome and its detail (signal, target, decision)."""
    event = _field(entry, "event_type") or ""
    outcome = _field(entry, "outcome")
    details = details_of(entry)
    head = outcome if event in ("DECISION", "BRANCH_DECISION") and outcome else event
    if head == "DECISION_TAKEN" and "chosen" in details:
        text = f"DECISION_TAKEN → {details['chosen']}"
    elif "signal" in details and (
        head in ("SIGNAL_APPLIED", "SIGNAL_PARKED") or event.startswith("COMMAND_")
    ):
        text = f"{head} {details['signal']}"
    elif head == "TASK_COMPLETED" and "decision" in details:
        text = f"TASK_COMPLETED {details['decision']}"
    elif head == "TIMER_FIRED" and "timerKind" in details:
        text = f"TIMER_FIRED {details['timerKind']}"
    elif head == "WAITING" and "signals" in details:
        text = f"WAITING for {details['signals']}"
    elif head == "CHILD_ENDED" and "status" in details:
        text = f"CHILD_ENDED {details['status']}"
    elif head == "SERVICE_RESULT" and "status" in details:
        text = f"SERVICE_RESULT {details['status']}"
    elif event.startswith("COMMAND_") and "kind" in details:
        text = f"{head} {details['kind']}"
    else:
        text = head
    if "branchId" in details:
        text += f" [branch {details.get('forkStepId', '?')}/{details['branchId']}]"
    if "reason" in details:
        text += f": {details['reason']}"
    return text


def person(kind: Any, actor_id: Any, on_behalf_of: Any = None, status: Any = None) -> str:
    """``USER ann (ASSERTED)``; ``-`` when no actor was recorded."""
    if not kind:
        return "-"
    text = " ".join(str(p) for p in (kind, actor_id) if p)
    if on_behalf_of:
        text += f" for {on_behalf_of}"
    if status:
        text += f" ({status})"
    return text


def entry_actor(entry: Any) -> tuple[str, str]:
    """(who did it, on whose behalf) of a history entry.

    A step the executor ran reads ``executor <node>`` with the command's
    actor as the one it acted for; an entry that records a caller's request
    (a start, a signal applied, a task completed, a cancel) reads as that
    caller.
    """
    actor = person(
        _field(entry, "actor_kind"),
        _field(entry, "actor_id"),
        _field(entry, "on_behalf_of"),
        _field(entry, "attribution_status"),
    )
    executor = _field(entry, "executor_id")
    if executor and _field(entry, "event_type") not in CALLER_EVENTS:
        return f"executor {executor}", actor
    return actor, ""


def actor_text(entry: Any) -> str:
    """One-line actor of a history entry (see :func:`entry_actor`)."""
    who, behalf = entry_actor(entry)
    return f"{who} (for {behalf})" if behalf and behalf != "-" else who
