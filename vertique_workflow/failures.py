"""The stored text of every failure: ``<REASON_CODE>: <fixed product sentence>``.

``last_error``, ``error_message`` and history reasons are read by operators,
admin pages and sometimes end users, so they hold a reason code and a
sentence this module builds from identifiers only (step ids, command kinds,
attempt counts, setting names) — never exception text, class names, SQL or
payload values. What the code raised goes to the executor log, with the
instance, command and step, and nowhere else.

The dead letter of a command keeps the cause: the step that failed and the
reason code of its last failure are read back from the command's previous
``last_error`` (:func:`parse`), which this module wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAST_ERROR_MAX = 4000

_PARSE = re.compile(r"^(?P<code>[A-Z][A-Z0-9_]{0,63}): (?P<message>.*)$", re.DOTALL)
_STEP = re.compile(r"\bstep '(?P<step>[^']{1,255})'")


def text(reason_code: str, message: str) -> str:
    """``<REASON_CODE>: <message>`` bounded to 4000 characters."""
    return f"{reason_code}: {message}"[:LAST_ERROR_MAX]


def _where(step: str | None, kind: str) -> str:
    return f"step {step!r}" if step else f"the {kind} command"


def step_failed(step: str | None, kind: str, attempt: int, max_attempts: int) -> str:
    """A step raised; the command is retried after a backoff."""
    return text(
        "STEP_FAILED",
        f"{_where(step, kind)} raised an error (attempt {attempt} of {max_attempts})",
    )


def non_retryable(code: str, step: str | None, kind: str, attempt: int) -> str:
    """The command failed at once: no retry can fix it."""
    return text(code, f"{_where(step, kind)} failed and is not retried (attempt {attempt})")


def attempts_exhausted(
    step: str | None, kind: str, attempts: int, max_attempts: int, last_code: str | None
) -> str:
    """The command spent its attempts and is dead-lettered; the cause is kept."""
    cause = f"; last reason {last_code}" if last_code else ""
    return text(
        "ATTEMPTS_EXHAUSTED",
        f"{_where(step, kind)} failed {attempts} of {max_attempts} attempts{cause}",
    )


def transient(message: str) -> str:
    return text("TRANSIENT_FAILURE", message)


@dataclass(frozen=True)
class Parsed:
    code: str | None
    step: str | None


def parse(stored: str | None) -> Parsed:
    """The reason code and step of a text this module built (None parts when absent)."""
    if not stored:
        return Parsed(None, None)
    match = _PARSE.match(stored)
    if match is None:
        return Parsed(None, None)
    step = _STEP.search(match.group("message"))
    return Parsed(match.group("code"), step.group("step") if step else None)


__all__ = [
    "LAST_ERROR_MAX",
    "Parsed",
    "attempts_exhausted",
    "non_retryable",
    "parse",
    "step_failed",
    "text",
    "transient",
]
