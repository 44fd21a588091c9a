"""JSON Schemas in requests: tool parameters and ``json_schema`` response formats.

:func:`check_schema` refuses a schema that is not a well-formed JSON Schema (wrong keyword
types, unknown ``type`` names). :func:`strict_schema` applies OpenAI's strict-mode rules:
every object lists all its properties as required and forbids others
(``additionalProperties: false`` is added, a contradicting value refused), and each schema's
keywords are written type first, in the order the DeepSeek templates use.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dsi.recipe.errors import RequestError

MAX_TOOL_NAME = 128  # characters, as deepseek-recipe allows (OpenAI allows 64)
TOOL_NAME_RE = re.compile(rf"[a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME}}}")
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
STRING_FORMATS = frozenset(
    {"email", "hostname", "ipv4", "ipv6", "uuid", "date-time", "date", "time", "duration"}
)

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")
_INTEGER_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRING_KEYWORDS = ("description", "title", "pattern", "format", "$ref", "$schema", "$id")

# Strict mode: keyword order after "type", per type (deepseek-recipe's typed schema model).
_STRICT_ORDER = {
    "object": ("properties", "additionalProperties", "required", "description"),
    "array": ("items", "description"),
    "string": ("description", "pattern", "format", "enum"),
    "number": ("description", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "integer": ("description", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "boolean": ("description",),
    "null": ("description",),
}


class SchemaError(ValueError):
    """What is wrong with a schema, and where (``properties.a.type``)."""


def check_tool_name(name: str, param: str) -> None:
    if not TOOL_NAME_RE.fullmatch(name):
        raise RequestError(
            400,
            f"Invalid '{param}': string does not match pattern. Expected a string that "
            f"matches the pattern '^[a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME}}}$'.",
            param=param,
        )


def check_parameters(schema: Any, tool: str, param: str) -> None:
    """Tool parameters: a well-formed JSON Schema whose root is ``type: "object"``."""
    try:
        check_schema(schema)
    except SchemaError as exc:
        raise RequestError(400, f"Invalid schema for function '{tool}': {exc}", param=param) from None
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind != "object":
        raise RequestError(
            400,
            f"Invalid schema for function '{tool}': schema must be a JSON Schema of "
            f"'type: \"object\"', got 'type: {_show(kind)}'.",
            param=param,
        )


def check_schema(schema: Any, where: str = "") -> None:
    """Raise SchemaError unless ``schema`` is a boolean or a well-formed schema object."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f'{_at(where)}{_show(schema)} is not of types "boolean", "object"')
    if "type" in schema:
        _check_type(schema["type"], where + ".type")
    for key in _SCHEMA_MAPS:
        if key in schema:
            value = _typed(schema, key, dict, "object", where)
            for name, sub in value.items():
                check_schema(sub, f"{where}.{key}.{name}")
    for key in _SCHEMA_LISTS:
        if key in schema:
            value = _typed(schema, key, list, "array", where)
            if not value:
                raise SchemaError(f"{_at(where + '.' + key)}[] has less than 1 item")
            for i, sub in enumerate(value):
                check_schema(sub, f"{where}.{key}[{i}]")
    for key in _SCHEMA_ONE:
        if key in schema:
            check_schema(schema[key], f"{where}.{key}")
    if "required" in schema:
        req = _typed(schema, "required", list, "array", where)
        if not all(isinstance(r, str) for r in req):
            raise SchemaError(f"{_at(where + '.required')}{_show(req)} must contain only strings")
        if len(set(req)) != len(req):
            raise SchemaError(f"{_at(where + '.required')}{_show(req)} has non-unique elements")
    if "enum" in schema:
        _typed(schema, "enum", list, "array", where)
    for key in _INTEGER_KEYWORDS:
        if key in schema and (
            not isinstance(schema[key], int) or isinstance(schema[key], bool) or schema[key] < 0
        ):
            raise SchemaError(f"{_at(where + '.' + key)}{_show(schema[key])} is not a non-negative integer")
    for key in _NUMBER_KEYWORDS:
        if key in schema and (not isinstance(schema[key], int | float) or isinstance(schema[key], bool)):
            raise SchemaError(f'{_at(where + "." + key)}{_show(schema[key])} is not of type "number"')
    for key in _STRING_KEYWORDS:
        if key in schema:
            _typed(schema, key, str, "string", where)


