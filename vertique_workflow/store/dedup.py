"""workflow_dedup: idempotency keys of starts and signals."""

from __future__ import annotations

import json
from typing import Any

from . import db

T = db.T

FIND = f"""
SELECT workflow_id, fingerprint, result_json FROM {T["dedup"]}
WHERE kind = %s AND scope_key = %s AND dedup_namespace = %s AND key = %s
"""

CLAIM = f"""
INSERT INTO {T["dedup"]} (kind, scope_key, dedup_namespace, key, workflow_id, fingerprint,
                          result_json)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb)
ON CONFLICT (kind, scope_key, dedup_namespace, key) DO NOTHING
RETURNING workflow_id
"""


def find(kind: str, scope_key: str, namespace: str, key: str) -> tuple[Any, str, Any] | None:
    row = db.fetchone_prepared(FIND, (kind, scope_key, namespace, key))
    return None if row is None else (row[0], row[1], row[2])


def claim(
    kind: str,
    scope_key: str,
    namespace: str,
    key: str,
    workflow_id: Any,
    fingerprint: str,
    result: Any = None,
) -> bool:
    """Insert the key; False when another transaction committed it first."""
    row = db.fetchone_prepared(
        CLAIM,
        (
            kind,
            scope_key,
            namespace,
            key,
            workflow_id,
            fingerprint,
            None if result is None else json.dumps(result),
        ),
    )
    return row is not None
