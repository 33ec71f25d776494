"""Parsing a document's text into plain JSON data, keeping the line of every path.

Two front ends, one result (``Parsed``): YAML through PyYAML's reader,
scanner, parser and composer only -- no constructor runs, so no tag can
build an object -- and JSON through a small position-keeping reader over the
standard library's string and number scanners. Both refuse what a hostile
document could use to make parsing expensive or ambiguous:

- YAML anchors and aliases (an alias bomb expands a few lines into
  gigabytes; a workflow document never needs them);
- nesting deeper than ``MAX_DEPTH`` collections (the composer recurses);
- duplicate keys, keys that are not strings, tags other than the core
  ones (``!!str``, ``!!int``, ``!!float``, ``!!bool``, ``!!null``,
  ``!!seq``, ``!!map``), numbers that are not finite.

Scalars follow YAML 1.2's core schema, not PyYAML's YAML 1.1 default: only
``true``/``false`` are booleans (``on``, ``yes``, ``no`` stay strings, so
``on:`` is a key), decimal/octal/hex integers and plain floats are numbers,
and nothing else (no timestamps, no sexagesimal ``1:30``) is converted.
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import json.scanner
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from .errors import DocumentError, Path, format_path

__all__ = ["MAX_DEPTH", "Parsed", "parse"]

#: The deepest nesting of mappings and lists a document may use.
MAX_DEPTH = 64

_CORE = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (
    f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null")
)
_SEQ, _MAP = f"{_CORE}seq", f"{_CORE}map"
_DECIMAL = re.compile(r"[-+]?[0-9]+")
_OCTAL_HEX = re.compile(r"0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT_TEXT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")


@dataclass
class Parsed:
    """The document as JSON data, and the 1-based line each path starts on.

    A mapping entry's line is its key's line (where an editor should point
    for "unknown key" as well as for a bad value); a list item's is the
    item's own.
    """

    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest enclosing path that has one."""
        path = tuple(path)
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            path = path[:-1]


class _Resolver(BaseResolver):
    """YAML 1.2 core schema resolution for plain scalars (see the module docstring)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}


_Resolver.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Resolver.add_implicit_resolver(_NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_Resolver.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_Resolver.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


class _Loader(Reader, Scanner, Parser, Composer, _Resolver):
    """PyYAML's safe front half -- reader to composer -- with no constructor at all.

    ``compose_node`` refuses aliases and anchors before the composer can
    share or expand a node, and collections nested deeper than ``MAX_DEPTH``
    before it recurses further.
    """

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, AliasEvent):
            raise DocumentError("YAML aliases are not allowed in a workflow document", line=line)
        if event.anchor is not None:
            raise DocumentError("YAML anchors are not allowed in a workflow document", line=line)
        collection = isinstance(event, MappingStartEvent | SequenceStartEvent)
        if collection:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise DocumentError(f"nested deeper than {MAX_DEPTH} mappings and lists", line=line)
        try:
            node: Node = super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1
        return node


def _scalar(node: ScalarNode, path: Path) -> Any:
    tag, text = node.tag, node.value
    line = node.start_mark.line + 1
    where = format_path(path)
    if tag == _STR:
        return text
    if tag == _NULL:
        if text not in ("", "~", "null", "Null", "NULL"):
            raise DocumentError("!!null takes no value", path=where, line=line)
        return None
    if tag == _BOOL:
        if text.lower() not in ("true", "false"):
            raise DocumentError("a boolean is true or false", path=where, line=line)
        return text.lower() == "true"
    if tag == _INT:
        try:
            if _DECIMAL.fullmatch(text):
                return int(text, 10)
            if _OCTAL_HEX.fullmatch(text):
                return int(text, 0)
        except ValueError:
            pass  # more digits than Python converts
        raise DocumentError("not an integer this reader accepts", path=where, line=line)
    if tag == _FLOAT:
        if _FLOAT_TEXT.fullmatch(text):
            value = float(text)
            if math.isfinite(value):
                return value
        raise DocumentError("not a finite number", path=where, line=line)
    raise DocumentError(
        f"tag {tag[:64]!r} is not allowed (only plain YAML: strings, numbers, booleans, null, "
        "lists and mappings)",
        path=where,
        line=line,
    )


def _convert(node: Node, path: Path, lines: dict[Path, int]) -> Any:
    """The composed node tree as plain data; iterative depth is bounded by the composer."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, ScalarNode):
        return _scalar(node, path)
    if isinstance(node, SequenceNode):
        if node.tag != _SEQ:
            raise DocumentError(
                f"tag {node.tag[:64]!r} is not allowed on a list",
                path=format_path(path),
                line=node.start_mark.line + 1,
            )
        return [_convert(item, (*path, index), lines) for index, item in enumerate(node.value)]
    assert isinstance(node, MappingNode)
    if node.tag != _MAP:
        raise DocumentError(
            f"tag {node.tag[:64]!r} is not allowed on a mapping",
            path=format_path(path),
            line=node.start_mark.line + 1,
        )
    result: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key_line = key_node.start_mark.line + 1
        if not (isinstance(key_node, ScalarNode) and key_node.tag == _STR):
            raise DocumentError(
                "mapping keys must be strings (quote a key that looks like a number, "
                "boolean or null)",
                path=format_path(path),
                line=key_line,
            )
        key = key_node.value
        if key in result:
            raise DocumentError(
                f"duplicate key {key[:64]!r}", path=format_path(path), line=key_line
            )
        lines[(*path, key)] = key_line
        result[key] = _convert(value_node, (*path, key), lines)
    return result


