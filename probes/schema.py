"""A small JSON Schema validator for probe replies and tool-call arguments.

Golden answers are tiny objects, so the subset that OpenAI tool ``parameters`` and
structured-output schemas use in practice is enough: ``type`` (one or a list), ``enum``,
``const``, ``properties``, ``required``, ``additionalProperties`` (boolean or schema),
``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``,
``minimum``/``maximum``. Annotations (``description``, ``title``, ``default``) are ignored;
any other keyword is rejected when the golden set is loaded, so a schema never silently
checks less than it says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

_ANNOTATIONS: Final = frozenset({"description", "title", "default", "examples", "$schema"})
KEYWORDS: Final = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
    }
)
_TYPES: Final = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})


class SchemaError(ValueError):
    """The schema itself uses something this validator does not support."""


def check_schema(schema: Any, where: str = "schema") -> None:
    """Raise :class:`SchemaError` naming the place of the first unsupported construct."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{where}: a schema is a mapping")
    unknown = set(schema) - KEYWORDS - _ANNOTATIONS
    if unknown:
        raise SchemaError(f"{where}: unsupported keywords {sorted(unknown)}")
    types = schema.get("type", [])
    for name in [types] if isinstance(types, str) else types:
        if name not in _TYPES:
            raise SchemaError(f"{where}.type: unknown type {name!r}")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as exc:
            raise SchemaError(f"{where}.pattern: {exc}") from None
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.properties.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            check_schema(schema[key], f"{where}.{key}")


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def errors(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``path: reason`` lines (empty when valid)."""
    found: list[str] = []
    if "type" in schema:
        wanted = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        actual = _type_of(value)
        if actual not in wanted and not (actual == "integer" and "number" in wanted):
            return [f"{path}: expected {'/'.join(wanted)}, got {actual}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: expected {schema['const']!r}")
    if isinstance(value, dict):
        found += _object_errors(value, schema, path)
    elif isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            found.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{path}: more than {schema['maxItems']} items")
        if isinstance(schema.get("items"), Mapping):
            for i, item in enumerate(value):
                found += errors(item, schema["items"], f"{path}[{i}]")
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            found.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            found.append(f"{path}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{path}: does not match {schema['pattern']!r}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{path}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{path}: above {schema['maximum']}")
    return found


def _object_errors(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    found = [f"{path}: missing {key!r}" for key in schema.get("required", ()) if key not in value]
    properties: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            found += errors(item, properties[key], f"{path}.{key}")
        elif extra is False:
            found.append(f"{path}: unexpected key {key!r}")
        elif isinstance(extra, Mapping):
            found += errors(item, extra, f"{path}.{key}")
    return found
