"""Small helpers over ``yt.yson`` (the official YSON library, with its C++ bindings).

The engine receives values either as YSON (with attribute-carrying wrapper types such as
``YsonInt64`` or ``YsonEntity``) or as JSON (plain Python). Everything below the HTTP layer works on
plain Python values; these helpers do the conversions in one place, and know the YSON corner cases
(``#`` is null, attributes ride on a value, ``%true`` booleans, unsigned integers).

The checks here (:func:`checked_python`, :func:`check_key`, :func:`dumps_stored`) guard the node
tree: whatever it keeps must be written by YSON *and read back* at the next start, and must come
out of ``get`` again. YSON refuses integers outside int64/uint64, strings that are not Unicode
(a lone surrogate from JSON's ``"\\ud800"``) and map keys starting with ``$`` (reserved for
``$value``/``$attributes``), and its parser stops at 255 levels of nesting; Python's recursion
stops deeper trees from being read. A value that fails any of these is refused with the reason
*before* it reaches the tree. This module sits beside ``errors`` (neither imports the other), so
it raises :class:`InvalidValue` and the caller turns it into a YT error naming the object.
"""

from __future__ import annotations

from typing import Any

import yt.yson as yson

#: how deep the node tree may nest: the depth of a node below the root plus the nesting of its value
#: (or of an attribute's value below the node). ``get /`` answers the whole tree as one nested value,
#: so this also bounds what YSON must write and parse (its parser stops at 255 levels)
MAX_DEPTH = 128
#: deepest value the tree may store in one SQL row (YSON's parser reads at most 255 levels)
MAX_STORED_DEPTH = 250
INT64_MIN = -(1 << 63)
UINT64_MAX = (1 << 64) - 1


class InvalidValue(ValueError):
    """A value the node tree cannot keep; ``reason`` says why and where (a position like ``/a/0``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe to put in an error message: lone surrogates escaped (``\\ud800``), cut at ``limit``."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _where(position: tuple[Any, ...]) -> str:
    text = printable("".join(f"/{p}" for p in position), limit=100)
    return f" at {text}" if text else ""


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")  # repr escapes lone surrogates


def check_key(key: Any, position: tuple[Any, ...] = (), *, node_name: bool = False, kind: str = "map key") -> str:
    """A map key (or node name) YSON can write and read back, as ``str``; :class:`InvalidValue` if not.

    ``node_name``: the key becomes the name of a node in the tree, so it must not be empty (no
    path could address it). ``kind`` names the key in the error ("node name", "attribute name")."""
    name = to_str(key)
    if node_name and not name:
        raise InvalidValue(f"empty {kind}{_where(position)}: a node name cannot be empty (no path could name it)")
    if name.startswith("$"):
        raise InvalidValue(f"{kind} {_short(name)}{_where(position)} starts with \"$\", which is reserved "
                           "for $value, $attributes and $type")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValue(f"{kind} {_short(name)}{_where(position)} is not valid Unicode "
                           "(it holds a lone surrogate)") from None
    return name


def _check(value: Any, depth_left: int, position: tuple[Any, ...], node_keys: bool, limit: int) -> None:
    if isinstance(value, dict):
        if depth_left <= 0:
            raise InvalidValue(f"depth limit of {limit} exceeded")
        for key, item in value.items():
            name = check_key(key, position, node_name=node_keys)
            _check(item, depth_left - 1, (*position, name), node_keys, limit)
    elif isinstance(value, list | tuple):
        if depth_left <= 0:
            raise InvalidValue(f"depth limit of {limit} exceeded")
        for i, item in enumerate(value):
            _check(item, depth_left - 1, (*position, i), False, limit)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not INT64_MIN <= value <= UINT64_MAX:
            shown = str(int(value)) if value.bit_length() <= 128 else f"of {value.bit_length()} bits"
            raise InvalidValue(f"integer {shown}{_where(position)} is out of range [-2^63, 2^64-1]")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidValue(f"string{_where(position)} is not valid Unicode (it holds a lone surrogate)") from None


def checked_python(value: Any, max_depth: int = MAX_DEPTH, *, node_keys: bool = False,
                   limit: int = MAX_DEPTH) -> Any:
    """:func:`to_python` of a value the tree may keep, or :class:`InvalidValue` naming the reason.

    ``max_depth`` is the nesting the value may have (a scalar has 0, ``[1]`` has 1); ``limit`` is
    the tree-wide limit named in the error. ``node_keys``: maps reached from the top through maps
    become nodes, so their keys must be non-empty node names. Nothing deeper than ``max_depth`` is
    visited, so a value nested thousands of levels deep fails cleanly, not with a RecursionError."""
    _check(value, max_depth, (), node_keys, limit)
    return to_python(value)


def depth(value: Any) -> int:
    """Nesting of a plain value: 0 for a scalar, 1 + the deepest item for a list or map."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def dumps_stored(value: Any) -> str:
    """:func:`dumps_text` of a value the tree keeps; :class:`InvalidValue` if YSON could not write
    it or read it back (the last line of defence: commands check their input before this)."""
    _check(value, MAX_STORED_DEPTH, (), False, MAX_STORED_DEPTH)
    try:
        return dumps_text(value)
    except (yson.YsonError, UnicodeError, TypeError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidValue(f"YSON cannot write it: {first_line[:200]}") from None
