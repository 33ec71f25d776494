"""Opaque keyset cursors: the last row's sort key, base64 of a small JSON array.

One encoding for every keyset page (tasks, instances, history), so a page's
``next_cursor`` is an opaque string a caller hands back unchanged. Each cursor
carries a kind tag, so a task cursor handed to the instance list is refused
instead of silently starting somewhere.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any


def encode(kind: str, values: Sequence[Any]) -> str:
    """A cursor of ``kind`` holding ``values`` (JSON-serialisable, str() for the rest)."""
    raw = json.dumps([kind, *values], default=str, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: str, cursor: str, parsers: Sequence[Callable[[Any], Any]]) -> tuple[Any, ...]:
    """The values of a cursor of ``kind``, each through its parser.

    Raises ValueError for anything this module did not write for that kind
    (another kind, a truncated or edited string, values that do not parse).
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a {kind} cursor") from exc
    if not isinstance(decoded, list) or len(decoded) != len(parsers) + 1 or decoded[0] != kind:
        raise ValueError(f"not a {kind} cursor")
    try:
        return tuple(parse(value) for parse, value in zip(parsers, decoded[1:], strict=True))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a {kind} cursor") from exc
