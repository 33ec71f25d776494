"""The diagrams the admin inlines: an instance's pinned plan with its marks, a version's plan.

The drawing is :mod:`vertique_workflow.diagram` (``render_svg`` and
``instance_marks``); this module only turns failures into a message on the
page (a plan this node does not hold, an instance from before the decision
log), so a diagram never makes a page fail.
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from ..exceptions import WorkflowError

logger = logging.getLogger(__name__)


def _api() -> Any:
    try:
        from .. import diagram
    except ImportError:  # the diagram package is not installed in this build
        return None
    return diagram


def instance_svg(
    instance_id: Any, upto_sequence: int | None = None
) -> tuple[SafeString | None, str]:
    """(inline SVG, "") of where the instance stands (or stood after ``upto_sequence``),
    or (None, why not)."""
    api = _api()
    if api is None:
        return None, "The diagram package is not available."
    try:
        plan, marks = api.instance_marks(instance_id, upto_sequence=upto_sequence)
        return mark_safe(api.render_svg(plan, marks)), ""
    except WorkflowError as exc:
        return None, f"No diagram: {exc}"
    except Exception:  # a drawing bug must not take the page down
        logger.exception("drawing the diagram of instance %s failed", instance_id)
        return None, "The diagram could not be drawn (see the server log)."


def plan_svg(plan: Any, title: str | None = None) -> tuple[SafeString | None, str]:
    """(inline SVG, "") of a plan without marks, or (None, why not)."""
    api = _api()
    if api is None:
        return None, "The diagram package is not available."
    if plan is None:
        return None, "This node holds no plan of this version (code not deployed here)."
    try:
        return mark_safe(api.render_svg(plan, None, title=title)), ""
    except Exception:
        logger.exception("drawing the diagram of %s v%s failed", plan.id, plan.version)
        return None, "The diagram could not be drawn (see the server log)."
