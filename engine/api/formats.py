"""Input and output formats of the HTTP API: YSON and JSON, structured and tabular.

YT names a format as a string with attributes, e.g. ``<format=text>yson`` or
``{"$value": "json", "$attributes": {"encode_utf8": false}}``. *Structured* data is one value (the
result of ``get``, the body of ``set``); *tabular* data is a stream of rows (a YSON list fragment,
or one JSON object per line).

The subtle part is JSON's ``encode_utf8`` (true by default in YT): strings travel as if each byte
of their UTF-8 form were one Unicode code point, so the official client encodes and decodes that
way. We honour it on output (a string that is not UTF-8 at all, which YSON input can store in an
``any`` column, travels byte for byte the same way), and on input we undo it only when the text
really is such an encoding (a clean UTF-8 round-trip), so clients that send plain JSON keep working.

Limits live here because only the parser knows where a row ends: tabular input is counted while it
is parsed (a body past its row limit is refused before the rest of it becomes objects), and tabular
output is counted while it is encoded. Everything a malformed body can make the parsers raise —
nesting deeper than Python's recursion, a JSON ``"\\ud800"`` that no string can hold — is a
protocol error (400) naming the reason, never an internal error.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
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


@dataclass(frozen=True)
class Limit:
    """At most ``amount`` rows (or bytes) in one request or answer; past it, ``error()`` is raised."""

    amount: int
    error: Callable[[], YtError]


#: what YSON's writer accepts as ``<format=...>``
_YSON_WRITER_FORMATS = ("binary", "text", "pretty")
#: rows encoded by one YSON call while an answer is counted
_YSON_SLICE = 4096


def _checked_format(fmt: Format) -> Format:
    """Attributes the writers would choke on are the request's mistake: refuse them by name."""
    if fmt.name == "yson" and fmt.yson_format not in _YSON_WRITER_FORMATS:
        raise YtError(f"Unsupported YSON format {fmt.yson_format!r}: expected one of "
                      f"{', '.join(_YSON_WRITER_FORMATS)}", code=ErrorCode.INVALID_PARAMETER)
    if fmt.name == "json" and not isinstance(fmt.attributes.get("encode_utf8", True), bool):
        raise YtError(f"Format attribute encode_utf8 must be a boolean, got "
                      f"{fmt.attributes['encode_utf8']!r}", code=ErrorCode.INVALID_PARAMETER)
    return fmt


def parse_format(raw: Any, default: str = "yson") -> Format:
    if raw is None or raw == "":
        return Format(default, {})
    if type(raw) is str and raw in ("json", "yson"):
        return Format(raw, {})
    if type(raw) is dict and "$value" in raw:
        # the JSON form of an attributed format, as JSON parameters carry it
        name, attrs = raw["$value"], raw.get("$attributes") or {}
        if name in ("json", "yson") and type(attrs) is dict:
            return _checked_format(Format(name, yson_util.to_python(attrs)))
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
    return _checked_format(Format(name, attrs if isinstance(attrs, dict) else {}))


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


#: a JSON escape of a UTF-16 surrogate; only then can a parsed string hold a lone one
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _too_deep(what: str) -> YtError:
    return YtError(f"Malformed {what} in request body: values are nested too deeply",
                   code=ErrorCode.PROTOCOL_ERROR)


def load_rows(data: bytes, fmt: Format, limit: Limit | None = None) -> list[Any]:
    """Parse tabular input into a list of rows (dicts); ``limit.error()`` as soon as it is known
    that the body holds more than ``limit.amount`` rows."""
    try:
        rows = _load_rows(data, fmt, limit)
    except RecursionError:
        raise _too_deep(fmt.name.upper()) from None
    if limit is not None and len(rows) > limit.amount:
        raise limit.error()
    return rows


