"""The code of the parcel workflow in docs/how-to-change-a-workflow-with-documents.md.

Its versions are documents (tests/documents/howto/parcel-v1.yaml and
parcel-v2.yaml); they name these callables by the names registered here.
The how-to shows this module verbatim (tests/test_howto_documents.py checks).
"""

from __future__ import annotations

from typing import Any

from vertique_workflow.definitions.documents import register_callable


@register_callable(name="parcels.pack")
def pack(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**state, "packed": True}


@register_callable(name="parcels.label")
def label(state: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {**state, "label": f"EU-{state['parcel']}"}
