"""The SVG of a plan: one ``<g class="step ...">`` per step, one ``<g class="edge">`` per edge.

The output is a standalone ``<svg>`` element with the SVG namespace: valid
as a ``.svg`` file and inline-able in an HTML page. It holds no script and
no reference to anything outside itself (arrowheads are drawn, not
markers, so no element id is referenced either); its ``<style>`` selectors
are all under ``.vw-diagram``, so inlined in a page they style only the
diagram. The same plan and marks always give the same bytes: coordinates
are rounded and nothing depends on set or hash order.

Classes a page can style or query: ``step``, ``kind-<kind>``, ``current``,
``visited`` on steps; ``edge``, ``kind-<transition kind>``, ``back`` (a
loop) on edges; ``badge`` and ``status-<status>`` on branch badges.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..definitions.plan import Plan, Step
from .graph import format_duration
from .layout import Box, Layout, Route, layout
from .marks import BranchMark, Marks
from .text import (
    EDGE_LABEL_LIMIT,
    css_class,
    css_id,
    truncate,
    xml_attr,
    xml_text,
)

__all__ = ["STYLE", "render_svg"]

SVG_NS = "http://www.w3.org/2000/svg"

# label characters that fit in a box of each kind (the rest goes to the <title>)
_LABEL_LIMIT = {"decision": 15, "fork": 20, "join": 20, "end": 22, "fail": 22}
_GLYPH_KINDS = frozenset({"wait", "timer", "task", "call", "service"})
_DEFAULT_LABEL_LIMIT = 19
_GLYPH_LABEL_LIMIT = 16
_BADGES_SHOWN = 3
_BADGE_TITLE_IDS = 20

STYLE = """
.vw-diagram{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;font-size:12px}
.vw-diagram .background{fill:#fff}
.vw-diagram .step .shape{fill:#fff;stroke:#5f6b7a;stroke-width:1.5}
.vw-diagram .step .inner{fill:none;stroke:#5f6b7a;stroke-width:1}
.vw-diagram .step .label{fill:#1f2933}
.vw-diagram .step .caption{fill:#5f6b7a;font-size:10px}
.vw-diagram .step .glyph{fill:none;stroke:#5f6b7a;stroke-width:1.2}
.vw-diagram .kind-decision .shape{fill:#fffbea}
.vw-diagram .kind-wait .shape,.vw-diagram .kind-timer .shape{fill:#f5f7fa}
.vw-diagram .kind-task .shape{fill:#f5f7fa}
.vw-diagram .kind-fork .shape,.vw-diagram .kind-join .shape{fill:#3e4c59;stroke:#3e4c59}
.vw-diagram .kind-fork .label,.vw-diagram .kind-join .label{fill:#fff;font-size:11px}
.vw-diagram .kind-end .shape{stroke-width:3.5}
.vw-diagram .kind-fail .shape{stroke:#b42318;stroke-width:3}
.vw-diagram .kind-fail .glyph{stroke:#b42318;stroke-width:2}
.vw-diagram .visited .shape{fill:#e6f0fb;stroke:#2f6fb0}
.vw-diagram .visited.kind-fork .shape,.vw-diagram .visited.kind-join .shape{fill:#2f6fb0}
.vw-diagram .current .shape{fill:#fff1d6;stroke:#c2410c;stroke-width:3}
.vw-diagram .current.kind-fork .shape,.vw-diagram .current.kind-join .shape{fill:#c2410c}
.vw-diagram .current .label{font-weight:600}
.vw-diagram .edge path{fill:none;stroke:#7b8794;stroke-width:1.3}
.vw-diagram .edge .head{fill:#7b8794}
.vw-diagram .edge.kind-join path{stroke-dasharray:4 3}
.vw-diagram .edge.back path{stroke:#9a6700}
.vw-diagram .edge.back .head{fill:#9a6700}
.vw-diagram .edge-label{fill:#3e4c59;font-size:11px;paint-order:stroke;stroke:#fff}
.vw-diagram .edge-label{stroke-width:3px;stroke-linejoin:round}
.vw-diagram .badge rect{fill:#3e4c59}
.vw-diagram .badge text{fill:#fff;font-size:9px}
.vw-diagram .badge.status-waiting rect,.vw-diagram .badge.status-running rect{fill:#c2410c}
.vw-diagram .badge.status-retry-scheduled rect{fill:#9a6700}
.vw-diagram .badge.status-completed rect,.vw-diagram .badge.status-arrived rect{fill:#2f7d32}
.vw-diagram .badge.status-failed rect,.vw-diagram .badge.status-branch-failed rect{fill:#b42318}
""".strip()


def _n(value: float) -> str:
    """A coordinate: one decimal at most, no trailing zero (deterministic text)."""
    text = f"{round(value, 1):.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return "0" if text == "-0" else text


def _title(text: str) -> str:
    return f"<title>{xml_text(text)}</title>"


def _label_limit(kind: str) -> int:
    if kind in _GLYPH_KINDS:
        return _GLYPH_LABEL_LIMIT
    return _LABEL_LIMIT.get(kind, _DEFAULT_LABEL_LIMIT)


def _caption(step: Step) -> str:
    """The small second line of a box: what the step waits for or calls."""
    if step.kind == "wait":
        text = "wait " + ", ".join(step.signals)
        return text if step.timeout is None else f"{text} \u00b7 {format_duration(step.timeout)}"
    if step.kind == "timer":
        if step.delay is not None:
            return f"timer {format_duration(step.delay)}"
        return "timer until " + str(step.until_name or "").rsplit(".", 1)[-1]
    if step.kind == "task":
        title = step.task.title if step.task is not None else None
        return "task" if not title or title == step.id else f"task {title}"
    if step.kind == "call" and step.call is not None:
        version = "" if step.call.version is None else f" v{step.call.version}"
        return f"call {step.call.workflow}{version}"
    if step.kind == "service" and step.service is not None:
        return f"service {step.service.handler}"
    return ""


def _tooltip(step: Step) -> str:
    text = f"{step.id} ({step.kind})"
    caption = _caption(step)
    if caption:
        text += f": {caption}"
    if step.kind == "join" and step.join is not None:
        text += f": policy {step.join.policy}"
    if step.kind == "fail" and step.reason:
        text += f": {step.reason}"
    return text


def _glyph(kind: str, box: Box) -> str:
    """A small icon at the left of wait, timer and task boxes."""
    x, y = box.x + 10, box.y + box.h / 2
    if kind == "wait":  # an envelope
        return (
            f'<rect class="glyph" x="{_n(x)}" y="{_n(y - 5)}" width="14" height="10"/>'
            f'<path class="glyph" d="M{_n(x)} {_n(y - 5)}L{_n(x + 7)} {_n(y + 1)}'
            f'L{_n(x + 14)} {_n(y - 5)}"/>'
        )
    if kind == "timer":  # a clock
        cx = x + 7
        return (
            f'<circle class="glyph" cx="{_n(cx)}" cy="{_n(y)}" r="7"/>'
            f'<path class="glyph" d="M{_n(cx)} {_n(y - 4)}V{_n(y)}H{_n(cx + 3.5)}"/>'
        )
    if kind == "task":  # a person
        cx = x + 7
        return (
            f'<circle class="glyph" cx="{_n(cx)}" cy="{_n(y - 4)}" r="3"/>'
            f'<path class="glyph" d="M{_n(cx - 6)} {_n(y + 7)}Q{_n(cx)} {_n(y - 3)} '
            f'{_n(cx + 6)} {_n(y + 7)}"/>'
        )
    return ""


def _shape(step: Step, box: Box) -> str:
    x, y, w, h = box.x, box.y, box.w, box.h
    kind = step.kind
    rect = f'x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}"'
    if kind == "decision":
        middle = _n(y + h / 2)
        points = (
            f"{_n(box.cx)},{_n(y)} {_n(x + w)},{middle} {_n(box.cx)},{_n(y + h)} {_n(x)},{middle}"
        )
        return f'<polygon class="shape" points="{points}"/>'
    if kind in ("fork", "join"):
        return f'<rect class="shape" {rect} rx="3"/>'
    if kind in ("end", "fail"):
        circle = f'<circle class="shape" cx="{_n(box.cx)}" cy="{_n(y + 16)}" r="14"/>'
        if kind == "fail":
            cx, cy = box.cx, y + 16
            circle += (
                f'<path class="glyph" d="M{_n(cx - 5)} {_n(cy - 5)}L{_n(cx + 5)} {_n(cy + 5)}'
                f'M{_n(cx + 5)} {_n(cy - 5)}L{_n(cx - 5)} {_n(cy + 5)}"/>'
            )
        return circle
    if kind == "call":
        inner = f'x="{_n(x + 4)}" y="{_n(y + 4)}" width="{_n(w - 8)}" height="{_n(h - 8)}"'
        return f'<rect class="shape" {rect} rx="4"/><rect class="inner" {inner} rx="2"/>'
    if kind == "service":  # a box with a double right edge: the call leaves the database
        edge = f'<path class="glyph" d="M{_n(x + w - 8)} {_n(y)}V{_n(y + h)}"/>'
        return f'<rect class="shape" {rect} rx="4"/>' + edge
    radius = "10" if kind in ("wait", "timer", "task") else "4"
    return f'<rect class="shape" {rect} rx="{radius}"/>' + _glyph(kind, box)


def _texts(step: Step, box: Box) -> str:
    kind = step.kind
    label = xml_text(truncate(step.id, _label_limit(kind)))
    if kind in ("end", "fail"):
        return (
            f'<text class="label" x="{_n(box.cx)}" y="{_n(box.y + 45)}" '
            f'text-anchor="middle">{label}</text>'
        )
    if kind in ("fork", "join"):
        return (
            f'<text class="label" x="{_n(box.cx)}" y="{_n(box.y + 14)}" '
            f'text-anchor="middle">{label}</text>'
        )
    caption = _caption(step)
    cx = box.cx + (8 if kind in ("wait", "timer", "task") else 0)
    if not caption:
        return (
            f'<text class="label" x="{_n(cx)}" y="{_n(box.y + box.h / 2 + 4)}" '
            f'text-anchor="middle">{label}</text>'
        )
    caption_text = xml_text(truncate(caption, _label_limit(kind) + 6))
    return (
        f'<text class="label" x="{_n(cx)}" y="{_n(box.y + box.h / 2 - 2)}" '
        f'text-anchor="middle">{label}</text>'
        f'<text class="caption" x="{_n(cx)}" y="{_n(box.y + box.h / 2 + 12)}" '
        f'text-anchor="middle">{caption_text}</text>'
    )


def _badges(marks: list[BranchMark], box: Box) -> str:
    """Badges above a box: one per token, or one per status when many tokens stand there."""
    if not marks:
        return ""
    items: list[tuple[str, str, str]] = []  # (status, text, title)
    if len(marks) <= _BADGES_SHOWN:
        for mark in marks:
            items.append(
                (
                    mark.status,
                    f"{truncate(mark.branch_id, 12)} \u00b7 {mark.status}",
                    f"branch {mark.branch_id}: {mark.status}",
                )
            )
    else:
        by_status: dict[str, list[str]] = {}
        for mark in marks:
            by_status.setdefault(mark.status, []).append(mark.branch_id)
        for status, ids in sorted(by_status.items()):
            shown = ", ".join(ids[:_BADGE_TITLE_IDS])
            more = len(ids) - _BADGE_TITLE_IDS
            title = f"{len(ids)} branches {status}: {shown}" + (
                f" and {more} more" if more > 0 else ""
            )
            items.append((status, f"{status} \u00d7{len(ids)}", title))
    parts = []
    x = box.x
    y = box.y - 15
    for status, text, title in items:
        width = 8 + len(text) * 5.4
        parts.append(
            f'<g class="badge status-{css_class(status)}">{_title(title)}'
            f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(width)}" height="12" rx="6"/>'
            f'<text x="{_n(x + 4)}" y="{_n(y + 9)}">{xml_text(text)}</text></g>'
        )
        x += width + 3
    return "".join(parts)


def _step(step: Step, box: Box, marks: Marks, badges: list[BranchMark]) -> str:
    classes = ["step", f"kind-{step.kind}"]
    if step.id in marks.current:
        classes.append("current")
    if step.id in marks.visited:
        classes.append("visited")
    hit = f'x="{_n(box.x)}" y="{_n(box.y)}" width="{_n(box.w)}" height="{_n(box.h)}"'
    return (
        f'<g class="{" ".join(classes)}" data-step="{xml_attr(step.id)}" '
        f'id="step-{css_id(step.id)}">{_title(_tooltip(step))}'
        f'<rect class="hit" {hit} fill="none" stroke="none"/>'
        f"{_shape(step, box)}{_texts(step, box)}{_badges(badges, box)}</g>"
    )


def _path(route: Route) -> str:
    points = route.points
    if route.back:
        return "M" + "L".join(f"{_n(x)} {_n(y)}" for x, y in points)
    parts = [f"M{_n(points[0][0])} {_n(points[0][1])}"]
    # pairs (leave, arrive) are S-curves; arrive -> leave (through a virtual point) is straight
    for index in range(1, len(points)):
        (x1, y1), (x2, y2) = points[index - 1], points[index]
        if index % 2 == 1:
            middle = (y1 + y2) / 2
            parts.append(f"C{_n(x1)} {_n(middle)} {_n(x2)} {_n(middle)} {_n(x2)} {_n(y2)}")
        else:
            parts.append(f"L{_n(x2)} {_n(y2)}")
    return "".join(parts)


def _edge(route: Route) -> str:
    edge = route.edge
    classes = ["edge", *(f"kind-{kind}" for kind in edge.kinds)]
    if route.back:
        classes.append("back")
    x, y = route.points[-1]
    head = f"{_n(x - 4)},{_n(y - 7)} {_n(x + 4)},{_n(y - 7)} {_n(x)},{_n(y)}"
    title = f"{edge.source} \u2192 {edge.target}" + (f": {edge.label}" if edge.label else "")
    label = ""
    if edge.label:
        lx, ly = route.label_at
        label = (
            f'<text class="edge-label" x="{_n(lx)}" y="{_n(ly + 4)}" '
            f'text-anchor="{route.label_anchor}">'
            f"{xml_text(truncate(edge.label, EDGE_LABEL_LIMIT))}</text>"
        )
    return (
        f'<g class="{" ".join(classes)}" data-from="{xml_attr(edge.source)}" '
        f'data-to="{xml_attr(edge.target)}">{_title(title)}'
        f'<path d="{_path(route)}"/><polygon class="head" points="{head}"/>{label}</g>'
    )


def _by_step(marks: Iterable[BranchMark]) -> dict[str, list[BranchMark]]:
    found: dict[str, list[BranchMark]] = {}
    for mark in sorted(marks, key=lambda m: (m.step_id, m.branch_id, m.status)):
        found.setdefault(mark.step_id, []).append(mark)
    return found


def render_svg(plan: Plan, marks: Marks | None = None, *, title: str | None = None) -> str:
    """The diagram of ``plan`` as a standalone ``<svg>`` element (text).

    ``marks`` highlights the current and visited steps and puts branch
    badges on the steps tokens stand at; ``title`` is the picture's
    ``<title>`` (default: ``<id> version <n>``). The layout depends on the
    plan alone, so an instance's picture and its definition's have the
    same geometry.
    """
    marks = marks or Marks()
    drawn: Layout = layout(plan)
    badges = _by_step(marks.branches)
    width, height = _n(drawn.width), _n(drawn.height)
    heading = title if title is not None else f"{plan.id} version {plan.version}"
    parts = [
        f'<svg xmlns="{SVG_NS}" class="vw-diagram" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'data-workflow="{xml_attr(plan.id)}" data-version="{plan.version}">',
        _title(heading),
        f"<style>{STYLE}</style>",
        f'<rect class="background" width="{width}" height="{height}" fill="#fff"/>',
        '<g class="edges">',
        *(_edge(route) for route in drawn.routes),
        "</g>",
        '<g class="steps">',
        *(
            _step(step, drawn.boxes[step.id], marks, badges.get(step.id, []))
            for step in plan.steps.values()
        ),
        "</g>",
        "</svg>",
    ]
    return "\n".join(parts) + "\n"