def _load_rows(data: bytes, fmt: Format, limit: Limit | None) -> list[Any]:
    if fmt.name == "yson":
        try:
            parsed = yson.loads(data, yson_type="list_fragment", always_create_attributes=False)
            # the fragment is parsed lazily: stop one row past the limit
            rows = list(parsed if limit is None else itertools.islice(parsed, limit.amount + 1))
        except RecursionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the YSON parser raises several types
            raise YtError(f"Malformed YSON in request body: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
        return rows
    body = data.strip()
    if limit is not None and not body.startswith(b"[") and _json_lines_over(body, limit.amount):
        raise limit.error()
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
            if limit is not None and stripped.count(",") >= limit.amount:
                parsed = _json_array_within(stripped, limit)
            else:
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
    if _SURROGATE_ESCAPE.search(data):
        check_unicode(rows)
    return _json_rows(rows, fmt, plain=False)


def _json_lines_over(body: bytes, limit: int) -> bool:
    """Whether JSON lines hold more than ``limit`` rows, judged from the bytes before any parsing;
    scans at most ``limit + 1`` lines."""
    if body.count(b"\n") < limit:
        return False  # at most count + 1 lines
    count = 0
    start = 0
    size = len(body)
    while start < size:
        end = body.find(b"\n", start)
        if end < 0:
            end = size
        if end > start and not body[start:end].isspace():
            count += 1
            if count > limit:
                return True
        start = end + 1
    return False


def _json_array_within(text: str, limit: Limit) -> list[Any]:
    """A JSON array parsed element by element, refused at element ``limit.amount + 1``."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    rows: list[Any] = []
    pos = ws.match(text, 1).end()  # type: ignore[union-attr]
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            value, pos = decoder.raw_decode(text, pos)
            rows.append(value)
            if len(rows) > limit.amount:
                raise limit.error()
            pos = ws.match(text, pos).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
            elif text.startswith("]", pos):
                pos += 1
                break
            else:
                raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
    if pos != len(text):
        raise json.JSONDecodeError("Extra data", text, pos)
    return rows


def has_surrogate_escape(data: bytes) -> bool:
    """Whether JSON text may decode to a string with a lone surrogate (only an escape can make one)."""
    return _SURROGATE_ESCAPE.search(data) is not None


def check_unicode(value: Any) -> None:
    """Refuse strings no encoder can write (a lone surrogate from ``"\\ud800"``); iterative, so
    any depth the parser accepted is fine."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                shown = item.encode("utf-8", "backslashreplace").decode("utf-8")
                raise YtError(f"Malformed JSON in request body: string \"{shown[:80]}\" is not valid Unicode "
                              "(it holds a lone surrogate)", code=ErrorCode.PROTOCOL_ERROR) from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _plain_rows(body: bytes, rows: list[Any]) -> bool:
    """Whether every row is a flat map with no ``$`` keys, judged from the bytes (no per-row work):
    exactly one ``{`` per row and no ``[`` means no nested values; a string holding one of these
    characters just sends the batch to the per-row check. (``$`` is looked for alone first: one
    ``memchr``, where a search of ``"$`` stops at every quote of the body.)"""
    return b"[" not in body and (b"$" not in body or b'"$' not in body) and body.count(b"{") == len(rows)


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


def dump_rows(rows: list[Any], fmt: Format, limit: Limit | None = None) -> bytes:
    """Encode an answer's rows; ``limit.error()`` as soon as it passes ``limit.amount`` bytes."""
    if fmt.name == "yson":
        parts = []
        size = 0
        for start in range(0, len(rows), _YSON_SLICE):
            # list fragments concatenate: slices bound the work done past the limit
            part = yson.dumps(rows[start:start + _YSON_SLICE], yson_type="list_fragment",
                              yson_format=fmt.yson_format)
            size += len(part)
            if limit is not None and size > limit.amount:
                raise limit.error()
            parts.append(part)
        return b"".join(parts)
    out = []
    chars = 0
    default = _json_default(fmt)
    for row in rows:
        value = _apply_utf8_encoding(row) if fmt.encode_utf8 else row
        line = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=default)
        chars += len(line) + 1
        if limit is not None and chars > limit.amount:  # a character is at least one byte
            raise limit.error()
        out.append(line)
    data = ("\n".join(out) + ("\n" if out else "")).encode("utf-8")
    if limit is not None and len(data) > limit.amount:
        raise limit.error()
    return data