def _check_type(kind: Any, where: str) -> None:
    """``type``: a JSON type name, or a non-empty list of distinct ones."""
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds or len({json.dumps(k) for k in kinds}) != len(kinds):
        raise SchemaError(f"{_at(where)}{_show(kind)} is not a non-empty list of distinct JSON Schema types")
    for k in kinds:
        if not isinstance(k, str) or k not in JSON_TYPES:
            raise SchemaError(f"{_at(where)}{_show(k)} is not a JSON Schema type")


def strict_schema(schema: Any, where: str = "", empty_object_ok: bool = True) -> Any:
    """``schema`` under strict-mode rules (see the module docstring); raises SchemaError.
    ``empty_object_ok``: the root may be an object without properties (a tool's parameters);
    a nested one never may, as in deepseek-recipe."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{_at(where)}one of `type`, `anyOf`, `$ref` field is required")
    if "$ref" in schema:
        return {"$ref": schema["$ref"], **_rest(schema, ("$ref", "description"))}
    if "anyOf" in schema:
        out: dict[str, Any] = {
            "anyOf": [strict_schema(s, f"{where}.anyOf[{i}]", False) for i, s in enumerate(schema["anyOf"])]
        }
        return {**out, **_pick(schema, ("description",)), **_rest(schema, ("anyOf", "description"))}
    kind = schema.get("type")
    if kind is None:
        raise SchemaError(f"{_at(where)}one of `type`, `anyOf`, `$ref` field is required")
    main = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    order = _STRICT_ORDER[main]
    out = {"type": kind}
    if main == "object":
        props = schema.get("properties", {})
        if not props and not empty_object_ok:
            raise SchemaError("An object with no properties is not allowed.")
        if schema.get("additionalProperties", False) is not False:
            raise SchemaError("additionalProperties should not be true")
        required = schema.get("required", list(props))
        if len(set(required)) != len(required):
            raise SchemaError(f"Duplicate required property '{_first_duplicate(required)}'")
        if set(required) != set(props):
            raise SchemaError("Required properties must match all properties in the object")
        fields = {
            "properties": {
                name: strict_schema(sub, f"{where}.properties.{name}", False) for name, sub in props.items()
            },
            "additionalProperties": False,
            "required": list(props),
        }
    elif main == "array" and "items" in schema:
        fields = {"items": strict_schema(schema["items"], f"{where}.items", False)}
    else:
        fields = {}
    if main == "string" and "enum" in schema:
        _check_string_enum(schema["enum"], kind, where)
    for key in order:
        if key in fields:
            out[key] = fields[key]
        elif key in schema:
            out[key] = schema[key]
    return {**out, **_rest(schema, ("type", *order))}


def _check_string_enum(values: Any, kind: Any, where: str) -> None:
    """A strict string schema's ``enum`` lists strings (and null when the type allows it)."""
    nullable = isinstance(kind, list) and "null" in kind
    for value in values if isinstance(values, list) else []:
        if not isinstance(value, str) and not (value is None and nullable):
            raise SchemaError(f"{_at(where + '.enum')}{_show(value)} is not a string")


def _rest(schema: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """Keywords the strict model has no slot for: kept, after the known ones."""
    return {k: v for k, v in schema.items() if k not in known}


def _pick(schema: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: schema[k] for k in keys if k in schema}


def _typed(schema: dict[str, Any], key: str, kind: type, name: str, where: str) -> Any:
    value = schema[key]
    if not isinstance(value, kind):
        raise SchemaError(f'{_at(where + "." + key)}{_show(value)} is not of type "{name}"')
    return value


def _first_duplicate(items: list[Any]) -> Any:
    seen: set[Any] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _at(where: str) -> str:
    return f"{where.lstrip('.')}: " if where else ""


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
