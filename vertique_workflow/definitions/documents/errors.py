"""``DocumentError``: a refused document, pointing at the path and line that broke a rule.

Editors, the ``workflow_definitions`` command and the admin show where a
document is wrong without parsing the message: ``path``
(``steps.route.targets[1]``), ``line`` (1-based) and ``source`` (the file it
came from) repeat what the message says.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...exceptions import WorkflowDefinitionError

__all__ = ["DocumentError", "Path", "format_path"]

#: A location inside the document: mapping keys and sequence indexes from the root.
Path = tuple[str | int, ...]

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_$-]{1,64}")
_MAX_KEY_SHOWN = 64


def format_path(path: Sequence[str | int]) -> str:
    """``("steps", "route", "targets", 1)`` as ``steps.route.targets[1]``.

    A key that is not a plain name (dots, spaces, quotes, very long) is shown
    quoted and cut, ``steps['a.b']``, so the path stays one unambiguous line.
    """
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{part[:_MAX_KEY_SHOWN]!r}]"
    return text


class DocumentError(WorkflowDefinitionError):
    """A workflow document refused: malformed, hostile, or not a valid definition.

    The message reads ``<source>:<line>: <path>: <what is wrong>`` (source
    ``<document>`` when none was given; line and path left out when unknown),
    e.g. ``orders.yaml:12: steps.route.next: unknown step 'shipp'``.
    ``detail`` is the last part alone.
    """

    def __init__(
        self,
        detail: str,
        *,
        path: str | None = None,
        line: int | None = None,
        source: str | None = None,
        definition_id: str | None = None,
        step_id: str | None = None,
    ) -> None:
        self.detail = detail
        self.path = path or None
        self.line = line
        self.source = source
        location = source or "<document>"
        if line is not None:
            location += f":{line}"
        message = f"{location}: {self.path}: {detail}" if self.path else f"{location}: {detail}"
        super().__init__(message, definition_id=definition_id, step_id=step_id)
