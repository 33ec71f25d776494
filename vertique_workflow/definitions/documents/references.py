"""The catalog documents name their code by: registered callables and types, and Workflow methods.

A document is data, possibly loaded at runtime from the database, so it may
not import or call arbitrary code by name (``os.system``). It names only:

- callables registered with ``register_callable`` (a function, a lambda,
  any callable), under their default name ``module.qualname`` or an alias;
- types registered with ``register_type`` (a dataclass state type, an
  exception class a retry policy never retries), likewise;
- methods of a ``Workflow`` subclass that is already imported, as
  ``module.Class.method`` -- exactly the name the code DSL hashes for that
  method, so a document and the class it mirrors hash identically.

The hash rule: whatever name a document uses, a step hashes the name the
code DSL would hash for the same callable -- ``callable_name(func)`` for a
registered callable (never the alias), ``module.Class.method`` for a
Workflow method -- and a state type hashes its ``module.qualname``.
Nothing is imported on a document's behalf.
"""

from __future__ import annotations

import builtins
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ...exceptions import WorkflowDefinitionError
from ..dsl import StepSpec, Workflow
from ..names import callable_name

__all__ = [
    "DocumentCatalog",
    "document_catalog",
    "register_callable",
    "register_type",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound=type)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 255 or name != name.strip():
        raise WorkflowDefinitionError(
            f"a {what} name must be a non-empty string of at most 255 characters "
            "without outer spaces"
        )
    return name


class DocumentCatalog:
    """Callables and types by the names documents use; safe to share between threads."""

    def __init__(self) -> None:
        self._callables: dict[str, Callable[..., Any]] = {}
        self._types: dict[str, type] = {}
        self._lock = threading.Lock()

    def add_callable(self, func: Callable[..., Any], name: str | None = None) -> str:
        """Register ``func`` under ``name`` (default ``callable_name(func)``); return the name.

        The same callable again is a no-op; another callable under a taken
        name raises ``WorkflowDefinitionError`` (two lambdas of one module
        share a default name: give each an alias).
        """
        if isinstance(func, StepSpec) or (isinstance(func, type) and issubclass(func, Workflow)):
            raise WorkflowDefinitionError(
                "a Workflow class and its steps need no registration: a document names "
                "a Workflow method as 'module.Class.method'"
            )
        if not callable(func):
            raise WorkflowDefinitionError(
                f"register_callable takes a callable, not {type(func).__name__}"
            )
        key = _check_name(callable_name(func) if name is None else name, "callable")
        with self._lock:
            held = self._callables.setdefault(key, func)
        if held is not func:
            raise WorkflowDefinitionError(
                f"callable name {key!r} is already registered for {callable_name(held)}: "
                "register this one under another name"
            )
        return key

    def add_type(self, cls: type, name: str | None = None) -> str:
        """Register the class ``cls`` under ``name`` (default ``module.qualname``)."""
        if not isinstance(cls, type):
            raise WorkflowDefinitionError(f"register_type takes a class, not {type(cls).__name__}")
        key = _check_name(callable_name(cls) if name is None else name, "type")
        with self._lock:
            held = self._types.setdefault(key, cls)
        if held is not cls:
            raise WorkflowDefinitionError(
                f"type name {key!r} is already registered for {callable_name(held)}: "
                "register this one under another name"
            )
        return key

    def callable(self, name: str) -> Callable[..., Any] | None:
        """The callable registered under ``name``, or None."""
        return self._callables.get(name)

    def type(self, name: str) -> type | None:
        """The type registered under ``name``; builtin exception classes by name too."""
        found = self._types.get(name)
        if found is not None:
            return found
        short = name.removeprefix("builtins.")
        candidate = getattr(builtins, short, None) if "." not in short else None
        if isinstance(candidate, type) and issubclass(candidate, Exception):
            return candidate
        return None

    def clear(self) -> None:
        """Forget every registration (tests)."""
        with self._lock:
            self._callables.clear()
            self._types.clear()


document_catalog = DocumentCatalog()
"""The process-wide catalog ``compile_document`` resolves names through."""


@overload
def register_callable(func: F, /, *, name: str | None = None) -> F: ...
@overload
def register_callable(*, name: str | None = None) -> Callable[[F], F]: ...
def register_callable(func: Any = None, /, *, name: str | None = None) -> Any:
    """Let documents name ``func``: ``register_callable(f)``, or ``@register_callable(name=...)``.

    The name defaults to ``module.qualname``. The plan hash always covers
    ``module.qualname`` (what the code DSL hashes), never the alias, so a
    document using an alias hashes like the code that passes the function.
    """

    def decorate(target: F) -> F:
        document_catalog.add_callable(target, name)
        return target

    return decorate if func is None else decorate(func)


def register_type(cls: T, *, name: str | None = None) -> T:
    """Let documents name the class ``cls`` (a state type, an exception class); returns it."""
    document_catalog.add_type(cls, name)
    return cls


def _all_workflow_classes() -> list[type[Workflow[Any]]]:
    found: list[type[Workflow[Any]]] = []
    pending = list(Workflow.__subclasses__())
    seen: set[type] = set()
    while pending:
        cls = pending.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _bound_in_module(cls: type) -> bool:
    """Whether ``cls`` is what its module holds at its qualname (not a redefined copy)."""
    found: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is cls


def workflow_method(name: str) -> tuple[type[Workflow[Any]], str] | None:
    """``(Workflow class, attribute)`` for ``"module.Class.method"``, or None.

    Only classes already imported are considered; the class's module is never
    imported for a document. When several imported classes carry one name
    (a class redefined by a test), the one its module holds wins, else the
    last defined. The attribute must be defined on the class (or a base).
    """
    owner, _, attribute = name.rpartition(".")
    if not owner or not attribute:
        return None
    matches = [
        cls for cls in _all_workflow_classes() if f"{cls.__module__}.{cls.__qualname__}" == owner
    ]
    if not matches:
        return None
    bound = [cls for cls in matches if _bound_in_module(cls)]
    cls = (bound or matches)[-1]
    if not any(attribute in vars(klass) for klass in cls.__mro__ if klass is not object):
        return None
    return cls, attribute
