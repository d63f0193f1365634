"""Reading a request body within ``max_body_bytes``: as it arrives, and after decompression.

``Content-Length`` is only a claim: a chunked body has none, and a compressed one is small on the
wire — a 1.6 KB brotli body inflates to 2 GB. So the body is read chunk by chunk from the socket,
and decompressed chunk by chunk with the output of every step bounded by what is left of the
limit: the first byte past ``max_body_bytes`` (on the wire or decompressed) ends the request with
413, and the body never takes much more memory than the limit (twice it at the end, as it
becomes one bytes object). Decoders that cannot bound their output (a whole-body
``zlib.decompress``) must never be used here; brotli's bound needs brotli >= 1.2.
"""

from __future__ import annotations

import zlib
from typing import Any

import brotli

from ..errors import ErrorCode, YtError
from .incoming import Incoming

#: output bound of one brotli step
_BROTLI_STEP = 1024 * 1024


def _too_large(limit: int, what: str) -> YtError:
    return YtError(f"Request body {what} exceeds the limit of {limit} bytes (max_body_bytes)",
                   code=ErrorCode.PROTOCOL_ERROR, http_status=413, attributes={"max_body_bytes": limit})


def _decode_error(encoding: str, reason: object) -> YtError:
    return YtError(f"Cannot decode request body with Content-Encoding {encoding!r}: {reason}",
                   code=ErrorCode.PROTOCOL_ERROR)


class _Inflater:
    """One decompression stream; each step writes at most what is left of the limit (plus one byte,
    or for brotli one output buffer), so a bomb is caught before it inflates."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._zlib: Any = None
        self._brotli: Any = None
        if encoding in ("gzip", "deflate"):
            # YT clients label zlib streams "gzip"; wbits=47 accepts both zlib and gzip headers
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 32)
        elif encoding == "br":
            self._brotli = brotli.Decompressor()
        else:
            raise YtError(f"Unsupported Content-Encoding {encoding!r}", code=ErrorCode.PROTOCOL_ERROR)

    def feed(self, data: bytes, out: bytearray, limit: int) -> None:
        """Decompress ``data`` into ``out``; 413 as soon as ``out`` would pass ``limit``."""
        try:
            if self._zlib is not None:
                self._feed_zlib(data, out, limit)
            else:
                self._feed_brotli(data, out, limit)
        except (zlib.error, brotli.error) as exc:
            raise _decode_error(self.encoding, exc) from None

    def _feed_zlib(self, data: bytes, out: bytearray, limit: int) -> None:
        d = self._zlib
        if d.eof:
            if data:
                raise _decode_error(self.encoding, "data after the end of the compressed stream")
            return
        while data:
            room = limit - len(out) + 1  # >= 1: max_length=0 would mean "unbounded"
            out += d.decompress(data, room)
            if len(out) > limit:
                raise _too_large(limit, "after decompression")
            data = d.unconsumed_tail
            if d.eof and (data or d.unused_data):
                raise _decode_error(self.encoding, "data after the end of the compressed stream")

    def _feed_brotli(self, data: bytes, out: bytearray, limit: int) -> None:
        d = self._brotli
        if d.is_finished():
            if data:
                raise _decode_error(self.encoding, "data after the end of the compressed stream")
            return
        # the decoder may overshoot its output bound by one buffer (about 2x): steps of at most
        # _BROTLI_STEP keep that small; it holds pending output until asked with empty input
        while True:
            piece = d.process(data, output_buffer_limit=min(limit - len(out) + 1, _BROTLI_STEP))
            data = b""
            out += piece
            if len(out) > limit:
                raise _too_large(limit, "after decompression")
            if not piece:
                return

    def finish(self) -> None:
        finished = self._zlib.eof if self._zlib is not None else self._brotli.is_finished()
        if not finished:
            raise _decode_error(self.encoding, "the compressed stream is incomplete or truncated")


async def read_body(request: Incoming, limit: int) -> bytes:
    """The request body, decompressed per ``Content-Encoding``; 413 past ``limit`` bytes, counted
    on the wire and after decompression alike."""
    declared = request.headers.get("content-length")  # digits: the HTTP parser refuses anything else
    if declared is not None and int(declared) > limit:
        raise YtError(f"Request body of {int(declared)} bytes exceeds the limit of {limit} bytes "
                      "(max_body_bytes)", code=ErrorCode.PROTOCOL_ERROR, http_status=413,
                      attributes={"max_body_bytes": limit})
    encoding = request.headers.get("content-encoding", "").strip().lower()
    inflater = None if encoding in ("", "identity") else _Inflater(encoding)
    received = 0
    chunks: list[bytes] = []
    out = bytearray()
    async for chunk in request.stream():
        if not chunk:
            continue
        received += len(chunk)
        if received > limit:
            raise _too_large(limit, "as received")
        if inflater is None:
            chunks.append(chunk)
        else:
            inflater.feed(chunk, out, limit)
    if inflater is None:
        return b"".join(chunks)
    if received:
        inflater.finish()
    return bytes(out)
