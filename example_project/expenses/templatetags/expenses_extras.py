import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def tojson(value: Any) -> str:
    """Compact JSON for a table cell (autoescaped by the template).

    Non-ASCII text stays as it is ("Zürich", not "Z\\u00fcrich"): the page is UTF-8.
    """
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
