"""The history of a fault run: every operation's invocation and its outcome, as the checkers read it.

Why a history (Jepsen's model) rather than assertions in the workload: a check must be able to run
again, later and elsewhere, on exactly what happened - "a history checked independently". So the
workloads only *record*: each client operation is an ``invoke`` and then one of

* ``ok``: the engine acknowledged it; it happened;
* ``fail``: it certainly did not happen (refused before anything was applied: a lock conflict, "no
  sync replicas", a sync replica that could not prepare, a connection that was refused);
* ``unknown``: the client cannot know (a timeout, a reset, an error the engine may have answered
  after committing). An unknown operation may or may not have happened, even later than it was
  given up on; checkers never count it as a failure.

Each operation belongs to a *process* (one client session doing one thing at a time). As in
Jepsen, a process whose operation ended ``unknown`` is retired and its thread goes on as a new
process: the old operation may still be in flight. Faults, tracker switches and other events are
``info`` entries; final reads after the run are ``ok`` operations of process ``final``.

The history is written as JSON lines while the run goes (one object per entry), so a run that dies
still leaves what happened until then.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from reptables.engine.client import TransportError
from reptables.engine.errors import ErrorCode, YtError

__all__ = ["DEFINITE_CODES", "History", "Op", "OpType", "classify"]


class OpType(StrEnum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"
    INFO = "info"


@dataclass(frozen=True)
class Op:
    """One entry: ``time`` is seconds since the run began (monotonic)."""

    index: int
    time: float
    process: str
    type: OpType
    f: str
    value: Any = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        return cls(int(d["index"]), float(d["time"]), str(d["process"]), OpType(d["type"]), str(d["f"]),
                   d.get("value"), d.get("error"))


#: errors the engine answers only when it applied nothing (a refused write): such an operation failed
DEFINITE_CODES = frozenset({
    ErrorCode.READ_ONLY, ErrorCode.SCHEMA_VIOLATION, ErrorCode.RESOLVE_ERROR, ErrorCode.AUTHENTICATION_ERROR,
    ErrorCode.AUTHORIZATION_ERROR, ErrorCode.TRANSACTION_LOCK_CONFLICT, ErrorCode.NO_SUCH_TABLET,
    ErrorCode.TABLET_NOT_MOUNTED, ErrorCode.INVALID_TABLET_STATE, ErrorCode.BLOCKED_ROW_WAIT_TIMEOUT,
    ErrorCode.NO_SYNC_REPLICAS, ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION, ErrorCode.UPSTREAM_REPLICA_MISMATCH,
    ErrorCode.SYNC_REPLICA_NOT_IN_SYNC, ErrorCode.NO_IN_SYNC_REPLICAS, ErrorCode.NO_SUCH_TRANSACTION,
    ErrorCode.INVALID_TRANSACTION_STATE, ErrorCode.INVALID_PARAMETER, ErrorCode.QUERY_SYNTAX_ERROR,
})


def classify(exc: BaseException) -> OpType:
    """``fail`` if ``exc`` proves the operation applied nothing, ``unknown`` otherwise."""
    if isinstance(exc, TransportError):
        # refused: the request never left; anything else (timeout, reset) may have been applied
        return OpType.FAIL if isinstance(exc.cause, ConnectionRefusedError) else OpType.UNKNOWN
    if isinstance(exc, YtError):
        if exc.code in DEFINITE_CODES:
            return OpType.FAIL
        # the meta-cluster aborted the commit everywhere when a sync replica could not prepare
        if "replica_id" in exc.attributes and exc.message.startswith("Cannot write to sync replica"):
            return OpType.FAIL
    return OpType.UNKNOWN


def describe(exc: BaseException) -> str:
    if isinstance(exc, YtError):
        return f"{exc.code}: {exc.message.splitlines()[0][:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


class History:
    """A thread-safe, append-only history; written to ``path`` (JSON lines) as it grows, if given."""

    def __init__(self, path: Path | None = None, ops: Iterable[Op] = ()) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = list(ops)
        self._index = itertools.count(len(self._ops))
        self._processes: dict[str, itertools.count[int]] = {}
        self._started = time.monotonic()
        self._file: IO[str] | None = path.open("a", encoding="utf-8") if path is not None else None

    @classmethod
    def load(cls, path: Path) -> History:
        with path.open(encoding="utf-8") as f:
            return cls(ops=[Op.from_dict(json.loads(line)) for line in f if line.strip()])

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _append(self, process: str, type_: OpType, f: str, value: Any, error: str | None = None) -> Op:
        with self._lock:
            op = Op(next(self._index), round(time.monotonic() - self._started, 4), process, type_, f, value, error)
            self._ops.append(op)
            if self._file is not None:
                self._file.write(op.to_json() + "\n")
                self._file.flush()
            return op

    def process(self, kind: str) -> str:
        """A new process id of ``kind`` (``set-0``, ``set-1``...)."""
        with self._lock:
            counter = self._processes.setdefault(kind, itertools.count())
            return f"{kind}-{next(counter)}"

    def invoke(self, process: str, f: str, value: Any = None) -> Op:
        return self._append(process, OpType.INVOKE, f, value)

    def complete(self, invoked: Op, type_: OpType, value: Any = None, error: str | None = None) -> Op:
        return self._append(invoked.process, type_, invoked.f, invoked.value if value is None else value, error)

    def info(self, process: str, f: str, value: Any = None) -> Op:
        return self._append(process, OpType.INFO, f, value)

    def record(self, process: str, f: str, value: Any) -> Op:
        """An operation that is already over and succeeded (final reads): invoke and ok at once."""
        self.invoke(process, f, None)
        return self._append(process, OpType.OK, f, value)

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def pairs(self, f: str | None = None, kind: str | None = None) -> list[tuple[Op, Op | None]]:
        """(invocation, completion) of every client operation (``f`` and the process ``kind`` if
        given); a completion is None when the run ended first (treated as unknown)."""
        open_: dict[str, Op] = {}
        out: list[tuple[Op, Op | None]] = []
        slot: dict[int, int] = {}
        for op in self.ops:
            if op.type is OpType.INFO or (kind is not None and op.process.rsplit("-", 1)[0] != kind):
                continue
            if f is not None and op.f != f:
                continue
            if op.type is OpType.INVOKE:
                open_[op.process] = op
                slot[op.index] = len(out)
                out.append((op, None))
            else:
                invoked = open_.pop(op.process, None)
                if invoked is not None:
                    out[slot[invoked.index]] = (invoked, op)
        return out

    def counts(self) -> dict[str, int]:
        out = {t.value: 0 for t in OpType}
        for op in self.ops:
            out[op.type.value] += 1
        return out
