"""The shape check: the shipped JSON Schema of the format, with errors at a path and line.

``vertique_workflow/schemas/workflow-document.schema.json`` is the one
description of what a document may contain: editors validate against it
while a document is written, and ``compile_document`` checks every document
against it before any name is resolved. Its errors are turned into short
messages that point at the offending key (an unknown key's own line) and
never quote more than a short piece of the document.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from .errors import DocumentError, Path, format_path
from .parsing import Parsed

__all__ = ["SCHEMA_FILE", "check_shape", "document_schema"]

SCHEMA_FILE = "workflow-document.schema.json"

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


@functools.cache
def document_schema() -> dict[str, Any]:
    """The JSON Schema of the document format, as shipped in the package (a shared copy)."""
    text = resources.files("vertique_workflow.schemas").joinpath(SCHEMA_FILE).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(document_schema())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _types(value: Any) -> str:
    names = value if isinstance(value, list) else [value]
    return " or ".join(_TYPE_WORDS.get(name, str(name)) for name in names)


def _describe(error: ValidationError) -> tuple[Path, str]:
    """``(path, detail)`` of one schema error, the path pointing at what to fix."""
    path: Path = tuple(error.absolute_path)
    kind, expected, instance = error.validator, error.validator_value, error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}
    if kind == "additionalProperties" and isinstance(instance, dict):
        known = schema.get("properties", {})
        extra = sorted(key for key in instance if key not in known)
        allowed = ", ".join(sorted(key for key in known if key != "kind")) or "none"
        return (*path, extra[0]), f"unknown key {extra[0][:64]!r} (allowed here: {allowed})"
    if kind == "required" and isinstance(instance, dict):
        missing = [key for key in expected if key not in instance]
        return path, f"missing key {missing[0]!r}"
    if kind == "type":
        return path, f"must be {_types(expected)}, not {_types(_json_type(instance))}"
    if kind == "enum":
        if path and path[-1] == "kind":
            return path, f"unknown step kind {_short(instance)} (known: {', '.join(expected)})"
        return path, f"must be one of {', '.join(repr(v) for v in expected)}"
    if kind == "pattern":
        return path, (
            f"invalid duration {_short(instance)}: use whole numbers with units w, d, h, m, s "
            "from largest to smallest, e.g. '30s', '15m', '1h30m', '3d'"
        )
    if kind == "anyOf":
        nested = [sub for sub in error.context or () if tuple(sub.absolute_path) == path]
        if nested and all(sub.validator == "type" for sub in nested):
            words = [_types(sub.validator_value) for sub in nested]
            return path, f"must be {' or '.join(words)}, not {_types(_json_type(instance))}"
        inner = best_match(error.context or ())
        if inner is not None:
            return _describe(inner)
    if kind == "not" and isinstance(instance, dict):
        return path, "give backoff or backoff_ms, max_backoff or max_backoff_ms, not both"
    words = {
        "minimum": "must be at least",
        "maximum": "must be at most",
        "minLength": "must have at least this many characters:",
        "maxLength": "must have at most this many characters:",
        "minItems": "needs at least this many items:",
        "minProperties": "needs at least this many entries:",
    }
    if kind in words:
        return path, f"{words[kind]} {expected}"
    return path, error.message[:200]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def check_shape(parsed: Parsed, source: str | None) -> None:
    """Refuse a document the schema refuses: the first error by line, at its path."""
    found = []
    for error in _validator().iter_errors(parsed.data):
        path, detail = _describe(error)
        line = parsed.line_of(path)
        found.append((line or 0, -len(path), format_path(path), detail, line))
    if found:
        _, _, path_text, detail, line = min(found)
        raise DocumentError(detail, path=path_text or None, line=line, source=source)
