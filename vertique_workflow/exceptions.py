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
    "DefinitionNotFound",
    "DefinitionUnavailable",
    "DocumentDrift",
    "DocumentTooLarge",
    "NonRetryable",
    "RegistryRefusal",
    "WorkflowConflict",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowNotFound",
    "WorkflowPersistenceError",
    "WorkflowValidationError",
    "user_message",
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


class DocumentDrift(WorkflowDefinitionError):
    """A stored DOCUMENT row's text no longer matches what was recorded with it.

    Either its SHA-256 differs from the row's ``document_digest`` (the text
    was altered in the table: it is never returned), or a packaged document
    with the row's plan hash has another text. The message names the key,
    never the text.
    """

    reason_code: ClassVar[str] = "DOCUMENT_DRIFT"


class DocumentTooLarge(WorkflowDefinitionError):
    """A stored document is outside the size envelope of ``DOCUMENT_INPUT_LIMIT``.

    Its body was not transferred: ``byte_length`` and ``char_length`` are the
    row's counts, ``limit`` the configured input limit L (the envelope is
    ``floor(3L/2)`` UTF-8 bytes and L code points). The row exists: this is
    never "not found".
    """

    reason_code: ClassVar[str] = "DOCUMENT_TOO_LARGE"

    def __init__(
        self,
        message: str = "",
        *,
        definition_id: str | None = None,
        byte_length: int = 0,
        char_length: int = 0,
        limit: int = 0,
    ) -> None:
        super().__init__(message, definition_id=definition_id)
        self.byte_length = byte_length
        self.char_length = char_length
        self.limit = limit


class WorkflowPersistenceError(WorkflowError):
    """The database refused or lost a statement (HTTP 500).

    ``retryable`` says whether running the whole transaction again may succeed
    (serialization failure, deadlock, lock timeout, lost connection).
    """

    reason_code: ClassVar[str] = "PERSISTENCE"

    def __init__(
        self, message: str = "", *, retryable: bool = False, definition_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        # the exact definition id of registry work (a lock timeout), for tools
        self.definition_id = definition_id


class RegistryRefusal(WorkflowError):
    """A refusal by the definition registry (base of the two classes below).

    Its message is for operators and logs only: it can name other scopes,
    versions and plan hashes. Show end users :func:`user_message` (the fixed
    ``USER_MESSAGE``) instead. ``definition_id`` names the id it is about.
    """

    USER_MESSAGE: ClassVar[str] = "This workflow is not available right now."

    def __init__(self, message: str = "", *, definition_id: str | None = None) -> None:
        super().__init__(message)
        self.definition_id = definition_id


class DefinitionUnavailable(RegistryRefusal, WorkflowConflict):
    """The registry refused a version: not AVAILABLE, a pin that drifted, an invalid
    registry transition (a :class:`WorkflowConflict`, HTTP 409)."""


class DefinitionNotFound(RegistryRefusal, WorkflowNotFound):
    """The registry has no such version, or the version an activation names is gone
    (a :class:`WorkflowNotFound`, HTTP 404)."""


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


GENERIC_USER_MESSAGE = "The request could not be completed; please try again later."


def user_message(exc: BaseException) -> str:
    """The text of ``exc`` that may be shown to an end user.

    Not-found, conflict and validation messages are written for users and are
    returned as they are; a :class:`RegistryRefusal` (its message can name
    other scopes and plan hashes) gives its fixed ``USER_MESSAGE``; anything
    else (definition and persistence errors, database errors, bugs) gives a
    fixed generic sentence: log the exception itself.
    """
    if isinstance(exc, RegistryRefusal):
        return exc.USER_MESSAGE
    if isinstance(exc, WorkflowNotFound | WorkflowConflict | WorkflowValidationError):
        return str(exc)
    return GENERIC_USER_MESSAGE
