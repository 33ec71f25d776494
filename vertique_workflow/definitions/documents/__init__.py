"""Workflow definitions as YAML or JSON documents, compiled to the plan the code DSL builds.

``compile_document(text, format="yaml")`` parses a document safely (no
object-building YAML, no aliases, bounded size and depth), checks its shape
against the shipped JSON Schema, resolves the callables and types it names
through the document catalog (``register_callable``, ``register_type``,
Workflow methods by ``module.Class.method``) and builds a validated
``Plan``. A document and the equivalent code definition have the same plan
hash and name binding. Every refusal is a ``DocumentError`` naming the path
and line. See docs/documents.md.

Pure Python: storing, publishing and loading documents from folders is the
registry's business.
"""

from __future__ import annotations

from ...exceptions import WorkflowDefinitionError
from ..plan import Plan
from .compiler import compile_parsed
from .errors import DocumentError, format_path
from .parsing import MAX_DEPTH, Parsed, parse
from .references import (
    DocumentCatalog,
    document_catalog,
    register_callable,
    register_type,
    workflow_method,
)
from .shape import SCHEMA_FILE, check_shape, document_schema

__all__ = [
    "DOCUMENT_FORMATS",
    "MAX_DEPTH",
    "SCHEMA_FILE",
    "DocumentCatalog",
    "DocumentError",
    "compile_document",
    "document_catalog",
    "document_format_of",
    "document_schema",
    "format_path",
    "input_limit",
    "register_callable",
    "register_type",
    "workflow_method",
]

#: Accepted ``format`` spellings, by the canonical format they mean.
DOCUMENT_FORMATS: dict[str, str] = {"yaml": "yaml", "yml": "yaml", "json": "json"}

_FALLBACK_LIMIT = 262144


def input_limit() -> int:
    """The configured ``DOCUMENT_INPUT_LIMIT`` (raw UTF-8 bytes of one document).

    Outside a configured Django project the documented default applies, so
    the compiler stays usable from plain scripts and tools.
    """
    from django.core.exceptions import ImproperlyConfigured

    try:
        from ...conf import workflow_settings

        value = workflow_settings.DOCUMENT_INPUT_LIMIT
    except ImproperlyConfigured:
        return _FALLBACK_LIMIT
    return int(value)


def document_format_of(filename: str) -> str:
    """``"yaml"`` or ``"json"`` by the file's extension (``.yaml``, ``.yml``, ``.json``).

    Any other extension is a ``DocumentError`` naming the file: a loader of a
    folder decides from this which files are documents.
    """
    name = str(filename)
    _, dot, extension = name.rpartition(".")
    found = DOCUMENT_FORMATS.get(extension.lower()) if dot else None
    if found is None:
        raise DocumentError(
            "not a workflow document: the file name must end in .yaml, .yml or .json",
            source=name,
        )
    return found


def _text_of(text: str | bytes, limit: int, source: str | None) -> str:
    """The document's text, refused before any parsing when over ``limit`` UTF-8 bytes."""
    if isinstance(text, bytes | bytearray):
        raw = bytes(text)
    elif isinstance(text, str):
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise DocumentError(
                "the document is not valid Unicode text (unpaired surrogates)", source=source
            ) from None
    else:
        raise DocumentError(f"a document is text (str), not {type(text).__name__}", source=source)
    if len(raw) > limit:
        raise DocumentError(
            f"the document is {len(raw)} bytes of UTF-8, over the input limit of {limit} bytes "
            "(setting DOCUMENT_INPUT_LIMIT)",
            source=source,
        )
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"the document is not UTF-8 (invalid byte at offset {exc.start})", source=source
        ) from None
    return decoded.removeprefix("\ufeff")


def compile_document(
    text: str,
    *,
    format: str = "yaml",
    source: str | None = None,
    limit: int | None = None,
) -> Plan:
    """Compile a YAML or JSON workflow document to a validated ``Plan``.

    ``format`` is ``"yaml"`` (or ``"yml"``) or ``"json"``; ``source`` names
    where the text came from (a file path) in error messages only -- it is
    attribution, never fetched. ``limit`` bounds the raw input in UTF-8
    bytes (default: setting ``DOCUMENT_INPUT_LIMIT``), checked before
    parsing. Raises ``DocumentError`` (a ``WorkflowDefinitionError``) with
    ``path``, ``line`` and ``source`` for anything refused; nothing else
    escapes for any input text.
    """
    canonical = DOCUMENT_FORMATS.get(str(format).lower())
    if canonical is None:
        raise DocumentError(
            f"unknown document format {str(format)[:32]!r} (use 'yaml', 'yml' or 'json')",
            source=source,
        )
    bound = input_limit() if limit is None else limit
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise DocumentError("limit must be a positive number of bytes", source=source)
    body = _text_of(text, bound, source)
    try:
        parsed = _parse(body, canonical, source)
        check_shape(parsed, source)
        return compile_parsed(parsed, source, document_catalog)
    except DocumentError:
        raise
    except WorkflowDefinitionError as exc:
        raise DocumentError(str(exc), source=source) from exc
    except (RecursionError, MemoryError, ValueError, TypeError, KeyError, AttributeError) as exc:
        # A rule the schema and the compiler should both have caught: refuse the
        # document (never a stray exception for hostile input), keeping the cause.
        raise DocumentError(
            f"the document could not be compiled ({type(exc).__name__})", source=source
        ) from exc


def _parse(body: str, format: str, source: str | None) -> Parsed:
    try:
        return parse(body, format)
    except DocumentError as exc:
        raise DocumentError(exc.detail, path=exc.path, line=exc.line, source=source) from None
