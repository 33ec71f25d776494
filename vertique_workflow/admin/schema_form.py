"""Form fields from a JSON schema: the decision forms of the task pages and the inbox.

Why a small translator and not a library: the decisions' payload schemas
are mostly flat objects of strings, numbers, booleans and enums, and an
operator deciding a task should get real fields (a checkbox, a choice)
rather than hand-written JSON. Anything richer (nested objects, arrays,
``oneOf``, a property of several types) gets a JSON textarea instead; in
both cases the assembled payload is checked against the whole schema before
anything is recorded, so a keyword the fields do not model (``pattern``,
``format``, ``additionalProperties``) is still enforced -- by the same
check ``complete_task`` runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import forms

from ..exceptions import WorkflowValidationError
from ..payloads import check_schema

# the keywords a property may carry and still be a plain field (the whole
# payload is checked against the schema afterwards, so unmodelled ones such
# as "pattern" are enforced there)
_FIELD_KEYWORDS = {
    "type",
    "enum",
    "title",
    "description",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "examples",
}
_OBJECT_KEYWORDS = {
    "type",
    "properties",
    "required",
    "title",
    "description",
    "additionalProperties",
    "$schema",
    "$id",
}
_SIMPLE_TYPES = {"string", "integer", "number", "boolean"}
FIELD_PREFIX = "payload__"
JSON_FIELD = "payload_json"


def parse_json(text: str) -> Any:
    """JSON text to a value; NaN and Infinity are refused (PostgreSQL's jsonb has neither).

    Raises ``ValueError`` with a message naming the line and column.
    """

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None


class JSONTextField(forms.CharField):
    """A textarea holding JSON; empty means ``None`` (no payload)."""

    widget = forms.Textarea(attrs={"rows": 8, "cols": 80, "spellcheck": "false"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("strip", True)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parse_json(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="json") from None


def _simple_property(schema: Any) -> bool:
    if not isinstance(schema, dict) or not set(schema) <= _FIELD_KEYWORDS:
        return False
    if "enum" in schema:
        values = schema["enum"]
        return (
            isinstance(values, list)
            and bool(values)
            and all(v is None or isinstance(v, str | int | float | bool) for v in values)
        )
    return schema.get("type") in _SIMPLE_TYPES


def simple_object(schema: Any) -> bool:
    """Whether ``schema`` is a flat object whose every property is one plain field."""
    if not isinstance(schema, dict) or not set(schema) <= _OBJECT_KEYWORDS:
        return False
    if schema.get("type", "object") != "object":
        return False
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    if not isinstance(properties, dict) or not isinstance(required, list):
        return False
    if any(name not in properties for name in required):  # a required field no form can give
        return False
    return all(isinstance(n, str) and _simple_property(p) for n, p in properties.items())


class EnumField(forms.ChoiceField):
    """A choice among JSON values: the option values are their JSON text."""

    def __init__(self, values: list[Any], **kwargs: Any) -> None:
        choices = [(json.dumps(v), str(v)) for v in values]
        if not kwargs.get("required", True):
            choices.insert(0, ("", "---------"))
        super().__init__(choices=choices, **kwargs)

    def clean(self, value: Any) -> Any:
        text = super().clean(value)
        return None if text in ("", None) else json.loads(text)


def _field(schema: dict[str, Any], required: bool, label: str) -> forms.Field:
    common: dict[str, Any] = {
        "required": required,
        "label": schema.get("title") or label,
        "help_text": schema.get("description") or "",
    }
    if "enum" in schema:
        return EnumField(list(schema["enum"]), **common)
    kind = schema["type"]
    if kind == "boolean":
        # a checkbox always gives a value: unchecked is false, never "missing"
        common["required"] = False
        return forms.BooleanField(initial=schema.get("default") is True, **common)
    bounds: dict[str, Any] = {}
    for key, arg in (("minimum", "min_value"), ("maximum", "max_value")):
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            bounds[arg] = value
    if kind == "integer":
        return forms.IntegerField(**bounds, **common)
    if kind == "number":
        return forms.FloatField(**bounds, **common)
    lengths = {
        arg: schema[key]
        for key, arg in (("minLength", "min_length"), ("maxLength", "max_length"))
        if isinstance(schema.get(key), int) and not isinstance(schema.get(key), bool)
    }
    # strip=False: the schema, not the form, decides whether spaces matter
    return forms.CharField(strip=False, **lengths, **common)


@dataclass(frozen=True)
class PayloadSpec:
    """How a form asks for a payload: fields (a flat object schema) or a JSON textarea."""

    schema: dict[str, Any] | None
    properties: tuple[str, ...]
    as_fields: bool

    @classmethod
    def of(cls, schema: Any) -> PayloadSpec:
        if schema is not None and not isinstance(schema, dict):
            schema = None
        if schema is not None and simple_object(schema):
            return cls(schema, tuple((schema.get("properties") or {}).keys()), True)
        return cls(schema, (), False)

    def add_fields(self, form: forms.Form) -> None:
        """Add the payload's fields (or its textarea) to ``form``."""
        if not self.as_fields:
            help_text = (
                "A JSON value checked against the schema shown."
                if self.schema is not None
                else "Optional: a JSON value (empty: no payload)."
            )
            form.fields[JSON_FIELD] = JSONTextField(
                label="Payload (JSON)", required=False, help_text=help_text
            )
            return
        assert self.schema is not None
        required = set(self.schema.get("required") or [])
        properties = self.schema.get("properties") or {}
        for name in self.properties:
            form.fields[FIELD_PREFIX + name] = _field(properties[name], name in required, name)

    def payload(self, cleaned: dict[str, Any]) -> Any:
        """The payload from a form's cleaned data (empty optional fields are left out)."""
        if not self.as_fields:
            return cleaned.get(JSON_FIELD)
        payload = {}
        for name in self.properties:
            value = cleaned.get(FIELD_PREFIX + name)
            if value is None or (value == "" and not self._required(name)):
                continue  # an optional field left empty: absent from the payload
            payload[name] = value
        return payload

    def _required(self, name: str) -> bool:
        return name in set((self.schema or {}).get("required") or [])

    def check(self, payload: Any, what: str) -> str | None:
        """The schema's refusal of ``payload`` as a message, or None when it passes."""
        if self.schema is None:
            return None
        try:
            check_schema(self.schema, payload, what)
        except WorkflowValidationError as exc:
            return str(exc)
        return None

    def error_field(self) -> str | None:
        """Where a schema refusal is shown: the textarea, or the whole form."""
        return None if self.as_fields else JSON_FIELD
