"""Row changes: what a transaction buffers, what a prepare record and the wire carry, what a
table applies.

The write set is the vocabulary shared by three layers that must not know one another's
internals: the table (which applies it), the transaction layer (which merges writes per key and
locks them) and replication (which ships them to sync replicas in a prepare and back out of the
queue). It lives apart from the table so that each of them reads as "writes in, writes out" and
so that nothing here touches SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode, YtError

if TYPE_CHECKING:
    from .xdcr import RowVersion


class WriteKind(StrEnum):
    WRITE = "write"
    DELETE = "delete"
    LOCK = "lock"


@dataclass(slots=True)
class RowWrite:
    """One row change of a transaction, merged per key before commit."""

    kind: WriteKind
    row: dict[str, Any]
    #: lock groups this write takes (bit 0 = primary lock)
    mask: int
    #: update mode: columns not in ``row`` keep their stored values
    update: bool = False
    #: for LOCK: True for shared (read) locks, False for exclusive
    shared: bool = False
    strong: bool = False
    #: XDCR: the (commit timestamp, cluster id) of the change on the cluster it came from, for a
    #: change replicated by an XDCR peer (None: a change made here, versioned by its commit)
    origin: tuple[int, int] | None = None
    #: XDCR: the delete horizon of such a change (``tablets/xdcr.py``; None: no delete in its history)
    origin_horizon: tuple[int, int] | None = None
    #: XDCR: the version the row has here, when the receiver already read it to resolve the change
    #: (in the same SQL transaction, under the writer), so the commit does not read it again
    here_known: bool = False
    here: RowVersion | None = None

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "row": self.row, "mask": self.mask, "update": self.update,
                "shared": self.shared, "strong": self.strong}

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> RowWrite:
        return cls(kind=WriteKind(data["kind"]), row=data["row"], mask=int(data["mask"]),
                   update=bool(data["update"]), shared=bool(data["shared"]), strong=bool(data["strong"]))


@dataclass(frozen=True, slots=True)
class ImageRun:
    """Whole-row writes of one commit to a sorted table as the images the table stores, without a
    :class:`RowWrite` per row: what an async replica applies from a push in the columnar form.

    A replica applies batches of up to 90,000 rows; a row dict and a ``RowWrite`` made for each
    row, and the images then made from them again, were about a fifth of its apply
    (benchmarks/README.md). ``images`` are the rows in the table's column order, ``keys`` their
    keys, each a write of every column with the lock ``mask`` (the schema's full mask). A later
    image of a key replaces an earlier one, as a later write does. A table whose columns are no
    longer ``names`` (altered in between) applies the rows as writes (:meth:`writes`)."""

    keys: list[tuple[Any, ...]]
    images: list[tuple[Any, ...]]
    mask: int
    #: the columns of the images, the table's when they were made (an alter may come before the apply)
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.images)

    def writes(self) -> list[RowWrite]:
        """The same changes as whole-row writes."""
        names = self.names
        return [RowWrite(WriteKind.WRITE, dict(zip(names, image, strict=True)), self.mask) for image in self.images]

    def keyed(self) -> dict[tuple[Any, ...], RowWrite]:
        """The run by key as conflict checks and row locks read it (a write's kind and lock mask):
        one write shared by every key."""
        return dict.fromkeys(self.keys, RowWrite(WriteKind.WRITE, {}, self.mask))


#: a change's kind by its name on the wire
WRITE_KINDS = {kind.value: kind for kind in WriteKind}


def encode_writes(writes: list[RowWrite]) -> dict[str, Any]:
    """Writes as JSON-able columns: the rows, and each other field once when all writes share it
    (the usual case: a batch of whole-row writes) or as a list. A sync replica's prepare carries
    up to 100,000 writes: a map per write would cost more than the rows themselves.

    Rows that all name the same columns go as ``columns`` (their names) and ``values`` (a list per
    column), which the receiver decodes and checks a column at a time; other rows as ``rows``."""
    rows = list(map(_ROW, writes))
    out: dict[str, Any] = _row_columns(rows) or {"rows": rows}
    for name, field in _FIELDS:
        values = list(map(field, writes))  # (C passes: a prepare carries up to 100,000 writes)
        first: Any = values[0] if values else None
        if values.count(first) == len(values):
            out[name] = first.value if name == "kind" and values else first
        else:
            out[name] = [v.value for v in values] if name == "kind" else values
    return out


_ROW = attrgetter("row")
#: the fields of a write :func:`encode_writes` sends beside its row
_FIELDS = tuple((name, attrgetter(name)) for name in ("kind", "mask", "update", "shared", "strong"))


def _row_columns(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``columns`` and ``values`` of rows that all have the keys of the first (told in C: as many
    keys, and each of its keys), else None."""
    if not rows or type(rows[0]) is not dict or not rows[0]:
        return None
    names = list(rows[0])
    if set(map(len, rows)) != {len(names)}:
        return None
    try:
        # (a C pass per column: 2.5x faster than a tuple per row turned into columns)
        return {"columns": names, "values": [list(map(itemgetter(name), rows)) for name in names]}
    except (KeyError, TypeError):
        return None


def columns_well_formed(names: Any, values: Any) -> bool:
    """Whether ``columns`` and ``values`` (:func:`encode_writes`) are distinct names and as many
    lists of one length."""
    return (type(names) is list and type(values) is list and len(names) == len(values) and bool(names)
            and all(type(n) is str for n in names) and len(set(names)) == len(names)
            and all(type(v) is list for v in values) and len(set(map(len, values))) == 1)


def rows_of_columns(names: Any, values: Any) -> list[dict[str, Any]]:
    """The rows of ``columns`` and ``values`` (:func:`encode_writes`): a map per row, made in C.
    Raises ``YtError`` for anything but distinct names and as many lists of one length."""
    if not columns_well_formed(names, values):
        raise YtError("Malformed writes: expected as many distinct column names as lists of values of one length",
                      code=ErrorCode.PROTOCOL_ERROR)
    return list(map(dict, map(zip, repeat(names), zip(*values, strict=True))))


def decode_writes(data: dict[str, Any]) -> list[RowWrite]:
    """The writes of :func:`encode_writes` (or of the older form, a list of per-write maps)."""
    if "writes" in data:
        return [RowWrite.from_payload(w) for w in data["writes"]]
    rows = rows_of_columns(data["columns"], data["values"]) if "columns" in data else data["rows"]
    n = len(rows)

    def column(name: str, default: Any) -> list[Any]:
        value = data.get(name, default)
        if isinstance(value, list):
            if len(value) != n:
                raise YtError(f"Malformed writes: {len(value)} values of {name!r} for {n} rows",
                              code=ErrorCode.PROTOCOL_ERROR)
            return value
        return [value] * n

    try:
        kinds = [WRITE_KINDS[k] for k in column("kind", "write")]
    except KeyError as exc:
        raise YtError(f"Malformed writes: unknown kind {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
    return [RowWrite(kind, row, int(mask), bool(update), bool(shared), bool(strong))
            for kind, row, mask, update, shared, strong in zip(
                kinds, rows, column("mask", 1), column("update", False), column("shared", False),
                column("strong", False), strict=True)]



def masks_conflict(a: int, b: int) -> bool:
    """Lock groups conflict on overlap; the primary lock (bit 0) conflicts with every group."""
    if a & b:
        return True
    return bool((a & 1) and b) or bool((b & 1) and a)
