"""Input and output formats of the HTTP API: YSON and JSON, structured and tabular.

YT names a format as a string with attributes, e.g. ``<format=text>yson`` or
``{"$value": "json", "$attributes": {"encode_utf8": false}}``. *Structured* data is one value (the
result of ``get``, the body of ``set``); *tabular* data is a stream of rows (a YSON list fragment,
or one JSON object per line).

The subtle part is JSON's ``encode_utf8`` (true by default in YT): strings travel as if each byte
of their UTF-8 form were one Unicode code point, so the official client encodes and decodes that
way. We honour it on output, and on input we undo it only when the text really is such an
encoding (a clean UTF-8 round-trip), so clients that send plain JSON keep working.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
import yt.yson as yson

from .. import yson_util
from ..errors import ErrorCode, YtError


@dataclass(frozen=True)
class Format:
    name: str
    attributes: dict[str, Any]

    @property
    def encode_utf8(self) -> bool:
        return bool(self.attributes.get("encode_utf8", True))

    @property
    def yson_format(self) -> str:
        return str(self.attributes.get("format", "binary"))


def parse_format(raw: Any, default: str = "yson") -> Format:
    if raw is None or raw == "":
        return Format(default, {})
    if type(raw) is str and raw in ("json", "yson"):
        return Format(raw, {})
    if type(raw) is dict and "$value" in raw:
        # the JSON form of an attributed format, as JSON parameters carry it
        name, attrs = raw["$value"], raw.get("$attributes") or {}
        if name in ("json", "yson") and type(attrs) is dict:
            return Format(name, yson_util.to_python(attrs))
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str) and raw.lstrip().startswith("<"):
        try:
            raw = yson.loads(raw.encode("utf-8"))
        except Exception:  # noqa: BLE001 - any parse failure is the user's malformed format
            raise YtError(f"Malformed format specification {raw!r}", code=ErrorCode.INVALID_PARAMETER) from None
    attrs = yson_util.to_python(yson_util.attributes_of(raw))
    name = yson_util.to_str(yson_util.strip(raw))
    if name not in ("yson", "json"):
        raise YtError(f"Unsupported format {name!r}: reptables speaks \"yson\" and \"json\"",
                      code=ErrorCode.INVALID_PARAMETER)
    return Format(name, attrs if isinstance(attrs, dict) else {})


def _undo_utf8_encoding(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value
    if isinstance(value, dict):
        return {_undo_utf8_encoding(k): _undo_utf8_encoding(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_undo_utf8_encoding(v) for v in value]
    return value


def _apply_utf8_encoding(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8").decode("latin-1")
    if isinstance(value, dict):
        return {_apply_utf8_encoding(k): _apply_utf8_encoding(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_apply_utf8_encoding(v) for v in value]
    return value


def _json_error(exc: Exception, what: str) -> YtError:
    return YtError(f"Malformed JSON in {what}: {exc}", code=ErrorCode.PROTOCOL_ERROR)


def load_rows(data: bytes, fmt: Format) -> list[Any]:
    """Parse tabular input into a list of rows (dicts)."""
    if fmt.name == "yson":
        try:
            rows = list(yson.loads(data, yson_type="list_fragment", always_create_attributes=False))
        except Exception as exc:  # noqa: BLE001 - the YSON parser raises several types
            raise YtError(f"Malformed YSON in request body: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
        return rows
    body = data.strip()
    if not body.startswith(b"[") and b"\n\n" not in body:
        # JSON lines without blank lines: one parse of the whole body as a JSON list
        try:
            rows = orjson.loads(b"[" + body.replace(b"\n", b",") + b"]") if body else []
        except orjson.JSONDecodeError:
            pass  # the careful path below finds and names the fault
        else:
            return _json_rows(rows, fmt, plain=_plain_rows(body, rows))
    try:
        text = data.decode("utf-8", errors="strict") if data else ""
    except UnicodeDecodeError as exc:
        raise YtError(f"Request body is not valid UTF-8 JSON: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise _json_error(exc, "request body") from None
        rows = parsed
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            # one parse of the whole body is several times faster than one per line
            rows = orjson.loads("[" + ",".join(lines) + "]")
        except orjson.JSONDecodeError:
            # the standard parser line by line: exact error positions, and NaN/Infinity accepted
            rows = []
            for n, line in enumerate(lines, 1):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise _json_error(exc, f"request body line {n}") from None
    return _json_rows(rows, fmt, plain=False)


def _plain_rows(body: bytes, rows: list[Any]) -> bool:
    """Whether every row is a flat map with no ``$`` keys, judged from the bytes (no per-row work):
    exactly one ``{`` per row and no ``[`` means no nested values; a string holding one of these
    characters just sends the batch to the per-row check."""
    return b"[" not in body and b'"$' not in body and body.count(b"{") == len(rows)


def _json_rows(rows: list[Any], fmt: Format, plain: bool) -> list[Any]:
    if fmt.encode_utf8:
        rows = [_undo_utf8_encoding(r) for r in rows]
    if plain:
        return rows
    convert = yson_util.json_to_python
    return [r if isinstance(r, dict) and not _needs_conversion(r) else convert(r) for r in rows]


def _needs_conversion(row: dict[str, Any]) -> bool:
    """Rows of plain scalars (the usual case) need no YSON-from-JSON conversion."""
    for key, value in row.items():
        if key in ("$value", "$attributes", "$type") or isinstance(value, dict | list):
            return True
    return False


def dump_rows(rows: list[Any], fmt: Format) -> bytes:
    if fmt.name == "yson":
        return yson.dumps(rows, yson_type="list_fragment", yson_format=fmt.yson_format)
    out = []
    for row in rows:
        value = _apply_utf8_encoding(row) if fmt.encode_utf8 else row
        out.append(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(out) + ("\n" if out else "")).encode("utf-8")


def load_structured(data: bytes, fmt: Format) -> Any:
    if fmt.name == "yson":
        try:
            return yson.loads(data)
        except Exception as exc:  # noqa: BLE001
            raise YtError(f"Malformed YSON in request body: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
    try:
        value = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _json_error(exc, "request body") from None
    if fmt.encode_utf8:
        value = _undo_utf8_encoding(value)
    return yson.json_to_yson(value)


def dump_structured(value: Any, fmt: Format) -> bytes:
    if fmt.name == "yson":
        return yson.dumps(value, yson_format=fmt.attributes.get("format", "text"))
    converted = yson.yson_to_json(value)
    if fmt.encode_utf8:
        converted = _apply_utf8_encoding(converted)
    return json.dumps(converted, ensure_ascii=False).encode("utf-8")
