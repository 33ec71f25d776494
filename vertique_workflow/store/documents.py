"""DOCUMENT rows of the definition registry: source text, publication, failure marks.

A DOCUMENT row stores its definition as TEXT next to the compiled plan's
metadata (hash, contract, state type, name binding, signal schemas), so any
node can rebuild the plan from the row alone. Everything here follows the
reference's "Definition Registry And Source Storage":

* **Writes** (:func:`insert_candidate`, :func:`upsert_document`, the three
  publication steps, :func:`record_failure`) run through the registry's
  ``_mutation`` (READ COMMITTED, ``lock_timeout``, exclusive id advisory lock,
  every row of the id locked in key order; 55P03 becomes a retryable
  ``WorkflowPersistenceError`` carrying the id), so they serialize with code
  syncs, transitions and activations of the same id.
* **Every body write carries its digest**: ``document_digest`` is the
  lowercase hex SHA-256 of the UTF-8 text, written in the same statement.
  ``name_binding`` is written with the plan hash, never alone.
* **Every body read is guarded** (:func:`find_document`): one statement
  returns the row's byte and code-point counts and projects the text only
  when it fits the envelope of the input limit L (``floor(3L/2)`` bytes and
  L code points), so an oversized row never crosses the wire; the digest is
  verified after that, and altered text fails as drift and is never
  returned.
* **Bodies need a UTF8 server**: :func:`require_utf8` asks once per
  database before the first body read or write and caches only success.
  Metadata and CODE-only operations never ask.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connections

from .. import tables
from ..conf import workflow_settings
from ..exceptions import (
    DefinitionUnavailable,
    DocumentDrift,
    DocumentTooLarge,
    WorkflowDefinitionError,
    WorkflowPersistenceError,
    WorkflowValidationError,
)
from . import db
from .definitions import (
    ACTIVATE_DEFAULT_IF_HIGHER,
    DEFAULT_SCOPE,
    INVALID_TRANSITION,
    KNOWN_FAILURES,
    STATUSES,
    DefinitionRecord,
    PlanLike,
    _check_default_contract,
    _check_version_rules,
    _dump,
    _find,
    _key,
    _known_failure,
    _mutation,
)

__all__ = [
    "FORMATS",
    "StoredDocument",
    "claim_publication",
    "complete_publication",
    "digest",
    "envelope",
    "find_document",
    "input_limit",
    "insert_candidate",
    "load_candidate",
    "record_failure",
    "release_publication",
    "require_utf8",
    "upsert_document",
]

T = tables.sql_names()

FORMATS = ("yaml", "json")
DocumentFormat = Literal["yaml", "json"]
DocumentOutcome = Literal["INSERTED", "UNCHANGED"]

# --------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------

SERVER_ENCODING = "SELECT current_setting('server_encoding')"

RECORD_COLUMNS = """scope_key, definition_id, definition_version, kind, status, contract_name,
       state_type_name, plan_hash, document_digest, document_format, source_location,
       failure_reason, created_at, updated_at"""

INSERT_DOCUMENT = f"""
INSERT INTO {T["definitions"]}
    (scope_key, definition_id, definition_version, kind, status, contract_name,
     state_type_name, plan_hash, name_binding, signal_names_json, start_schema_json,
     document_text, document_digest, document_format, source_location, created_at, updated_at)
VALUES (%s, %s, %s, 'DOCUMENT', %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb,
        %s, %s, %s, %s, now(), now())
RETURNING {RECORD_COLUMNS}
"""

FIND_RECORD = f"""
SELECT {RECORD_COLUMNS}
FROM {T["definitions"]}
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s
"""

# The guarded source read: counts always, the body only inside the envelope.
FIND_DOCUMENT = f"""
SELECT {RECORD_COLUMNS},
       octet_length(document_text), char_length(document_text),
       CASE WHEN octet_length(document_text) <= %(max_bytes)s
             AND char_length(document_text) <= %(max_chars)s
            THEN document_text END