def _json_default(fmt: Format) -> Callable[[Any], Any]:
    """Strings that are not UTF-8 (bytes): under ``encode_utf8`` each byte is one code point, as
    YT writes them; without it JSON cannot carry them."""
    def default(value: Any) -> Any:
        if isinstance(value, yson.YsonStringProxy):
            value = yson.get_bytes(value)
        if isinstance(value, bytes):
            if fmt.encode_utf8:
                return value.decode("latin-1")
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise YtError("The answer holds a string that is not valid UTF-8, which JSON with "
                              "encode_utf8=%false cannot carry: use encode_utf8=%true or the YSON format",
                              code=ErrorCode.INVALID_PARAMETER) from None
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return default


def load_structured(data: bytes, fmt: Format) -> Any:
    if fmt.name == "yson":
        try:
            return yson.loads(data)
        except RecursionError:
            raise _too_deep("YSON") from None
        except Exception as exc:  # noqa: BLE001
            raise YtError(f"Malformed YSON in request body: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
    try:
        value = json.loads(data.decode("utf-8"))
        if fmt.encode_utf8:
            value = _undo_utf8_encoding(value)
        return yson.json_to_yson(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _json_error(exc, "request body") from None
    except RecursionError:
        raise _too_deep("JSON") from None
    except yson.YsonError as exc:
        # the JSON form of YSON reserves "$"-keys ($value, $attributes, $type): any other is malformed
        raise YtError(f"Malformed JSON in request body: {str(exc).splitlines()[0]}",
                      code=ErrorCode.PROTOCOL_ERROR) from None


#: keys of change events that the JSON form of YSON writes with a doubled "$"
_DOLLAR_KEYS = (b'"$tablet_index":', b'"$row_index":')


def dump_plain_structured(value: Any, fmt: Format) -> bytes:
    """``dump_structured`` of a value known to hold no YSON types or attributes (a change stream's
    answer): one orjson call when the format is JSON and the text is ASCII (or ``encode_utf8`` is
    off), which is what makes streaming cheap; the general path otherwise. ``value`` may be the
    JSON form of YSON already (bytes: "$"-keys doubled), sent as it is when the format allows."""
    if isinstance(value, bytes):
        if fmt.name == "json" and (value.isascii() or not fmt.encode_utf8):
            return value
        value = _unescape_dollars(orjson.loads(value))
        return dump_structured(value, fmt)
    if fmt.name == "json":
        try:
            out = orjson.dumps(value)
        except TypeError:
            out = b""
        # (orjson writes a NaN or an infinite double as null: an answer with a null takes the general path)
        if out and b"null" not in out and (out.isascii() or not fmt.encode_utf8):
            for key in _DOLLAR_KEYS:
                out = out.replace(key, b'"$' + key[1:])
            return out
    return dump_structured(value, fmt)


def _unescape_dollars(value: Any) -> Any:
    if isinstance(value, dict):
        return {(k[1:] if k.startswith("$$") else k): _unescape_dollars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescape_dollars(v) for v in value]
    return value


def dump_structured(value: Any, fmt: Format) -> bytes:
    if fmt.name == "yson":
        return yson.dumps(value, yson_format=fmt.attributes.get("format", "text"))
    try:
        converted = yson.yson_to_json(value)
    except UnicodeDecodeError:
        # a string that is not UTF-8: kept as bytes, written by _json_default
        try:
            converted = yson.yson_to_json(value, use_byte_strings=True)
        except UnicodeDecodeError:  # a map key that is not UTF-8
            raise YtError("The answer holds a map key that is not valid UTF-8, which JSON cannot carry: "
                          "use the YSON format", code=ErrorCode.INVALID_PARAMETER) from None
    if fmt.encode_utf8:
        converted = _apply_utf8_encoding(converted)
    return json.dumps(converted, ensure_ascii=False, default=_json_default(fmt)).encode("utf-8")
