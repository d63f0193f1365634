"""Structured (JSON lines) logging for engine processes.

Each record is one JSON object with the message, the logger, the level and every ``extra=`` field
(table path, cluster, transaction id...), so logs can be filtered by the object they are about.
Tokens never reach a log record: nothing in the engine passes one as a field.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        # only plain fields: libraries (kopf) attach whole objects as extras
        out.update({k: v for k, v in vars(record).items()
                    if k not in _STANDARD and isinstance(v, str | int | float | bool | type(None))})
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("name"):
            # kopf's records of one object: say which (its reference is a dict, left out above)
            where = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else str(ref["name"])
            out["object"] = f"{ref.get('kind', '')} {where}".strip()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("reptables")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