FROM {T["definitions"]}
WHERE scope_key = %(scope)s AND definition_id = %(id)s AND definition_version = %(version)s
"""

# A CANDIDATE, or a PUBLISHING row whose claim is stale by the database's clock
# read after the locks were granted (clock_timestamp, not the transaction's now()).
CLAIM_PUBLICATION = f"""
UPDATE {T["definitions"]}
SET status = 'PUBLISHING', publish_token = gen_random_uuid(),
    publish_claimed_at = clock_timestamp(), updated_at = now()
WHERE scope_key = %(scope)s AND definition_id = %(id)s AND definition_version = %(version)s
  AND kind = 'DOCUMENT'
  AND (status = 'CANDIDATE'
       OR (status = 'PUBLISHING'
           AND publish_claimed_at <= clock_timestamp() - make_interval(secs => %(stale)s)))
RETURNING publish_token
"""

COMPLETE_PUBLICATION = f"""
UPDATE {T["definitions"]}
SET status = 'AVAILABLE', publish_token = NULL, publish_claimed_at = NULL, updated_at = now()
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s
  AND status = 'PUBLISHING' AND publish_token = %s
RETURNING {RECORD_COLUMNS}
"""

RELEASE_PUBLICATION = f"""
UPDATE {T["definitions"]}
SET status = 'CANDIDATE', publish_token = NULL, publish_claimed_at = NULL, updated_at = now()
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s
  AND status = 'PUBLISHING' AND publish_token = %s
"""

# Only a DOCUMENT row of another scope than default that is not RETIRED.
RECORD_FAILURE = f"""
UPDATE {T["definitions"]}
SET failure_reason = %s
WHERE scope_key = %s AND definition_id = %s AND definition_version = %s
  AND kind = 'DOCUMENT' AND scope_key <> 'default' AND status <> 'RETIRED'
  AND failure_reason IS DISTINCT FROM %s
"""

# --------------------------------------------------------------------------
# Values and policy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredDocument:
    """A DOCUMENT row's metadata and its verified text."""

    record: DefinitionRecord
    text: str

    @property
    def format(self) -> str:
        return str(self.record.document_format or "yaml")


def input_limit() -> int:
    """The raw input limit L in bytes (``DOCUMENT_INPUT_LIMIT``, default 262144).

    The compiler refuses a document over L bytes before parsing it; the
    stored envelope derived from L (:func:`envelope`) bounds what a read may
    transfer, whoever wrote the row.
    """
    return int(workflow_settings.DOCUMENT_INPUT_LIMIT)


def envelope(limit: int | None = None) -> tuple[int, int]:
    """``(max UTF-8 bytes, max code points)`` a stored document may hold: floor(3L/2), L."""
    size = input_limit() if limit is None else int(limit)
    return (3 * size) // 2, size


