"""vertique_workflow: durable Django workflows on PostgreSQL alone.

The public API is flat: ``import vertique_workflow as wf`` then
``wf.start(...)``, ``wf.signal(...)``, ``wf.cancel(...)``, ``wf.get(...)``.
Names are imported lazily so ``import vertique_workflow`` works before Django
is set up (settings modules, ``INSTALLED_APPS``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "start": "operations",
    "signal": "operations",
    "cancel": "operations",
    "get": "operations",
    "history_of": "operations",
    "state_at": "operations",
    "retry": "operations",
    "RetryReceipt": "operations",
    "Failure": "operations",
    "InstanceRef": "operations",
    "InstanceView": "operations",
    "SignalReceipt": "operations",
    "complete_task": "operations",
    "reassign_task": "operations",
    "tasks": "operations",
    "get_task": "operations",
    "can_complete": "operations",
    "TaskView": "operations",
    "TaskPage": "operations",
    "TaskCompletionReceipt": "operations",
    "TaskReassignment": "operations",
    "branches": "operations",
    "children": "operations",
    "BranchView": "operations",
    "instances": "query",
    "history": "query",
    "count_non_terminal": "query",
    "InstanceSummary": "query",
    "InstancePage": "query",
    "HistoryPage": "query",
    "HistoryEntryView": "query",
    "OpenCommandView": "query",
    "Actor": "context",
    "register_durable": "context",
    "WorkflowError": "exceptions",
    "WorkflowNotFound": "exceptions",
    "WorkflowConflict": "exceptions",
    "WorkflowValidationError": "exceptions",
    "WorkflowDefinitionError": "exceptions",
    "ContractMismatch": "exceptions",
    "WorkflowPersistenceError": "exceptions",
    "NonRetryable": "exceptions",
    "RegistryRefusal": "exceptions",
    "DefinitionUnavailable": "exceptions",
    "DefinitionNotFound": "exceptions",
    "DocumentDrift": "exceptions",
    "DocumentTooLarge": "exceptions",
    "user_message": "exceptions",
    "Workflow": "definitions",
    "action": "definitions",
    "decision": "definitions",
    "wait": "definitions",
    "timer": "definitions",
    "task": "definitions",
    "TaskDecision": "definitions",
    "decision_to": "definitions",
    "fork": "definitions",
    "join": "definitions",
    "call": "definitions",
    "service": "definitions",
    "ServiceOutcome": "definitions",
    "service_handler": "side_effects",
    "register_service_handler": "side_effects",
    "workflow_event": "side_effects",
    "events": "side_effects.events",
    "ack_events": "side_effects.events",
    "WorkflowEventView": "side_effects.events",
    "EVENT_TYPES": "side_effects.events",
    "BranchResult": "definitions",
    "ChildResult": "definitions",
    "end": "definitions",
    "fail": "definitions",
    "Retry": "definitions",
    "StepContext": "definitions",
    "probe": None,
    "retention": None,
    "doctor": None,
    "testing": None,
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vertique_workflow' has no attribute {name!r}")
    module = _EXPORTS[name]
    if module is None:
        value = import_module(f".{name}", __name__)
    else:
        value = getattr(import_module(f".{module}", __name__), name)
    # resolved once: later lookups (``wf.start`` in a loop) are plain attribute reads
    globals()[name] = value
    return value
