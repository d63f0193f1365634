"""The user-settable replication attributes of a replicated table, and their defaults.

``replicated_table_options`` and ``replication_throttler`` are validated when set (by the node
layer, before anything is stored), with YT's names and rules, so that a typo is an error at
``set`` time rather than a tracker or a throttler silently doing nothing later.
"""

from __future__ import annotations

from typing import Any

from ..errors import ErrorCode, YtError

#: the replicated table's node attribute holding ``DynamicTable.trimmed_timestamp``
TRIMMED_TIMESTAMP_ATTRIBUTE = "_rt_trimmed_timestamp"
#: a replica table's node attribute: the id of its replicated table on the meta-cluster (sent with
#: every push), whose event tokens a read of the replica may be compared with (node/stream_service.py)
UPSTREAM_TABLE_ATTRIBUTE = "_rt_upstream_table_id"

#: ``@min_replication_log_ttl`` when unset (ms): queue rows every replica has are kept this long
DEFAULT_MIN_REPLICATION_LOG_TTL_MS = 5 * 60 * 1000

_OPTION_TYPES: dict[str, type] = {
    "enable_replicated_table_tracker": bool, "min_sync_replica_count": int, "max_sync_replica_count": int,
    "preferred_sync_replica_clusters": list, "sync_replica_lag_threshold": int,
}


def validate_replicated_table_options(options: Any, path: str) -> None:
    """``replicated_table_options`` with the names and rules of YT's tracker (see notes/tracker.md)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise YtError(f"replicated_table_options of {path} must be a map", code=ErrorCode.INVALID_PARAMETER)
    for key, value in options.items():
        expected = _OPTION_TYPES.get(key)
        if expected is None:
            raise YtError(f"Unknown replicated_table_options field {key!r} for table {path}; known: "
                          f"{', '.join(sorted(_OPTION_TYPES))}", code=ErrorCode.INVALID_PARAMETER)
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            raise YtError(f"replicated_table_options/{key} of {path} must be of type {expected.__name__}",
                          code=ErrorCode.INVALID_PARAMETER)
        if expected is int and isinstance(value, int) and value < 0:
            raise YtError(f"replicated_table_options/{key} of {path} must be >= 0", code=ErrorCode.INVALID_PARAMETER)
    clusters = options.get("preferred_sync_replica_clusters", [])
    if not all(isinstance(c, str) for c in clusters):
        raise YtError(f"replicated_table_options/preferred_sync_replica_clusters of {path} must be a list of "
                      "cluster names", code=ErrorCode.INVALID_PARAMETER)
    low, high = options.get("min_sync_replica_count"), options.get("max_sync_replica_count")
    if low is not None and high is not None and low > high:
        raise YtError(f"replicated_table_options of {path}: min_sync_replica_count ({low}) must not exceed "
                      f"max_sync_replica_count ({high})", code=ErrorCode.INVALID_PARAMETER)


def validate_throttler(throttler: Any, path: str) -> None:
    """``replication_throttler`` is ``{period=<ms>; limit=<bytes per period>}``."""
    if throttler is None:
        return
    if not isinstance(throttler, dict) or set(throttler) - {"period", "limit"}:
        raise YtError(f"replication_throttler of {path} must be a map {{period; limit}}",
                      code=ErrorCode.INVALID_PARAMETER)
    for key in ("period", "limit"):
        value = throttler.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise YtError(f"replication_throttler/{key} of {path} must be a positive integer",
                          code=ErrorCode.INVALID_PARAMETER)
