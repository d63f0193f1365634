"""YT-style errors shared by every layer of the engine and by its client.

Why one module: the HTTP layer must turn *every* failure into a YT error object (code, message,
attributes, inner errors) with a 4xx status, and the client must turn those objects back into typed
exceptions. Keeping the codes and the exception hierarchy in one place lets both ends agree, and
lets table logic raise precise errors without knowing anything about HTTP.

The numeric codes are YTsaurus's where YTsaurus has one, so users can look them up in YT docs.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    """Error codes; the values are those of YTsaurus (yt/client/*/public.h)."""

    GENERIC = 1
    TIMEOUT = 3
    PROTOCOL_ERROR = 101
    NO_SUCH_METHOD = 103
    UNAVAILABLE = 105
    #: NHydra's ReadOnly: the cluster is in read-only mode (reptables: ``//sys/@read_only``)
    READ_ONLY = 605
    SORT_ORDER_VIOLATION = 301
    SCHEMA_VIOLATION = 307
    ROW_WEIGHT_LIMIT_EXCEEDED = 308
    INCOMPATIBLE_KEY_COLUMNS = 311
    #: NChunkClient's IOError: the storage under a table failed (a corrupted database file)
    IO_ERROR = 711
    RESOLVE_ERROR = 500
    ALREADY_EXISTS = 501
    AUTHENTICATION_ERROR = 900
    AUTHORIZATION_ERROR = 901
    TRANSACTION_LOCK_CONFLICT = 1700
    NO_SUCH_TABLET = 1701
    TABLET_NOT_MOUNTED = 1702
    INVALID_TABLET_STATE = 1706
    TABLET_SNAPSHOT_EXPIRED = 1708
    BLOCKED_ROW_WAIT_TIMEOUT = 1713
    NO_SYNC_REPLICAS = 1714
    TABLE_MUST_BE_SORTED = 1716
    TOO_MANY_ROWS_IN_TRANSACTION = 1717
    UPSTREAM_REPLICA_MISMATCH = 1718
    #: reptables: a replica whose history left the replication queue cannot be enabled
    REPLICA_HISTORY_TRIMMED = 1740
    COLUMN_NOT_FOUND = 1726
    SYNC_REPLICA_NOT_IN_SYNC = 1732
    NO_IN_SYNC_REPLICAS = 1736
    #: reptables: a change stream asked to start before the oldest change still kept
    CHANGES_TRIMMED = 1760
    #: reptables: advance_consumer's old_offset is not the consumer's stored offset
    CONSUMER_OFFSET_CONFLICT = 1761
    #: reptables: a change stream of a table that keeps no change log (``@enable_change_log`` is false)
    NO_CHANGE_LOG = 1762
    #: reptables: an XDCR table's schema differs between two clusters (replication waits)
    XDCR_SCHEMA_MISMATCH = 1770
    #: reptables: an XDCR connection is not configured on both sides (replication waits)
    XDCR_NOT_CONNECTED = 1771
    #: reptables: an XDCR peer needs a snapshot before changes (it joins, or misses trimmed changes)
    XDCR_NEEDS_SNAPSHOT = 1772
    NO_SUCH_TRANSACTION = 11000
    INVALID_TRANSACTION_STATE = 11003
    INVALID_TRANSACTION_ATOMICITY = 11004
    QUERY_SYNTAX_ERROR = 1801
    INVALID_PARAMETER = 1802


class YtError(Exception):
    """An error in YT's shape: ``{"code", "message", "attributes", "inner_errors"}``."""

    http_status: int = 400

    def __init__(
        self,
        message: str,
        code: int = ErrorCode.GENERIC,
        attributes: dict[str, Any] | None = None,
        inner_errors: list[YtError] | None = None,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.attributes = dict(attributes or {})
        self.inner_errors = list(inner_errors or [])
        if http_status is not None:
            self.http_status = http_status

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "attributes": self.attributes,
            "inner_errors": [e.to_dict() for e in self.inner_errors],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> YtError:
        """Rebuild the most specific exception class for an error received over the wire."""
        code = int(data.get("code", ErrorCode.GENERIC))
        inner = [cls.from_dict(e) for e in data.get("inner_errors") or []]
        error_cls = _CLASS_BY_CODE.get(code, YtError)
        return error_cls(
            str(data.get("message", "")), code=code, attributes=data.get("attributes"), inner_errors=inner
        )

    def find(self, code: int) -> YtError | None:
        """Return this error or the first inner error (depth first) with ``code``."""
        if self.code == code:
            return self
        for inner in self.inner_errors:
            found = inner.find(code)
            if found is not None:
                return found
        return None

    def __str__(self) -> str:
        text = self.message
        for inner in self.inner_errors:
            text += f"\n    {inner}"
        return text


class ResolveError(YtError):
    http_status = 404

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.RESOLVE_ERROR)
        super().__init__(message, **kwargs)


class AlreadyExistsError(YtError):
    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.ALREADY_EXISTS)
        super().__init__(message, **kwargs)


class SchemaViolation(YtError):
    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.SCHEMA_VIOLATION)
        super().__init__(message, **kwargs)


class LockConflict(YtError):
    http_status = 409

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.TRANSACTION_LOCK_CONFLICT)
        super().__init__(message, **kwargs)


class TabletStateError(YtError):
    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.INVALID_TABLET_STATE)
        super().__init__(message, **kwargs)


class NoSuchTransaction(YtError):
    http_status = 404

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.NO_SUCH_TRANSACTION)
        super().__init__(message, **kwargs)


class QuerySyntaxError(YtError):
    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.QUERY_SYNTAX_ERROR)
        super().__init__(message, **kwargs)


class AuthenticationError(YtError):
    http_status = 401

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.AUTHENTICATION_ERROR)
        super().__init__(message, **kwargs)


class UnavailableError(YtError):
    http_status = 503

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.UNAVAILABLE)
        super().__init__(message, **kwargs)


class DataDirError(YtError):
    """The engine refuses its data directory at start-up (missing or damaged database, lost WAL):
    the process exits rather than serve a cluster whose data is not what it acknowledged."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.IO_ERROR)
        super().__init__(message, **kwargs)


class DataDirInUseError(YtError):
    """Another engine (or this process, once already) serves the data directory: it holds the
    directory's lock. Not a ``DataDirError``: nothing about the directory is wrong and nothing was
    checked, so it is not logged as a refused directory; the command line prints it as one line."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.UNAVAILABLE)
        super().__init__(message, **kwargs)


class StorageCorruptedError(YtError):
    """The database answered that its file is damaged (SQLite's "database disk image is
    malformed"): a server fault, not the request's, so 500; not retriable either."""

    http_status = 500

    def __init__(self, message: str, **kwargs: Any) -> None:
        kwargs.setdefault("code", ErrorCode.IO_ERROR)
        super().__init__(message, **kwargs)


_CLASS_BY_CODE: dict[int, type[YtError]] = {
    ErrorCode.RESOLVE_ERROR: ResolveError,
    ErrorCode.ALREADY_EXISTS: AlreadyExistsError,
    ErrorCode.SCHEMA_VIOLATION: SchemaViolation,
    ErrorCode.TRANSACTION_LOCK_CONFLICT: LockConflict,
    ErrorCode.INVALID_TABLET_STATE: TabletStateError,
    ErrorCode.TABLET_NOT_MOUNTED: TabletStateError,
    ErrorCode.NO_SUCH_TRANSACTION: NoSuchTransaction,
    ErrorCode.QUERY_SYNTAX_ERROR: QuerySyntaxError,
    ErrorCode.AUTHENTICATION_ERROR: AuthenticationError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.IO_ERROR: StorageCorruptedError,
}
