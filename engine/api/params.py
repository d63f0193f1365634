"""Request parameters: typed access with YT-style errors, header and body decoding.

Parameters reach a command from three places (``X-YT-Parameters`` in the header format, the query
string, the body of a volatile command); these helpers give every handler the same checks and the
same error messages, so the command table stays one line of translation per command.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import orjson
import yt.yson as yson
from starlette.requests import Request

from .. import yson_util
from ..errors import ErrorCode, YtError
from .formats import parse_format


def _p(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = params.get(name, default)
    return yson_util.to_python(value) if value is not None else default


def _path(params: dict[str, Any]) -> Any:
    if "path" not in params:
        raise YtError("Missing required parameter \"path\"", code=ErrorCode.INVALID_PARAMETER)
    return params["path"]


def _bool(params: dict[str, Any], name: str, default: bool = False) -> bool:
    value = _p(params, name)
    if value is None:
        return default
    if isinstance(value, str):
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise YtError(f"Parameter {name!r} must be a boolean, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return bool(value)


def _int(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = _p(params, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise YtError(f"Parameter {name!r} must be an integer, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def _str_list(params: dict[str, Any], name: str) -> list[str] | None:
    value = _p(params, name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise YtError(f"Parameter {name!r} must be a list of strings", code=ErrorCode.INVALID_PARAMETER)
    return value


def _tx(params: dict[str, Any]) -> str | None:
    value = _p(params, "transaction_id")
    if not value or value == "0-0-0-0":
        return None
    return str(value)


def _required_str(params: dict[str, Any], name: str) -> str:
    value = _p(params, name)
    if not isinstance(value, str) or not value:
        raise YtError(f"Missing required parameter {name!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def _rows(body: Any) -> list[Any]:
    return body if isinstance(body, list) else []


def _query_value(text: str) -> Any:
    """Query-string parameters are text; integers and booleans are recognised as such."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


#: parameters whose JSON form ``{"$value": ..., "$attributes": ...}`` parse_format reads as it is
_FORMAT_PARAMETERS = frozenset({"input_format", "output_format"})
_SCALARS = (str, int, float, bool, type(None))


def _decode_header_value(raw: str, header_format: str) -> Any:
    data = raw.encode("latin-1")
    try:
        if header_format == "yson":
            return yson.loads(data)
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            value = json.loads(data.decode("utf-8"))  # NaN and friends, or the precise error
        if not isinstance(value, dict):
            return yson.json_to_yson(value)
        # scalars need no conversion; structures may carry YSON attributes in their JSON form
        return {k: v if isinstance(v, _SCALARS) or k in _FORMAT_PARAMETERS else yson.json_to_yson(v)
                for k, v in value.items()}
    except Exception:  # noqa: BLE001 - any parse failure is a malformed header
        raise YtError(f"Malformed X-YT-Parameters header (expected {header_format})",
                      code=ErrorCode.PROTOCOL_ERROR) from None


def _header_format(request: Request) -> str:
    raw = request.headers.get("x-yt-header-format", "json")
    return parse_format(raw, default="json").name


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        if encoding in ("gzip", "deflate"):
            # YT clients label zlib streams "gzip"; wbits=47 accepts both zlib and gzip headers
            return zlib.decompress(body, zlib.MAX_WBITS | 32)
        if encoding == "br":
            import brotli

            return brotli.decompress(body)
    except Exception as exc:  # noqa: BLE001
        raise YtError(f"Cannot decode request body with Content-Encoding {encoding!r}: {exc}",
                      code=ErrorCode.PROTOCOL_ERROR) from None
    raise YtError(f"Unsupported Content-Encoding {encoding!r}", code=ErrorCode.PROTOCOL_ERROR)