def digest(text: str) -> str:
    """Lowercase hex SHA-256 of the UTF-8 bytes of ``text`` (``document_digest``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _record(values: Any) -> DefinitionRecord:
    values = list(values)
    values[11] = _known_failure(values[11])
    return DefinitionRecord(*values)


# server encoding checked per database (alias, name, host, port); success only
_utf8_databases: set[tuple[Any, ...]] = set()
_utf8_lock = threading.Lock()


def _database_key(alias: str) -> tuple[Any, ...]:
    settings = connections[alias].settings_dict
    return (alias, settings.get("NAME"), settings.get("HOST"), settings.get("PORT"))


def require_utf8() -> None:
    """Refuse document bodies on a database whose ``server_encoding`` is not UTF8.

    Asked before the first body read or write on a database, on the caller's
    connection; only a successful answer is remembered, so a lookup that
    failed (a lost connection) or a database that is not UTF8 is asked again
    at the next body operation. The refusal is a non-retryable
    :class:`WorkflowPersistenceError`: text stored through another encoding
    could not keep the digest's bytes.
    """
    alias = db.alias()
    key = _database_key(alias)
    with _utf8_lock:
        if key in _utf8_databases:
            return
    with connections[alias].cursor() as cursor:
        cursor.execute(SERVER_ENCODING)
        (encoding,) = cursor.fetchone()
    if str(encoding).upper() != "UTF8":
        raise WorkflowPersistenceError(
            f"definition documents need a database whose server_encoding is UTF8; database "
            f"alias {alias!r} uses {encoding}: create the database WITH ENCODING 'UTF8'",
            retryable=False,
        )
    with _utf8_lock:
        _utf8_databases.add(key)


def _forget_utf8() -> None:
    """Forget which databases passed the encoding check (tests)."""
    with _utf8_lock:
        _utf8_databases.clear()


def _checked_text(key: str, definition_id: str, text: str, document_format: str) -> str:
    """The digest of a text fit to store, or a clear refusal before any statement."""
    if document_format not in FORMATS:
        raise WorkflowValidationError(
            f"definition {key}: document format {document_format!r} is not one of "
            f"{', '.join(FORMATS)}"
        )
    if not isinstance(text, str):
        raise WorkflowValidationError(f"definition {key}: a document is text (str)")
    if "\x00" in text:
        raise WorkflowValidationError(f"definition {key}: a document cannot hold NUL characters")
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WorkflowValidationError(
            f"definition {key}: the document is not valid Unicode (a lone surrogate at "
            f"character {exc.start})"
        ) from None
    max_bytes, max_chars = envelope()
    if len(encoded) > max_bytes or len(text) > max_chars:
        raise DocumentTooLarge(
            f"definition {key}: the document has {len(encoded)} UTF-8 bytes and {len(text)} "
            f"code points; stored documents hold at most {max_bytes} bytes and {max_chars} "
            f"code points (DOCUMENT_INPUT_LIMIT {max_chars})",
            definition_id=definition_id,
            byte_length=len(encoded),
            char_length=len(text),
            limit=max_chars,
        )
    return hashlib.sha256(encoded).hexdigest()


def _insert_params(
    scope_key: str,
    plan: PlanLike,
    status: str,
    text: str,
    text_digest: str,
    document_format: str,
    source_location: str | None,
) -> list[Any]:
    return [
        scope_key,
        plan.id,
        int(plan.version),
        status,
        plan.contract,
        plan.state_type_name,
        plan.plan_hash,
        _dump(dict(getattr(plan, "name_binding", None) or {})),
        _dump(dict(plan.signals)),
        _dump(plan.start_schema),
        text,
        text_digest,
        document_format,
        source_location,
    ]


def _invalid(definition_id: str, message: str) -> DefinitionUnavailable:
    return DefinitionUnavailable(f"{INVALID_TRANSITION}: {message}", definition_id=definition_id)


# --------------------------------------------------------------------------
# Writes
# --------------------------------------------------------------------------


def insert_candidate(
    scope_key: str,
    plan: PlanLike,
    text: str,
    document_format: str,
    source_location: str | None = None,
) -> DefinitionRecord:
    """Write a runtime-loaded document as the CANDIDATE ``(scope_key, plan.id, plan.version)``.

    ``plan`` is the document's compiled plan (the caller compiled ``text``);
    its hash, contract, state type, name binding and schemas are written in
    the same statement as the text and its digest. Under the id lock, from
    the locked rows of every scope, before anything is written:

    * a row under the key (any kind and status) is refused
      (:class:`DefinitionUnavailable`: load the changed document as a new
      version);
    * another CANDIDATE/PUBLISHING/AVAILABLE/DEPRECATED version of the same
      scope naming another contract or state type is refused
      (:class:`WorkflowDefinitionError` naming the rule);
    * in a scope other than default that holds no row of the id at all, a
      default-scope row of the id (any status) under another contract is
      refused (:class:`ContractMismatch`); a default-scope insert is never
      refused for the rows of other scopes.
    """
    record, _ = _write_candidate(
        scope_key, plan, text, document_format, source_location, unchanged_ok=False
    )
    return record


def load_candidate(
    scope_key: str,
    plan: PlanLike,
    text: str,
    document_format: str,
    source_location: str | None = None,
) -> tuple[DefinitionRecord, DocumentOutcome]:
    """:func:`insert_candidate`, except that loading the same text again is a no-op.

    A runtime load is often repeated (a deploy script run twice, an operator
    retrying after a timeout): when the key already holds a DOCUMENT row
    with the same text digest and plan hash, nothing is written and the
    stored record is returned with ``"UNCHANGED"`` (whatever its status).
    The same key with another text (or a CODE row) stays refused with
    :class:`DefinitionUnavailable`: a changed document is a new version.
    Decided under the id lock, so two identical concurrent loads give one
    ``"INSERTED"`` and one ``"UNCHANGED"``.
    """
    return _write_candidate(
        scope_key, plan, text, document_format, source_location, unchanged_ok=True
    )


def _write_candidate(
    scope_key: str,
    plan: PlanLike,
    text: str,
    document_format: str,
    source_location: str | None,
    *,
    unchanged_ok: bool,
) -> tuple[DefinitionRecord, DocumentOutcome]:
    definition_id, version = plan.id, int(plan.version)
    key = _key(scope_key, definition_id, version)
    text_digest = _checked_text(key, definition_id, text, document_format)
    require_utf8()
    with _mutation(definition_id) as (cursor, rows):
        own = _find(rows, scope_key, version)
        if own is not None:
            same = (
                own.kind == "DOCUMENT"
                and own.document_digest == text_digest
                and own.plan_hash == plan.plan_hash
            )
            if unchanged_ok and same:
                cursor.execute(FIND_RECORD, [scope_key, definition_id, version])
                return _record(cursor.fetchone()), "UNCHANGED"
            what = f"({own.kind}, {own.status})"
            if own.kind == "DOCUMENT" and same:
                what += " with the same text"
            elif own.kind == "DOCUMENT" and own.document_digest == text_digest:
                what += (
                    " with the same text, which compiles on this node to another plan hash "
                    f"({plan.plan_hash[:12]}, stored {own.plan_hash[:12]})"
                )
            elif own.kind == "DOCUMENT":
                what += (
                    f" with another text (stored digest {str(own.document_digest)[:12]}, "
                    f"this one {text_digest[:12]})"
                )
            raise DefinitionUnavailable(
                f"definition {key} already exists {what}; nothing was written: load a "
                "changed document as a new version",
                definition_id=definition_id,
            )
        _check_version_rules(
            rows, scope_key, definition_id, version, plan.contract, plan.state_type_name
        )
        _check_default_contract(
            rows, scope_key, definition_id, version, plan.contract, counted=STATUSES
        )
        cursor.execute(
            INSERT_DOCUMENT,
            _insert_params(
                scope_key, plan, "CANDIDATE", text, text_digest, document_format, source_location
            ),
        )
        return _record(cursor.fetchone()), "INSERTED"


def upsert_document(
    scope_key: str,
    plan: PlanLike,
    text: str,
    document_format: str,
    source_location: str | None = None,
    *,
    activate_default: bool = True,
) -> DocumentOutcome:
    """Record a packaged document (startup) as an AVAILABLE DOCUMENT row.

    * No row: the version rules of the scope (and, outside the default
      scope, the default-scope contract rule) apply; the row is inserted
      AVAILABLE and ``"INSERTED"`` returned. Only then, when
      ``activate_default`` and the scope is default, the default activation
      ``(default, id) -> (default, version)`` is written in the same
      transaction, replacing a stored record only when it names a lower
      version (concurrent first boots end on the highest version).
    * The same plan hash and the same text digest: ``"UNCHANGED"``, nothing
      written (whatever the row's status: a restart never undoes an
      operator's choice).
    * The same plan hash, another digest: :class:`DocumentDrift`, nothing
      written (the stored text changed, or the packaged file did without
      changing the plan).
    * Another plan hash: :class:`WorkflowDefinitionError` (a document's text
      is its source: a changed structure is a new version); a CODE row under
      the key is refused too.
    """
    definition_id, version = plan.id, int(plan.version)
    key = _key(scope_key, definition_id, version)
    text_digest = _checked_text(key, definition_id, text, document_format)
    require_utf8()
    with _mutation(definition_id) as (cursor, rows):
        own = _find(rows, scope_key, version)
        if own is not None:
            if own.kind != "DOCUMENT":
                raise WorkflowDefinitionError(
                    f"definition {key} is recorded as a {own.kind} row; a document cannot use "
                    "the same id and version",
                    definition_id=definition_id,
                )
            if own.plan_hash != plan.plan_hash:
                raise WorkflowDefinitionError(
                    f"definition {key} is stored with another plan hash "
                    f"({own.plan_hash[:12]}, not {plan.plan_hash[:12]}); a changed document "
                    "is a new version",
                    definition_id=definition_id,
                )
            if own.document_digest != text_digest:
                raise DocumentDrift(
                    f"definition {key}: drift: the stored document has the same plan hash but "
                    "another text digest than the packaged one; nothing was written",
                    definition_id=definition_id,
                )
            return "UNCHANGED"
        _check_version_rules(
            rows, scope_key, definition_id, version, plan.contract, plan.state_type_name
        )
        _check_default_contract(
            rows, scope_key, definition_id, version, plan.contract, counted=STATUSES
        )
        cursor.execute(
            INSERT_DOCUMENT,
            _insert_params(
                scope_key, plan, "AVAILABLE", text, text_digest, document_format, source_location
            ),
        )
        if activate_default and scope_key == DEFAULT_SCOPE:
            cursor.execute(ACTIVATE_DEFAULT_IF_HIGHER, [definition_id, version])
        return "INSERTED"


# --------------------------------------------------------------------------
# Publication
# --------------------------------------------------------------------------


def claim_publication(scope_key: str, definition_id: str, version: int) -> uuid.UUID:
    """CANDIDATE -> PUBLISHING with a fresh UUID ``publish_token``; returns the token.

    A PUBLISHING row whose claim is stale -- its ``publish_claimed_at`` at
    least ``PUBLICATION_CLAIM_TIMEOUT_SECONDS`` old by PostgreSQL's clock
    read after the locks were granted -- is claimed again with a new token,
    which makes the old claim obsolete. Anything else (no row, a CODE row,
    another status, a fresh claim) is refused with
    :class:`DefinitionUnavailable` (``INVALID_TRANSITION``).
    """
    key = _key(scope_key, definition_id, version)
    stale = int(workflow_settings.PUBLICATION_CLAIM_TIMEOUT_SECONDS)
    with _mutation(definition_id) as (cursor, rows):
        own = _find(rows, scope_key, version)
        if own is None:
            raise _invalid(definition_id, f"definition {key} does not exist")
        if own.kind != "DOCUMENT":
            raise _invalid(definition_id, f"definition {key} is a {own.kind} row: not published")
        cursor.execute(
            CLAIM_PUBLICATION,
            {"scope": scope_key, "id": definition_id, "version": version, "stale": stale},
        )
        claimed = cursor.fetchone()
        if claimed is not None:
            token = claimed[0]
            return token if isinstance(token, uuid.UUID) else uuid.UUID(str(token))
        if own.status == "PUBLISHING":
            raise _invalid(
                definition_id,
                f"definition {key} is being published under another claim (stale after {stale} s)",
            )
        raise _invalid(definition_id, f"definition {key} is {own.status}, not CANDIDATE")


def complete_publication(
    scope_key: str, definition_id: str, version: int, token: uuid.UUID | str
) -> DefinitionRecord:
    """PUBLISHING under ``token`` -> AVAILABLE (the token and claim time cleared).

    Fenced by the token: a claim made obsolete by a reclaim, a release or an
    earlier completion fails with :class:`DefinitionUnavailable`
    (``INVALID_TRANSITION``) and changes nothing. Only the claimed row changes.
    """
    key = _key(scope_key, definition_id, version)
    with _mutation(definition_id) as (cursor, _rows):
        cursor.execute(COMPLETE_PUBLICATION, [scope_key, definition_id, version, str(token)])
        completed = cursor.fetchone()
        if completed is None:
            raise _invalid(
                definition_id, f"definition {key}: the publication claim {token} is obsolete"
            )
        return _record(completed)


def release_publication(
    scope_key: str, definition_id: str, version: int, token: uuid.UUID | str
) -> bool:
    """PUBLISHING under ``token`` -> CANDIDATE; an obsolete token is a no-op (False)."""
    with _mutation(definition_id) as (cursor, _rows):
        cursor.execute(RELEASE_PUBLICATION, [scope_key, definition_id, version, str(token)])
        return cursor.rowcount == 1


# --------------------------------------------------------------------------
# Failure marks
# --------------------------------------------------------------------------


def record_failure(scope_key: str, definition_id: str, version: int, reason: str | None) -> bool:
    """Mark (or, with ``reason`` None, clear) the rule a scope's document row breaks.

    ``reason`` is ``STATE_TYPE_NOT_EXTENDED`` or ``NAME_BINDING_UNRESOLVED``.
    One UPDATE under the id lock that matches only a DOCUMENT row of a scope
    other than default that is not RETIRED: a default-scope row, a CODE row
    and a RETIRED row are left untouched. Returns whether the row changed.
    """
    if reason is not None and reason not in KNOWN_FAILURES:
        raise WorkflowValidationError(
            f"failure reason {reason!r} is not one of {', '.join(sorted(KNOWN_FAILURES))}"
        )
    with _mutation(definition_id) as (cursor, _rows):
        cursor.execute(RECORD_FAILURE, [reason, scope_key, definition_id, version, reason])
        return cursor.rowcount == 1


# --------------------------------------------------------------------------
# The guarded read
# --------------------------------------------------------------------------


def find_document(scope_key: str, definition_id: str, version: int) -> StoredDocument | None:
    """The DOCUMENT row ``(scope_key, definition_id, version)`` with its verified text.

    One statement on the caller's connection (and transaction, if any)
    returns the row's UTF-8 byte length and code-point count and the text
    only when both fit the envelope of ``DOCUMENT_INPUT_LIMIT``. Then:

    * no row, or a CODE row (no document): None;
    * outside the envelope: :class:`DocumentTooLarge` with the counts and a
      message naming only the key and the limit (the body never left the
      server; the row is not treated as absent);
    * the text's SHA-256 differs from ``document_digest``:
      :class:`DocumentDrift`; the altered text is not returned.
    """
    key = _key(scope_key, definition_id, version)
    require_utf8()
    max_bytes, max_chars = envelope()
    connection = connections[db.alias()]
    with connection.cursor() as cursor:
        cursor.execute(
            FIND_DOCUMENT,
            {
                "max_bytes": max_bytes,
                "max_chars": max_chars,
                "scope": scope_key,
                "id": definition_id,
                "version": version,
            },
        )
        found = cursor.fetchone()
    if found is None:
        return None
    record = _record(found[:14])
    byte_length, char_length, text = found[14], found[15], found[16]
    if record.kind != "DOCUMENT":
        return None
    if text is None:
        raise DocumentTooLarge(
            f"definition {key}: the stored document has {byte_length} UTF-8 bytes and "
            f"{char_length} code points, outside the envelope of {max_bytes} bytes and "
            f"{max_chars} code points for DOCUMENT_INPUT_LIMIT {max_chars}; it was not read",
            definition_id=definition_id,
            byte_length=int(byte_length),
            char_length=int(char_length),
            limit=max_chars,
        )
    if digest(text) != record.document_digest:
        raise DocumentDrift(
            f"definition {key}: drift: the stored document text does not match its "
            "document_digest (it was changed after it was written); it was not returned",
            definition_id=definition_id,
        )
    return StoredDocument(record, text)
