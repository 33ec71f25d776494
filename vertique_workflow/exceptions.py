"""The exception hierarchy of vertique_workflow.

Every error carries a ``reason_code`` so callers (views, the executor, the
``last_error`` columns) can classify a failure without parsing its message.
Messages name identifiers (definition ids, step ids, signal names, field
names) but never payload or state values: they may reach end users and logs
that must not hold business data.
"""

from __future__ import annotations

import re
from typing import ClassVar

__all__ = [
    "ContractMismatch",
    "NonRetryable",
    "WorkflowConflict",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowNotFound",
    "WorkflowPersistenceError",
    "WorkflowValidationError",
]


class WorkflowError(Exception):
    """Base of every error this package raises on purpose."""

    reason_code: ClassVar[str] = "ERROR"


class WorkflowNotFound(WorkflowError):
    """The instance, task or definition asked for does not exist (HTTP 404)."""

    reason_code: ClassVar[str] = "NOT_FOUND"


class WorkflowConflict(WorkflowError):
    """Key reuse, an optimistic conflict or an invalid transition (HTTP 409)."""

    reason_code: ClassVar[str] = "CONFLICT"


class WorkflowValidationError(WorkflowError):
    """Bad input: an undeclared signal, a payload failing its schema, bad arguments (HTTP 400)."""

    reason_code: ClassVar[str] = "VALIDATION"


class WorkflowDefinitionError(WorkflowError):
    """A workflow definition is malformed, unknown, or disagrees with the registry.

    ``definition_id`` and ``step_id`` repeat what the message names, so tools
    can point at the offending place without parsing text.
    """

    reason_code: ClassVar[str] = "DEFINITION"

    def __init__(
        self,
        message: str = "",
        *,
        definition_id: str | None = None,
        step_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.definition_id = definition_id
        self.step_id = step_id


class ContractMismatch(WorkflowDefinitionError):
    """A scope's definition would follow or reinstate a version of another contract.

    Raised across scopes: a scope's activation naming a default-scope version
    of another contract, a scope's first row of an id the default scope holds
    under another contract, a reinstatement that would mix contracts. Within
    one scope, versions of different contracts or state types are refused
    with plain ``WorkflowDefinitionError`` naming the rule.
    """

    reason_code: ClassVar[str] = "CONTRACT_MISMATCH"


class WorkflowPersistenceError(WorkflowError):
    """The database refused or lost a statement (HTTP 500).

    ``retryable`` says whether running the whole transaction again may succeed
    (serialization failure, deadlock, lock timeout, lost connection).
    """

    reason_code: ClassVar[str] = "PERSISTENCE"

    def __init__(self, message: str = "", *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


REASON_CODE_PATTERN = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def require_reason_code(value: object) -> str:
    """``value`` when it is a reason code (``OUT_OF_STOCK``); ``ValueError`` otherwise.

    Reason codes are identifiers, not sentences: they are stored in
    ``last_error`` and ``error_type`` columns that operators and end users
    see, so they must never carry business data.
    """
    if not isinstance(value, str) or REASON_CODE_PATTERN.fullmatch(value) is None:
        raise ValueError(
            "a reason code is an identifier of 1 to 64 characters: an upper-case letter, "
            "then upper-case letters, digits or underscores (e.g. 'OUT_OF_STOCK')"
        )
    return value


class NonRetryable(WorkflowError):
    """Raised by workflow code to fail the instance at once, without retries.

    Use it for errors that running the step again cannot fix (a business rule
    violated, a referenced record gone); any other exception is retried.

    ``NonRetryable("OUT_OF_STOCK")``: the reason code is stored as the
    instance's ``error_type`` and leads its ``error_message`` and the
    command's ``last_error``, followed by a fixed product sentence naming the
    step and the attempt. ``detail`` (free text) goes to the executor log
    only, never to a column: it may hold anything. An invalid code raises
    ``ValueError`` at once, so the mistake shows where it was made.
    """

    reason_code: ClassVar[str] = "NON_RETRYABLE"

    def __init__(self, reason_code: str = "NON_RETRYABLE", detail: str | None = None) -> None:
        super().__init__(require_reason_code(reason_code))
        self.reason_code = reason_code  # type: ignore[misc]
        self.detail = detail

    def __str__(self) -> str:
        return self.reason_code if self.detail is None else f"{self.reason_code}: {self.detail}"
