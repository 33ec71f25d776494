"""The JSON rules for every value the app stores as JSON: payloads, subjects, states.

Why one place: Python's ``json`` module and PostgreSQL's ``jsonb`` disagree.
``json.dumps`` writes what ``jsonb`` refuses (a NUL character as ``\\u0000``,
a lone surrogate) and refuses what Python code produces (sets, datetimes,
NaN). Found by the database, such a value is a ``WorkflowPersistenceError``
(HTTP 500) on the record side, or a command that spends all its attempts in
the executor. One walk here finds it first and names the JSON path
(``$.items[3].name``), never the value: messages reach callers and logs that
must not hold business data.

The module is pure (no settings, no database), so the engine may use it; the
record side passes ``MAX_PAYLOAD_BYTES`` in, the segment hands the engine the
same limit for states through ``RunFacts``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from .exceptions import WorkflowValidationError

__all__ = ["MAX_DEPTH", "check", "json_copy", "json_size"]

# Deeper values are refused rather than walked: a hostile payload must not
# reach Python's recursion limit (an uncontrolled RecursionError) here or in
# json.dumps. Real payloads and states stay far below this.
MAX_DEPTH = 100

# Python's int-to-text conversion refuses ints of more than 4300 digits
# (sys.set_int_max_str_digits); below this bit length no int can reach it.
_SAFE_INT_BITS = 14_000
_KEY_IN_PATH_MAX = 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _key_path(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` for keys that are not identifiers; long keys cut."""
    shown = key[:_KEY_IN_PATH_MAX]
    if _IDENTIFIER.fullmatch(shown):
        return f"{path}.{shown}"
    return f"{path}[{json.dumps(shown)}]"


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character (\\u0000), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate, which is not valid Unicode"
    return None


def _storable(text: str) -> bool:
    """No NUL, valid Unicode: the cheap test of every string (ASCII is the usual case)."""
    return "\x00" not in text and (text.isascii() or _string_problem(text) is None)


class _Refused(Exception):
    """A refusal on its way up the walk; each level adds its key or index to ``where``.

    The path is only built when something is refused, so the walk of a valid
    value (every step of every segment, for states) builds no strings.
    """

    def __init__(self, template: str) -> None:
        super().__init__(template)
        self.template = template
        self.where: list[str | int] = []

    def path(self, root: str) -> str:
        path = root
        for part in reversed(self.where):
            path = f"{path}[{part}]" if isinstance(part, int) else _key_path(path, part)
        return path


def _walk(value: Any, depth: int, objects: bool) -> Any:
    # the common types first, in the order a state holds them most
    if isinstance(value, str):
        if not _storable(value):
            raise _Refused(f"{{path}} holds {_string_problem(value)}")
        return value
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        depth += 1
        if depth > MAX_DEPTH:
            raise _Refused(f"{{path}} is nested deeper than {MAX_DEPTH} levels")
        result: list[Any] = []
        for index, item in enumerate(value):
            try:
                result.append(_walk(item, depth, objects))
            except _Refused as refused:
                refused.where.append(index)
                raise
        return result
    elif value is None or isinstance(value, bool):
        return value
    elif isinstance(value, int):
        if value.bit_length() > _SAFE_INT_BITS:
            raise _Refused("{path} holds an integer too large for JSON")
        return value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused("{path} holds a non-finite float, which JSON cannot store")
        return value
    elif objects and dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    else:
        raise _Refused(f"{{path}} holds a {type(value).__name__}, which is not JSON")
    depth += 1
    if depth > MAX_DEPTH:
        raise _Refused(f"{{path}} is nested deeper than {MAX_DEPTH} levels")
    copied = {}
    for key, item in items:
        if not isinstance(key, str):
            raise _Refused(f"{{path}} has a {type(key).__name__} key; JSON keys are strings")
        if not _storable(key):
            raise _Refused(f"a key of {{path}} holds {_string_problem(key)}")
        try:
            copied[key] = _walk(item, depth, objects)
        except _Refused as refused:
            refused.where.append(key)
            raise
    return copied


def json_copy(
    value: Any,
    root: str = "$",
    *,
    error: type[Exception] = WorkflowValidationError,
    objects: bool = False,
) -> Any:
    """A deep copy of ``value`` holding only JSON PostgreSQL can store.

    Raises ``error`` naming the path from ``root`` (never the value) for a
    NUL character or lone surrogate in a string or key, a non-string key, a
    non-finite float, an integer JSON text cannot hold, nesting deeper than
    ``MAX_DEPTH``, or any other type. Tuples become lists; with ``objects``
    dataclass instances become objects of their fields (states may hold them,
    payloads may not: a caller's payload is JSON already).
    """
    try:
        return _walk(value, 0, objects)
    except _Refused as refused:
        raise error(refused.template.replace("{path}", refused.path(root))) from None


def json_size(value: Any) -> int:
    """Bytes of the compact UTF-8 JSON text of a value ``json_copy`` accepted."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def check(value: Any, what: str, *, max_bytes: int | None) -> None:
    """Refuse a payload PostgreSQL could not store, or one larger than ``max_bytes``.

    ``WorkflowValidationError`` names ``what`` and the JSON path, or the limit
    and the size; never the value. ``None`` is a valid payload; ``max_bytes``
    ``None`` checks no size.
    """
    try:
        json_copy(value)
    except WorkflowValidationError as exc:
        raise WorkflowValidationError(f"{what} is refused: {exc}") from None
    if max_bytes is None:
        return
    size = json_size(value)
    if size > max_bytes:
        raise WorkflowValidationError(
            f"{what} is {size} bytes of JSON, over the limit of {max_bytes} bytes "
            "(MAX_PAYLOAD_BYTES)"
        )


def schema_failure(validator: Any, payload: Any) -> str | None:
    """Where and how ``payload`` fails a JSON Schema ``validator``, never quoting the value.

    ``"at $.lines[1]: 'maxLength' rule failed"`` or ``"at $: missing required
    'reason'"``; None when the payload is valid. The one wording of a schema
    refusal (start and signal payloads, task decisions): jsonschema's own
    message quotes the value, so it is never shown.
    """
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(payload))
    if error is None:
        return None
    rule = f"{error.validator!r} rule failed"
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = sorted(str(n)[:64] for n in error.validator_value if n not in error.instance)
        shown = ", ".join(repr(n) for n in missing[:5])
        more = len(missing) - 5
        rule = f"missing required {shown}" + (f" and {more} more" if more > 0 else "")
    return f"at {error.json_path}: {rule}"


def check_schema(schema: dict[str, Any], payload: Any, what: str) -> None:
    """Refuse ``payload`` failing the JSON Schema ``schema`` (``WorkflowValidationError``).

    The record side's check of a payload against a schema read from the
    registry or a task row; the message is :func:`schema_failure`'s.
    """
    from jsonschema import Draft202012Validator

    failure = schema_failure(Draft202012Validator(schema), payload)
    if failure is not None:
        raise WorkflowValidationError(f"{what} does not match its schema {failure}")
