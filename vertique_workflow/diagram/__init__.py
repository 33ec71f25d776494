"""Workflow diagrams: a plan drawn as SVG, optionally marked with where an instance stands.

``render_svg(plan, marks)`` lays the plan out (layers from the start step,
loops as back arcs, fork branches side by side, each join below its
branches) and returns a standalone ``<svg>`` element: no script, no
external reference, the same bytes for the same input. ``instance_marks``
reads an instance's pinned plan and its current and visited steps through
the public operations. See docs/diagram.md.
"""

from __future__ import annotations

from .graph import Edge, plan_edges
from .layout import Box, Layout, layout
from .marks import BranchMark, Marks, instance_marks, marks_from_history
from .svg import render_svg

__all__ = [
    "Box",
    "BranchMark",
    "Edge",
    "Layout",
    "Marks",
    "instance_marks",
    "layout",
    "marks_from_history",
    "plan_edges",
    "render_svg",
]