def _parse_yaml(text: str) -> Parsed:
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed YAML"
        raise DocumentError(
            f"malformed YAML: {problem}", line=None if mark is None else mark.line + 1
        ) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        raise DocumentError(f"malformed YAML: {exc.reason}", line=line) from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"malformed YAML: {type(exc).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise DocumentError("the document is empty")
    lines: dict[Path, int] = {}
    data = _convert(root, (), lines)
    lines[()] = 1
    return Parsed(data, lines)


class _JsonReader:
    """A recursive-descent JSON reader (RFC 8259) that records the line of every path."""

    _WS = re.compile(r"[ \t\n\r]*")

    def __init__(self, text: str) -> None:
        self.text = text
        self.breaks = [index for index, char in enumerate(text) if char == "\n"]
        self.lines: dict[Path, int] = {}

    def line(self, pos: int) -> int:
        return bisect.bisect_left(self.breaks, pos) + 1

    def fail(self, detail: str, pos: int, path: Path) -> DocumentError:
        return DocumentError(
            f"malformed JSON: {detail}", path=format_path(path), line=self.line(pos)
        )

    def skip(self, pos: int) -> int:
        match = self._WS.match(self.text, pos)
        assert match is not None
        return match.end()

    def read(self) -> Parsed:
        pos = self.skip(0)
        if pos == len(self.text):
            raise DocumentError("the document is empty")
        data, pos = self.value(pos, (), 0)
        pos = self.skip(pos)
        if pos != len(self.text):
            raise self.fail("extra data after the document", pos, ())
        self.lines[()] = 1
        return Parsed(data, self.lines)

    def string(self, pos: int, path: Path) -> tuple[str, int]:
        try:
            value, end = json.decoder.scanstring(self.text, pos + 1, True)
        except json.JSONDecodeError as exc:
            raise self.fail(exc.msg, exc.pos, path) from None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail("a string with an unpaired surrogate escape", pos, path) from None
        return value, end

    def value(self, pos: int, path: Path, depth: int) -> tuple[Any, int]:
        text = self.text
        self.lines.setdefault(path, self.line(pos))
        char = text[pos : pos + 1]
        if char in ("{", "["):
            if depth + 1 > MAX_DEPTH:
                raise DocumentError(
                    f"nested deeper than {MAX_DEPTH} objects and arrays", line=self.line(pos)
                )
            reader: Callable[[int, Path, int], tuple[Any, int]] = (
                self.object if char == "{" else self.array
            )
            return reader(pos + 1, path, depth + 1)
        if char == '"':
            return self.string(pos, path)
        for word, constant in (("true", True), ("false", False), ("null", None)):
            if text.startswith(word, pos):
                return constant, pos + len(word)
        match = json.scanner.NUMBER_RE.match(text, pos)
        if match is None:
            raise self.fail("expected a value", pos, path)
        integer, fraction, exponent = match.groups()
        if fraction or exponent:
            number: int | float = float(match.group())
            if not math.isfinite(number):
                raise self.fail("a number too large to be finite", pos, path)
        else:
            try:
                number = int(integer)
            except ValueError:
                raise self.fail("an integer with too many digits", pos, path) from None
        return number, match.end()

    def object(self, pos: int, path: Path, depth: int) -> tuple[dict[str, Any], int]:
        result: dict[str, Any] = {}
        pos = self.skip(pos)
        if self.text[pos : pos + 1] == "}":
            return result, pos + 1
        while True:
            if self.text[pos : pos + 1] != '"':
                raise self.fail("expected a string key", pos, path)
            key_pos = pos
            key, pos = self.string(pos, path)
            if key in result:
                raise DocumentError(
                    f"duplicate key {key[:64]!r}", path=format_path(path), line=self.line(key_pos)
                )
            self.lines[(*path, key)] = self.line(key_pos)
            pos = self.skip(pos)
            if self.text[pos : pos + 1] != ":":
                raise self.fail("expected ':' after a key", pos, path)
            result[key], pos = self.value(self.skip(pos + 1), (*path, key), depth)
            pos = self.skip(pos)
            char = self.text[pos : pos + 1]
            if char == "}":
                return result, pos + 1
            if char != ",":
                raise self.fail("expected ',' or '}'", pos, path)
            pos = self.skip(pos + 1)

    def array(self, pos: int, path: Path, depth: int) -> tuple[list[Any], int]:
        result: list[Any] = []
        pos = self.skip(pos)
        if self.text[pos : pos + 1] == "]":
            return result, pos + 1
        while True:
            item, pos = self.value(pos, (*path, len(result)), depth)
            result.append(item)
            pos = self.skip(pos)
            char = self.text[pos : pos + 1]
            if char == "]":
                return result, pos + 1
            if char != ",":
                raise self.fail("expected ',' or ']'", pos, path)
            pos = self.skip(pos + 1)


def parse(text: str, format: str) -> Parsed:
    """Parse ``text`` as ``"yaml"`` or ``"json"``; ``DocumentError`` for anything refused."""
    if format == "json":
        return _JsonReader(text).read()
    return _parse_yaml(text)
