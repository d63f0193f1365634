"""What the API reads of a request, straight from the ASGI scope: its headers, query and body.

Every command and internal call reads a handful of headers (the token, the header format,
``X-YT-Parameters``, the formats, the body's length and encoding), the query string and the body.
Starlette's ``Request`` builds a ``Headers`` object that lowercases and scans the raw header list
on every lookup, a ``QueryParams`` multi-dict, a URL and a stream wrapper for each: on a
single-row commit or a one-key lookup those objects were a visible share of the request layer,
which is now the larger part of such a request's time (benchmarks/README.md, "Where a request's
time goes"). :class:`Call` reads the same things once, into a dict, for the two hot routes; the
other routes keep Starlette's ``Request``, and both satisfy :class:`Incoming`, which is all the
readers here (``read_body``, ``header_format_of``, authentication) ask for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope


class Incoming(Protocol):
    """A request as the API's readers see it: Starlette's ``Request`` or :class:`Call`."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


class Call:
    """One command or internal call: its headers by lower-case name (the first of a repeated one,
    as Starlette's ``Headers.get`` answers), its query parameters (the last of a repeated one, as
    ``QueryParams`` answers), its path parameters, and its body as it arrives."""

    __slots__ = ("_receive", "headers", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self._receive = receive
        #: (reversed: the first of a repeated header is the one kept)
        self.headers: dict[str, str] = {name.decode("latin-1").lower(): value.decode("latin-1")
                                        for name, value in reversed(scope["headers"])}

    @property
    def path_params(self) -> dict[str, Any]:
        params: dict[str, Any] = self.scope.get("path_params", {})
        return params

    @property
    def query_params(self) -> dict[str, str]:
        raw: bytes = self.scope.get("query_string", b"")
        return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)) if raw else {}

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks as the server hands them over; ``ClientDisconnect`` (as Starlette's)
        if the client goes away first."""
        while True:
            message = await self._receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return
            elif message["type"] == "http.disconnect":
                raise ClientDisconnect()
