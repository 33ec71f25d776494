"""Readable durations ("3d", "2h", "1d12h") for timers, due dates and reminders."""

from __future__ import annotations

import datetime
import re

from ..exceptions import WorkflowDefinitionError

__all__ = ["parse_duration"]

# Units from largest to smallest, each at most once, no separators: the text
# reads like the diagram label and has exactly one spelling per duration.
_DURATION = re.compile(
    r"(?:(?P<weeks>\d+)w)?(?:(?P<days>\d+)d)?(?:(?P<hours>\d+)h)?"
    r"(?:(?P<minutes>\d+)m)?(?:(?P<seconds>\d+)s)?"
)
_MAX_TEXT = 64


def parse_duration(text: str | datetime.timedelta) -> datetime.timedelta:
    """Parse ``"30s"``, ``"15m"``, ``"2h"``, ``"3d"``, ``"1w"`` and combinations like ``"1d12h"``.

    Units go from largest to smallest and appear at most once. A positive
    ``timedelta`` is returned as is, so APIs can take either form. Anything
    else -- empty, zero, negative, unknown units -- raises
    ``WorkflowDefinitionError``: durations are part of a definition, and a
    typo must fail when the plan is built, not when the timer fires.
    """
    if isinstance(text, datetime.timedelta):
        if text <= datetime.timedelta(0):
            raise WorkflowDefinitionError("a duration must be positive")
        return text
    if not isinstance(text, str):
        raise WorkflowDefinitionError(
            f"a duration must be a string like '2h' or '1d12h', not {type(text).__name__}"
        )
    candidate = text.strip()
    match = _DURATION.fullmatch(candidate) if len(candidate) <= _MAX_TEXT else None
    if not candidate or match is None:
        raise WorkflowDefinitionError(
            f"invalid duration {text[:_MAX_TEXT]!r}: use whole numbers with units w, d, h, m, s "
            "from largest to smallest, e.g. '30s', '15m', '2h', '3d', '1d12h'"
        )
    parts = {unit: int(value) for unit, value in match.groupdict().items() if value is not None}
    try:
        duration = datetime.timedelta(**parts)
    except OverflowError:
        raise WorkflowDefinitionError(f"duration {candidate!r} is too large") from None
    if duration <= datetime.timedelta(0):
        raise WorkflowDefinitionError(f"duration {candidate!r} must be positive")
    return duration
