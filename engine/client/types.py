"""The shapes of the answers that have a fixed shape: change streams, consumers, XDCR administration.

Why TypedDicts and not classes: these answers are JSON maps that callers already index by the
engine's own field names (``answer["event_token"]``, ``status["peers"]``), print as JSON (``reptables
dr status``) and hand on unchanged (a ``dr_join_read`` page goes to ``dr_join_write`` as it came).
A TypedDict is exactly that map, so the typed methods change nothing at run time while readers and
mypy learn which fields an answer has. The field names and meanings are the engine's
(docs/streams.md, docs/xdcr.md); a field the engine adds later is simply not typed yet.

States inside the answers (a replica's ``state``, an XDCR peer's ``state``) stay plain strings here,
as they travel; the enums that name them live with their owners (``reptables.engine.replica_types``
for replicas, the operator's models for the XDCR pair states it reports).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ChangeEvent(TypedDict):
    """One event of a change stream (docs/streams.md, "Events"); ``kind`` ``heartbeat`` carries the
    first four fields only."""

    event_token: str
    timestamp: int
    #: insert, update, delete (sorted tables); upsert, delete (a replicated table on its meta-cluster);
    #: append (ordered tables); heartbeat
    kind: str
    path: str
    tablet_index: NotRequired[int]
    key: NotRequired[dict[str, Any]]
    row: NotRequired[dict[str, Any]]
    update: NotRequired[bool]
    commit_end: NotRequired[bool]
    origin_cluster_id: NotRequired[int]
    origin_timestamp: NotRequired[int]


class PullAnswer(TypedDict):
    """One answer of ``pull_changes`` or ``pull_consumer``: the events, and where to go on from."""

    events: list[ChangeEvent]
    #: pull again after this token to get the next changes, once each
    event_token: str
    timestamp: int


class ConsumerRegistration(TypedDict):
    """One consumer of a queue, as ``list_queue_consumer_registrations`` lists it."""

    queue_path: str
    consumer_path: str
    vital: bool
    #: the consumer's offset: an event token (``advance_consumer`` moves it)
    offset: str
    timestamp: int


class XdcrPeerStatus(TypedDict):
    """What ``dr_status`` says of one peer this cluster ships its changes to."""

    #: connecting, connected, paused, waiting_for_peer, waiting_for_schema, waiting_for_snapshot, error,
    #: reset or stopped
    state: str
    lag_seconds: float
    queued_rows: int
    queued_bytes: int
    #: conflicts this cluster resolved applying the peer's changes (since its engine started)
    conflicts: int
    delivered_changes: int
    last_error: str | None


class XdcrJoinProgress(TypedDict):
    """A join from a snapshot (``dr_join_begin``, and each table under ``joining`` of ``dr_status``)."""

    path: str
    #: the donor cluster
    source: str
    snapshot_id: str | None
    pages: int
    rows: int
    tombstones: int
    loaded_pages: list[int]
    missing_pages: list[int]


class XdcrJoinFinished(XdcrJoinProgress):
    """The answer of ``dr_join_finish``: the join's summary, and that the table is a member now."""

    joined: bool


class XdcrJoinPage(TypedDict):
    """One page of the donor's cut (``dr_join_read``): hand ``entries`` to ``dr_join_write`` as they are."""

    page: int
    entries: list[dict[str, Any]]


class XdcrJoinWritten(TypedDict):
    """The answer of ``dr_join_write``: ``applied`` is False when the page was loaded before."""

    page: int
    applied: bool
    rows: int
    tombstones: int


class XdcrStatus(TypedDict):
    """The answer of ``dr_status`` (and of ``dr_pause``, ``dr_resume``, ``dr_reset``, ``dr_drop``)."""

    cluster: str
    #: the engine's ``--cluster-id``; None when it runs without one (it cannot take part in XDCR)
    cluster_id: int | None
    #: whether client writes are refused (``dr_pause``)
    paused: bool
    connections: list[str]
    #: paths of the XDCR tables of this cluster
    tables: list[str]
    peers: dict[str, XdcrPeerStatus]
    #: tables joining from a snapshot, by path
    joining: dict[str, XdcrJoinProgress]


__all__ = ["ChangeEvent", "ConsumerRegistration", "PullAnswer", "XdcrJoinFinished", "XdcrJoinPage",
           "XdcrJoinProgress", "XdcrJoinWritten", "XdcrPeerStatus", "XdcrStatus"]
