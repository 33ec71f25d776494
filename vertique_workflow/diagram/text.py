"""User text in SVG: escaping, CSS-safe ids, truncation.

Step ids, signal, decision and branch names are user text (a document
uploaded at run time may name a step ``<script>``): every one of them goes
through :func:`xml_text` or :func:`xml_attr` before it reaches the markup.
Characters XML 1.0 cannot carry at all (most control characters, lone
surrogates) become U+FFFD, so the picture always parses.
"""

from __future__ import annotations

import re

__all__ = [
    "EDGE_LABEL_LIMIT",
    "css_class",
    "css_id",
    "label_width",
    "truncate",
    "xml_attr",
    "xml_text",
]

EDGE_LABEL_LIMIT = 28
CHAR_WIDTH = 6.6  # an estimate of one character at the 11-12px of the labels

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_TEXT_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"}
_ATTR_ESCAPES = {**_TEXT_ESCAPES, '"': "&quot;", "'": "&#39;", "\n": "&#10;", "\t": "&#9;"}
_TEXT_SPECIAL = re.compile("[&<>\r]")
_ATTR_SPECIAL = re.compile("[&<>\r\"'\n\t]")
_CSS_KEPT = re.compile(r"[A-Za-z0-9-]")


def _xml_chars(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)


def xml_text(value: object) -> str:
    """``value`` as XML character data (``&``, ``<``, ``>`` and CR escaped)."""
    return _TEXT_SPECIAL.sub(lambda m: _TEXT_ESCAPES[m.group()], _xml_chars(str(value)))


def xml_attr(value: object) -> str:
    """``value`` for a double-quoted attribute; tabs and newlines survive normalisation."""
    return _ATTR_SPECIAL.sub(lambda m: _ATTR_ESCAPES[m.group()], _xml_chars(str(value)))


def css_id(value: str) -> str:
    """An injective, CSS- and HTML-safe spelling of ``value``: ``[A-Za-z0-9-]`` and ``_hex_``.

    Letters, digits and ``-`` stay; every other character (``_`` too)
    becomes ``_<hex code point>_``, so two step ids never share an element
    id and ``#step-...`` needs no CSS escaping.
    """
    return "".join(ch if _CSS_KEPT.fullmatch(ch) else f"_{ord(ch):x}_" for ch in value)


def css_class(value: str) -> str:
    """A lowercase class-name token of a status (``WAITING`` -> ``waiting``)."""
    return "".join(ch if _CSS_KEPT.fullmatch(ch) else "-" for ch in value.lower())[:40]


def truncate(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters with an ellipsis (the full text goes in a title)."""
    return value if len(value) <= limit else value[: max(limit - 1, 1)] + "\u2026"


def label_width(value: str, limit: int = EDGE_LABEL_LIMIT) -> float:
    """About how wide an edge label is drawn, after truncation."""
    return CHAR_WIDTH * len(truncate(value, limit))
