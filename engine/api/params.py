"""Request parameters: typed access with YT-style errors, header and body decoding.

Parameters reach a command from three places (``X-YT-Parameters`` in the header format, the query
string, the body of a volatile command); these helpers give every handler the same checks and the
same error messages, so the command table stays one line of translation per command.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import yt.yson as yson

from .. import yson_util
from ..errors import ErrorCode, YtError
from .formats import parse_format
from .incoming import Incoming


def arg(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = params.get(name, default)
    return yson_util.to_python(value) if value is not None else default


def arg_path(params: dict[str, Any]) -> Any:
    if "path" not in params:
        raise YtError("Missing required parameter \"path\"", code=ErrorCode.INVALID_PARAMETER)
    return params["path"]


def arg_bool(params: dict[str, Any], name: str, default: bool = False) -> bool:
    value = arg(params, name)
    if value is None:
        return default
    if isinstance(value, str):
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise YtError(f"Parameter {name!r} must be a boolean, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return bool(value)


def arg_int(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = arg(params, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise YtError(f"Parameter {name!r} must be an integer, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def arg_str_list(params: dict[str, Any], name: str) -> list[str] | None:
    value = arg(params, name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise YtError(f"Parameter {name!r} must be a list of strings", code=ErrorCode.INVALID_PARAMETER)
    return value


def arg_tx(params: dict[str, Any]) -> str | None:
    value = arg(params, "transaction_id")
    if not value or value == "0-0-0-0":
        return None
    return str(value)


def arg_str(params: dict[str, Any], name: str) -> str:
    value = arg(params, name)
    if not isinstance(value, str) or not value:
        raise YtError(f"Missing required parameter {name!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def arg_rows(body: Any) -> list[Any]:
    return body if isinstance(body, list) else []


def query_value(text: str) -> Any:
    """Query-string parameters are text; integers and booleans are recognised as such."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


#: parameters whose JSON form ``{"$value": ..., "$attributes": ...}`` parse_format reads as it is
_FORMAT_PARAMETERS = frozenset({"input_format", "output_format"})
_SCALARS = (str, int, float, bool, type(None))


def _not_utf8(value: Any) -> bool:
    """Whether a parsed YSON value holds a string that is not UTF-8 (which no command can use)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, yson.YsonStringProxy):
            return True
        if isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        attributes = getattr(item, "attributes", None)
        if attributes:
            stack.append(dict(attributes))
    return False


def decode_header_value(raw: str, header_format: str) -> Any:
    data = raw.encode("latin-1")
    try:
        if header_format == "yson":
            value = yson.loads(data)
            if _not_utf8(value):
                raise ValueError("a string is not valid UTF-8")
            return value
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            value = json.loads(data.decode("utf-8"))  # NaN and friends, or the precise error
        if not isinstance(value, dict):
            return yson.json_to_yson(value)
        # scalars need no conversion; structures may carry YSON attributes in their JSON form
        return {k: v if isinstance(v, _SCALARS) or k in _FORMAT_PARAMETERS else yson.json_to_yson(v)
                for k, v in value.items()}
    except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed header
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise YtError(f"Malformed X-YT-Parameters header (expected {header_format}): {reason}",
                      code=ErrorCode.PROTOCOL_ERROR) from None


def encode_header_value(value: Any, header_format: str) -> str:
    """A response header's value in the request's header format (YSON text or JSON)."""
    if header_format == "yson":
        return yson.dumps(value, yson_format="text").decode()
    return json.dumps(value, separators=(",", ":"))


def header_format_of(request: Incoming) -> str:
    raw = request.headers.get("x-yt-header-format", "json")
    return parse_format(raw, default="json").name
