"""An attacker's endpoint for tests: answers the operator like an engine and records what it is sent.

A TableCluster may name any endpoint. The tests point one at this server and check that nothing
sent to it carries another cluster's token (and, for refused TableClusters, that nothing is sent).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorder:
    """An attacker's endpoint: answers like an engine and records everything it is sent."""

    requests: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> Recorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                recorder.requests.append(f"{self.command} {self.path}\n{self.headers}\n{body.decode(errors='replace')}")
                payload = b""
                if self.path.startswith("/healthz"):
                    payload = b'{"version": "rogue"}'
                elif self.path.startswith("/api/v4/get"):
                    payload = b'{"value": {}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wrote_directory(self) -> bool:
        """Whether the operator set ``//sys/clusters`` here."""
        return any(r.split(" ", 1)[0] in ("PUT", "POST") and r.split(" ", 2)[1].startswith("/api/v4/set")
                   and "//sys/clusters" in r for r in self.requests)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
