"""Small helpers over ``yt.yson`` (the official YSON library, with its C++ bindings).

The engine receives values either as YSON (with attribute-carrying wrapper types such as
``YsonInt64`` or ``YsonEntity``) or as JSON (plain Python). Everything below the HTTP layer works on
plain Python values; these helpers do the conversions in one place, and know the YSON corner cases
(``#`` is null, attributes ride on a value, ``%true`` booleans, unsigned integers).
"""

from __future__ import annotations

from typing import Any

import yt.yson as yson


def to_python(value: Any) -> Any:
    """Strip YSON wrapper types recursively: entity -> None, YsonMap -> dict, and so on."""
    if value is None or isinstance(value, yson.YsonEntity):
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, yson.YsonBoolean):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    if isinstance(value, dict):
        return {to_str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_python(v) for v in value]
    if isinstance(value, yson.YsonStringProxy):
        return yson.get_bytes(value)
    return value


def attributes_of(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and "$value" in value and set(value) <= {"$value", "$attributes", "$type"}:
        return dict(value.get("$attributes") or {})
    attrs = getattr(value, "attributes", None)
    return dict(attrs) if attrs else {}


def strip(value: Any) -> Any:
    """The value without attributes (also unwraps the JSON ``{"$value": ...}`` form)."""
    if isinstance(value, dict) and "$value" in value and set(value) <= {"$value", "$attributes", "$type"}:
        return value["$value"]
    return value


def with_attributes(value: Any, attributes: dict[str, Any]) -> Any:
    return yson.to_yson_type(value, attributes=attributes)


def to_str(value: Any) -> str:
    if value is None or isinstance(value, yson.YsonEntity):
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def type_name(value: Any) -> str:
    if value is None or isinstance(value, yson.YsonEntity):
        return "null"
    if isinstance(value, bool | yson.YsonBoolean):
        return "boolean"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str | bytes):
        return "string"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def dumps_text(value: Any) -> str:
    return yson.dumps(value, yson_format="text").decode("utf-8", errors="replace")


def loads_text(text: str) -> Any:
    return to_python(yson.loads(text.encode("utf-8")))


def json_to_python(value: Any) -> Any:
    """A value decoded from YT's JSON (``{"$value"; "$attributes"; "$type"}`` forms included)."""
    if isinstance(value, dict) and not ({"$value", "$attributes", "$type"} & set(value)):
        return {k: json_to_python(v) for k, v in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return to_python(yson.json_to_yson(value))
