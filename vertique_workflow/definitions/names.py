"""Names the plan hash covers instead of code, and the small hashable mapping steps use.

Its own module because ``plan.py`` imports the step specs (``tasks.py``,
``branches.py``), which need both too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["FrozenMap", "callable_name"]


def callable_name(obj: Any) -> str:
    """``module.qualname`` of a function or class: what the plan hash covers instead of code."""
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{qualname}"


class FrozenMap(Mapping[str, str]):
    """A small read-only, hashable mapping, so a ``Step`` stays immutable and hashable."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        self._data: dict[str, str] = dict(items)

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"
