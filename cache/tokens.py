"""Ordering event tokens the way the cache needs it, including "we cannot know".

Why not just ``reptables.engine.client.compare_tokens``: that helper orders tokens by their first
32 hex digits (commit timestamp, then sequence number), which is exact for tokens of *one* table
stream. The cache meets tokens of several streams of one logical table — the meta-cluster's
stream, a replica's stream, the freshness tokens of reads on a replica — and seed 004 says what to
do there: when the timestamps differ, the timestamp decides; when they are equal and the tokens
come from different streams, the order is unknown, and the caller must take the safe branch
(invalidate; do not fill). :func:`compare` returns ``None`` for that case so the caller cannot
forget it.

One refinement over the seed, which the engine's token format allows: a *heartbeat-style* token
(sequence ``ffffffffffffffff``) stands for "every change at or below this timestamp", so at an
equal timestamp it is known to be at least as new as any change token, whichever stream either
came from. This is what lets a read on a replica, whose freshness token is heartbeat-style, fill
the cache after the invalidator has seen the change of the same commit on the meta-cluster.

A token is ``f"{commit_ts:016x}{seq:016x}{table_id}"`` (docs/streams.md).
"""

from __future__ import annotations

import re

__all__ = ["HEARTBEAT_SEQUENCE", "compare", "is_heartbeat", "stream_id", "timestamp_of", "validate"]

#: the sequence half of a heartbeat-style token: after every change of its timestamp
HEARTBEAT_SEQUENCE = "f" * 16

_TOKEN = re.compile(r"[0-9a-f]{32}.*", re.DOTALL)


def validate(token: object, what: str = "event token") -> str:
    """``token`` if it is an event token, else a ValueError that names it and says why."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise ValueError(f"Invalid {what} {token!r}: expected 32 lowercase hex digits (commit timestamp, "
                         "sequence) followed by the table id")
    return token


def timestamp_of(token: str) -> int:
    """The commit timestamp (YT timestamp) in a token: its first 16 hex digits."""
    return int(validate(token)[:16], 16)


def stream_id(token: str) -> str:
    """The table id a token belongs to: what follows the 32 hex digits."""
    return validate(token)[32:]


def is_heartbeat(token: str) -> bool:
    """Whether a token is heartbeat-style: it covers every change at or below its timestamp."""
    return validate(token)[16:32] == HEARTBEAT_SEQUENCE


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 as ``a`` is older than, as new as or newer than ``b``; None when nobody can know.

    Unknown means: equal timestamps, different streams, and neither token heartbeat-style (seed
    004's "we don't know which event token is the most recent").
    """
    ts_a, ts_b = timestamp_of(a), timestamp_of(b)
    if ts_a != ts_b:
        return -1 if ts_a < ts_b else 1
    if stream_id(a) == stream_id(b):
        return (a[:32] > b[:32]) - (a[:32] < b[:32])
    heartbeat_a, heartbeat_b = is_heartbeat(a), is_heartbeat(b)
    if heartbeat_a or heartbeat_b:
        return heartbeat_a - heartbeat_b
    return None

