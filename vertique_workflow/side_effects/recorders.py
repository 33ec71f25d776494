"""The recorder seam: which recorder writes which kind of side effect, in the segment.

``record`` is called by the segment (``executor/effects.py``) with the
side-effect effects of one transition, after the timers, tasks and branch
tokens were written and before the instance row: it claims each dispatch
key in ``workflow_dedup`` (kind ``DISPATCH``, namespace the workflow and
branch -- the reference keeps dispatch dedup in the engine, not in the
recorder) and hands the effects whose key was new to the recorder of their
kind, grouped in one batch per kind so a fan-out of services is one insert.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from ..conf import workflow_settings
from ..engine.effects import EmitEvent, RecordSideEffect
from ..engine.transition import mark_step
from ..exceptions import NonRetryable

__all__ = [
    "MISSING_RECORDER",
    "RecordBatch",
    "SideEffectRecorder",
    "installed_recorders",
    "record",
    "recorder_for",
    "reset_recorders",
]

MISSING_RECORDER = "SIDE_EFFECT_RECORDER_MISSING"
EVENT_KIND = "event"
DISPATCH_DEDUP_KIND = "DISPATCH"


@dataclass(frozen=True)
class RecordBatch:
    """What a recorder is handed: one transition's effects of its kind, and whose they are.

    ``effects`` are ``RecordSideEffect`` (or, for the ``event`` kind,
    ``EmitEvent``) in the order the drive asked for them. ``context`` is the
    durable context of the drive (stored with a dispatch, so its delivery
    can bind it again).
    """

    kind: str
    workflow_id: Any
    command_id: int | None
    definition_id: str
    definition_version: int
    effects: tuple[Any, ...]
    context: dict[str, Any] | None = None

    def dispatches(self) -> list[dict[str, Any]]:
        """The batch's ``service`` dispatches as plain JSON rows (what a service recorder keeps).

        The one shape both service recorders hand on: the outbox's row and
        the Django task's arguments.
        """
        return [
            {
                "workflow_id": str(self.workflow_id),
                "step_id": effect.step_id,
                "dispatch_key": effect.dispatch_key,
                "handler": effect.payload["handler"],
                "request": effect.payload.get("request"),
                "policy": effect.payload.get("policy") or {},
                "branch_token_id": None
                if effect.branch_token_id is None
                else str(effect.branch_token_id),
                "fork_step_id": effect.fork_step_id,
                "branch_id": effect.branch_id,
                "context": self.context,
            }
            for effect in self.effects
        ]


@runtime_checkable
class SideEffectRecorder(Protocol):
    """A durable hand-off of side effects of one ``kind``, run in the segment's transaction.

    ``record`` must write through the current Django connection of the
    workflow database (``vertique_workflow.store``), never commit, and
    raise to fail the transition (the segment rolls back and its command is
    retried). It must not call the outside world: delivery happens after
    the commit.
    """

    kind: str

    def record(self, batch: RecordBatch) -> None: ...


_lock = threading.Lock()
_recorders: dict[str, SideEffectRecorder] | None = None


def installed_recorders() -> dict[str, SideEffectRecorder]:
    """The recorders of ``RECORDERS``, by kind (built once per process and settings)."""
    global _recorders
    with _lock:
        if _recorders is None:
            _recorders = _build(workflow_settings.RECORDERS)
        return _recorders


def _build(paths: Sequence[str]) -> dict[str, SideEffectRecorder]:
    built: dict[str, SideEffectRecorder] = {}
    for path in paths:
        try:
            factory = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"VERTIQUE_WORKFLOW['RECORDERS']: cannot import {path!r}: {exc}"
            ) from exc
        recorder = factory()
        kind = getattr(recorder, "kind", None)
        if not isinstance(kind, str) or not callable(getattr(recorder, "record", None)):
            raise ImproperlyConfigured(
                f"VERTIQUE_WORKFLOW['RECORDERS']: {path!r} is not a side-effect recorder "
                "(it needs a str kind and a record(batch) method)"
            )
        if kind in built:
            raise ImproperlyConfigured(
                f"VERTIQUE_WORKFLOW['RECORDERS']: two recorders of kind {kind!r}"
            )
        built[kind] = recorder
    return built


def recorder_for(kind: str) -> SideEffectRecorder | None:
    """The installed recorder of ``kind``, or None."""
    return installed_recorders().get(kind)


def reset_recorders(**_: Any) -> None:
    """Forget the built recorders (settings changed; tests)."""
    global _recorders
    with _lock:
        _recorders = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "VERTIQUE_WORKFLOW":
        reset_recorders()


setting_changed.connect(_on_setting_changed)


def dispatch_namespace(workflow_id: Any, branch_token_id: Any) -> str:
    """The dedup namespace of a dispatch: the workflow, and the branch when in one."""
    if branch_token_id is None:
        return str(workflow_id)
    return f"{workflow_id}/{branch_token_id}"


def record(
    workflow_id: Any,
    command_id: int | None,
    definition_id: str,
    definition_version: int,
    effects: Sequence[Any],
    context: dict[str, Any] | None = None,
) -> None:
    """Run the recorders for the side-effect ``effects`` of one transition (in its transaction).

    A dispatch whose key an earlier committed transition of the same
    workflow and branch already claimed is skipped (recorded once). A
    required effect with no recorder of its kind raises ``NonRetryable``
    ``SIDE_EFFECT_RECORDER_MISSING`` naming the kind and the step. The
    ``EmitEvent`` effects go to ``events.emit``: recorded when an ``event``
    recorder is installed, sent as ``workflow_event`` after the commit when
    it has receivers.
    """
    from ..store import dedup
    from ..store.definitions import DEFAULT_SCOPE

    grouped: dict[str, list[Any]] = {}
    emitted: list[EmitEvent] = []
    for effect in effects:
        if isinstance(effect, EmitEvent):
            emitted.append(effect)
            continue
        assert isinstance(effect, RecordSideEffect)
        if recorder_for(effect.kind) is None:
            if not effect.required:
                continue
            missing = NonRetryable(
                MISSING_RECORDER,
                f"step {effect.step_id!r} records a {effect.kind!r} side effect and no "
                f"recorder of that kind is installed (VERTIQUE_WORKFLOW['RECORDERS'])",
            )
            mark_step(missing, effect.step_id)
            raise missing
        namespace = dispatch_namespace(workflow_id, effect.branch_token_id)
        if not dedup.claim(
            DISPATCH_DEDUP_KIND,
            DEFAULT_SCOPE,
            namespace,
            effect.dispatch_key,
            workflow_id,
            effect.dispatch_key,
            {"stepId": effect.step_id, "kind": effect.kind},
        ):
            continue  # recorded by an earlier transition: dispatch dedup
        grouped.setdefault(effect.kind, []).append(effect)
    if emitted:  # recorded (when installed) and signalled after commit (when heard)
        from .events import emit

        emit(emitted, workflow_id, command_id, definition_id, definition_version)
    for kind, batch in grouped.items():
        recorder = recorder_for(kind)
        assert recorder is not None
        recorder.record(
            RecordBatch(
                kind,
                workflow_id,
                command_id,
                definition_id,
                definition_version,
                tuple(batch),
                context,
            )
        )
