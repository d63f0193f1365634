"""The synchronous client: keep-alive connections of ``httpconn`` (or httpx with a transport)."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

import httpx

from ..errors import YtError
from ..httpconn import ConnectionPool, HttpTransportError
from .protocol import Answer, Build, ClientConfig, Request, Row, TransportError, result_of
from .types import (
    ChangeEvent,
    ConsumerRegistration,
    PullAnswer,
    XdcrJoinFinished,
    XdcrJoinPage,
    XdcrJoinProgress,
    XdcrJoinWritten,
    XdcrStatus,
)


class Client:
    """A synchronous client of one YT HTTP proxy (one reptables engine, or the engines of one cluster).

    ``proxy_url`` is e.g. ``http://127.0.0.1:9012`` (``http://`` is assumed when no scheme is given),
    or the engines of a leader/standby group, as a list or separated by commas: requests go to one of
    them, and move to the leader when an engine answers that it is not (it names the leader, and did
    nothing with the request) or refuses the connection (see ``ClientConfig.resend_to``); a client of
    one URL follows a leader an engine names too;
    ``token`` defaults to ``$YT_TOKEN``; ``timeout`` is per request, in seconds (a long pull may take
    its ``wait_timeout`` plus 15 s whatever the timeout, see :meth:`pull_changes`); ``transport`` is
    passed to ``httpx`` (tests, proxies, retries); ``follow_unlisted=False`` keeps requests (and the
    token) at the URLs given: a leader an engine names elsewhere is not followed (an engine's calls to a
    peer cluster). Each method runs the YT command of the same name and takes YT's parameter names as
    keyword arguments. Use as a context manager, or ``close()``.
    """

    def __init__(self, proxy_url: str | Sequence[str], token: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, follow_unlisted: bool = True) -> None:
        self._config = ClientConfig(proxy_url, token, timeout, follow_unlisted)
        self._timeout = timeout
        # keep-alive connections on http.client (engine/httpconn.py says why), one pool per engine, or
        # httpx with the caller's transport
        self._pools: dict[str, ConnectionPool] = {}
        self._closed = False
        self._http: httpx.Client | None = None
        if transport is not None:
            self._http = httpx.Client(headers=self._config.headers, timeout=self._config.timeout, transport=transport)

    @property
    def proxy_url(self) -> str:
        """The engine requests go to now (with several engines: the leader, as far as the client knows)."""
        return self._config.proxy_url

    def close(self) -> None:
        self._closed = True
        for pool in list(self._pools.values()):
            pool.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _send(self, req: Request) -> Any:
        attempt = 0
        while True:
            url = self._config.proxy_url
            try:
                return result_of(req, self._exchange(url, req))
            except YtError as exc:  # (a TransportError too)
                attempt += 1
                if self._config.resend_to(exc, url, attempt) is None:
                    raise

    def _exchange(self, url: str, req: Request) -> Answer:
        if self._http is None:
            pool = self._pools.get(url) or self._pools.setdefault(
                url, ConnectionPool(url, self._config.headers, timeout=self._timeout))
            if self._closed:
                pool.close()
            try:
                answer: Answer = pool.request(req.method, req.url, headers=req.headers, body=req.body,
                                              timeout=self._config.read_timeout(req))
            except HttpTransportError as exc:
                raise TransportError(url + req.url, exc.cause) from exc.cause
        else:
            try:
                answer = self._http.request(req.method, url + req.url, headers=req.headers, content=req.body,
                                            timeout=self._config.httpx_timeout(req))
            except httpx.TransportError as exc:
                raise TransportError(url + req.url, exc) from exc
        self._config.answered(url)
        return answer

    def call(self, command: str, params: Mapping[str, Any], input: Any = None) -> Any:
        """Run any command. ``input`` is a list of rows or a value, as the command takes; the output
        is returned as the proxy sent it (a structured result stays wrapped, e.g. ``{"value": ...}``).
        """
        if command not in self._config.specs:
            self._config.specs.update(self._send(Build.descriptors()))
        return self._send(Build.call(self._config.specs, command, params, input))

    # -- Cypress --

    def create(self, type: str, path: str | None = None, attributes: dict[str, Any] | None = None,
               recursive: bool = False, ignore_existing: bool = False, force: bool = False) -> str:
        """Create a node (or a ``table_replica``/``table_collocation``, which take no path); returns its id."""
        return self._send(Build.create(type, path, attributes, recursive, ignore_existing, force))

    def get(self, path: str, attributes: builtins.list[str] | None = None) -> Any:
        """A node's value, or an attribute's (``path/@name``): attributed values come as-is, in the
        ``{"$attributes", "$value"}`` form, except a ``@schema``, which comes as a :class:`Schema`.
        """
        return self._send(Build.get(path, attributes))

    def set(self, path: str, value: Any, recursive: bool = False, force: bool = False) -> None:
        self._send(Build.set(path, value, recursive, force))

    def remove(self, path: str, recursive: bool = False, force: bool = False) -> None:
        self._send(Build.remove(path, recursive, force))

    def exists(self, path: str) -> bool:
        return self._send(Build.exists(path))

    def list(self, path: str, attributes: builtins.list[str] | None = None) -> builtins.list[Any]:
        return self._send(Build.list(path, attributes))

    # -- tablets --

    def mount_table(self, path: str, freeze: bool = False) -> None:
        self._send(Build.mount_table(path, freeze))

    def unmount_table(self, path: str, force: bool = False) -> None:
        self._send(Build.unmount_table(path, force))

    def remount_table(self, path: str) -> None:
        """Remount a mounted (or frozen) table, as YT does to apply changed settings; an unmounted one is
        refused (``TabletStateError``)."""
        self._send(Build.by_path("remount_table", path))

    def freeze_table(self, path: str) -> None:
        self._send(Build.by_path("freeze_table", path))

    def unfreeze_table(self, path: str) -> None:
        self._send(Build.by_path("unfreeze_table", path))

    def reshard_table(self, path: str, pivot_keys: builtins.list[builtins.list[Any]] | None = None,
                      tablet_count: int | None = None) -> None:
        self._send(Build.reshard_table(path, pivot_keys, tablet_count))

    def trim_rows(self, path: str, tablet_index: int, trimmed_row_count: int) -> None:
        self._send(Build.trim_rows(path, tablet_index, trimmed_row_count))

    def alter_table(self, path: str, schema: builtins.list[dict[str, Any]] | None = None,
                    upstream_replica_id: str | None = None) -> None:
        """Change a table's ``schema`` (add value columns, relax ``required``: docs/engine.md, "Changing a
        schema"), or, unmounted, the replica it follows (``upstream_replica_id``; ``"0-0-0-0"``: none)."""
        self._send(Build.alter_table(path, schema, upstream_replica_id))

    # -- replicas (docs/replication.md) --

    def alter_table_replica(self, replica_id: str, enabled: bool | None = None, mode: str | None = None,
                            enable_replicated_table_tracker: bool | None = None) -> None:
        """Enable or disable a replica, switch its ``mode`` (a ``ReplicaMode``: ``sync`` or ``async``), or
        let the replicated table tracker own its mode or not; what is None is left as it is. Enabling
        and disabling run in the background: the replica is ``enabling``/``disabling`` meanwhile."""
        self._send(Build.alter_table_replica(replica_id, enabled, mode, enable_replicated_table_tracker))

    def get_in_sync_replicas(self, path: str, timestamp: int,
                             keys: Iterable[Row] | None = None) -> builtins.list[str]:
        """Ids of the replicas of replicated table ``path`` that hold every change up to ``timestamp``
        for ``keys`` (None: for every key, ``all_keys``)."""
        return self._send(Build.get_in_sync_replicas(path, timestamp, keys))

    # -- rows --

    def insert_rows(self, path: str, rows: Iterable[Row], update: bool | None = None,
                    transaction_id: str | None = None, atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool | None = None) -> None:
        self._send(Build.insert_rows(path, rows, update, transaction_id, atomicity, durability,
                                     require_sync_replica))

    def delete_rows(self, path: str, keys: Iterable[Row], transaction_id: str | None = None,
                    atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool | None = None) -> None:
        self._send(Build.delete_rows(path, keys, transaction_id, atomicity, durability, require_sync_replica))

    def lock_rows(self, path: str, keys: Iterable[Row], locks: builtins.list[str] | None = None,
                  lock_type: str | None = None, transaction_id: str | None = None) -> None:
        self._send(Build.lock_rows(path, keys, locks, lock_type, transaction_id))

    def lookup_rows(self, path: str, keys: Iterable[Row], column_names: builtins.list[str] | None = None,
                    timestamp: int | None = None, keep_missing_rows: bool | None = None,
                    transaction_id: str | None = None, include_event_token: bool = False,
                    compare_event_token: str | None = None,
                    response_parameters: dict[str, Any] | None = None) -> builtins.list[dict[str, Any] | None]:
        """The rows with ``keys``, in order; a missing row is skipped, or None with ``keep_missing_rows``.

        ``include_event_token``/``compare_event_token`` fill ``response_parameters`` with the read's
        freshness (``event_token``, ``timestamp``, ``fresh``; docs/streams.md)."""
        return self._send(Build.lookup_rows(path, keys, column_names, timestamp, keep_missing_rows,
                                            transaction_id, include_event_token, compare_event_token,
                                            response_parameters))

    def select_rows(self, query: str, timestamp: int | None = None, transaction_id: str | None = None,
                    output_row_limit: int | None = None, include_event_token: bool = False,
                    compare_event_token: str | None = None,
                    response_parameters: dict[str, Any] | None = None, input_row_limit: int | None = None,
                    fail_on_incomplete_result: bool | None = None) -> builtins.list[dict[str, Any]]:
        """The rows of a query (docs/engine.md, "Query language"); past ``input_row_limit`` or
        ``output_row_limit`` it fails, unless ``fail_on_incomplete_result`` is False."""
        return self._send(Build.select_rows(query, timestamp, transaction_id, output_row_limit,
                                            include_event_token, compare_event_token, response_parameters,
                                            input_row_limit, fail_on_incomplete_result))

    # -- change streams (docs/streams.md) --

    def pull_changes(self, path: str, from_event_token: str | None = None, from_timestamp: int | None = None,
                     max_row_count: int | None = None, wait_timeout: int | None = None) -> PullAnswer:
        """One answer of the change stream of ``path`` after a token or a timestamp (or from now):
        ``{"events", "event_token", "timestamp"}``; waits up to ``wait_timeout`` ms for a change.

        The request's timeout is at least ``wait_timeout`` plus ``LONG_PULL_MARGIN`` (15 s), so a
        long pull on an idle table answers with its heartbeat rather than a transport timeout."""
        return self._send(Build.pull_changes(path, from_event_token, from_timestamp, max_row_count,
                                             wait_timeout))

    def stream_changes(self, path: str, from_event_token: str | None = None, from_timestamp: int | None = None,
                       heartbeats: bool = False, max_row_count: int | None = None,
                       wait_timeout: int | None = None) -> Iterator[ChangeEvent]:
        """Every change of ``path`` after the token or timestamp (or from now), once and in order, as
        it commits; endless. Each event carries its ``event_token``: resume from the last one
        handled. With ``heartbeats`` the idle answers' heartbeat events are yielded too."""
        answer = self.pull_changes(path, from_event_token, from_timestamp, max_row_count, wait_timeout)
        while True:
            for event in answer["events"]:
                if heartbeats or event["kind"] != "heartbeat":
                    yield event
            answer = self.pull_changes(path, answer["event_token"], None, max_row_count, wait_timeout)

    def keep_change_log(self, path: str) -> bool:
        """Make sure the sorted or ordered table at ``path`` keeps a change log (``@enable_change_log``:
        a table nobody streams keeps none) before a stream's start is chosen: changes are logged from
        the switch on. True if it was switched on now. A replicated table always streams its queue."""
        if self.get(f"{path}/@type") == "replicated_table" or self.get(f"{path}/@enable_change_log") is True:
            return False
        self.set(f"{path}/@enable_change_log", True)
        return True

    def register_queue_consumer(self, queue_path: str, consumer_path: str, vital: bool = False,
                                from_timestamp: int | None = None) -> None:
        self._send(Build.register_queue_consumer(queue_path, consumer_path, vital, from_timestamp))

    def unregister_queue_consumer(self, queue_path: str, consumer_path: str) -> None:
        self._send(Build.unregister_queue_consumer(queue_path, consumer_path))

    def list_queue_consumer_registrations(self, queue_path: str) -> builtins.list[ConsumerRegistration]:
        return self._send(Build.list_queue_consumer_registrations(queue_path))

    def pull_consumer(self, consumer_path: str, queue_path: str, max_row_count: int | None = None,
                      wait_timeout: int | None = None) -> PullAnswer:
        """Changes after the consumer's offset (the offset moves only with ``advance_consumer``)."""
        return self._send(Build.pull_consumer(consumer_path, queue_path, max_row_count, wait_timeout))

    def advance_consumer(self, consumer_path: str, queue_path: str, old_offset: str | None,
                         new_offset: str) -> None:
        """Move the consumer's offset to ``new_offset`` if it is ``old_offset`` (None: whatever it is);
        otherwise ``YtError`` 1761 with the current offset."""
        self._send(Build.advance_consumer(consumer_path, queue_path, old_offset, new_offset))

    # -- active-active replication, XDCR (docs/xdcr.md) --

    def dr_status(self) -> XdcrStatus:
        """This cluster's XDCR state: its id, whether it is paused, its connections and tables, each peer's
        state, lag, queue and conflicts, and the tables joining from a snapshot."""
        return self._send(Build.no_parameters("dr_status"))

    def dr_pause(self, wait: bool = True, timeout: int | None = None) -> XdcrStatus:
        """Refuse client writes on this cluster (peers' changes are still applied); with ``wait``, answer
        once every change was delivered to every peer, within ``timeout`` ms (default 60,000)."""
        return self._send(Build.dr_pause(wait, timeout))

    def dr_resume(self) -> XdcrStatus:
        """Take client writes again."""
        return self._send(Build.no_parameters("dr_resume"))

    def dr_reset(self, cluster: str | None = None, force: bool = False) -> XdcrStatus:
        """Stop replicating with ``cluster`` (``force`` required: its undelivered changes are dropped), or
        with every peer (``cluster`` None)."""
        return self._send(Build.dr_reset(cluster, force))

    def dr_drop(self, timeout: int | None = None) -> XdcrStatus:
        """Leave the group: deliver every change (within ``timeout`` ms), make every peer forget this
        cluster, reset."""
        return self._send(Build.dr_drop(timeout))

    def dr_join_begin(self, path: str, source: str | None = None, page_rows: int | None = None,
                      restart: bool = False) -> XdcrJoinProgress:
        """Begin joining XDCR table ``path`` from a snapshot of ``source`` (default: the cluster's preferred
        source, else its first connection), or resume the join begun (``restart``: a new snapshot)."""
        return self._send(Build.dr_join_begin(path, source, page_rows, restart))

    def dr_join_read(self, path: str, page: int) -> XdcrJoinPage:
        """One page of the snapshot being joined, read from the donor through this cluster."""
        return self._send(Build.dr_join_read(path, page))

    def dr_join_write(self, path: str, page: int, entries: builtins.list[Any]) -> XdcrJoinWritten:
        """Load one page of the snapshot (the ``entries`` of :meth:`dr_join_read`), exactly once."""
        return self._send(Build.dr_join_write(path, page, entries))

    def dr_join_finish(self, path: str) -> XdcrJoinFinished:
        """Every page loaded: the table is a member, and the peers ship it their changes after the snapshot."""
        return self._send(Build.by_path("dr_join_finish", path))

    # -- timestamps and transactions --

    def generate_timestamp(self) -> int:
        return self._send(Build.generate_timestamp())

    def start_transaction(self, type: str = "tablet", atomicity: str | None = None,
                          durability: str | None = None, timeout: int | None = None,
                          start_timestamp: int | None = None) -> str:
        """Start a transaction (``timeout`` in milliseconds); returns its id. A non-atomic one
        (``atomicity="none"``) may take the client's ``start_timestamp`` (checked against the clock)."""
        return self._send(Build.start_transaction(type, atomicity, durability, timeout, start_timestamp))

    def ping_transaction(self, transaction_id: str) -> None:
        self._send(Build.by_transaction_id("ping_transaction", transaction_id))

    def commit_transaction(self, transaction_id: str) -> int:
        """Commit a transaction; returns its commit timestamp."""
        return self._send(Build.commit_transaction(transaction_id))

    def abort_transaction(self, transaction_id: str) -> None:
        self._send(Build.by_transaction_id("abort_transaction", transaction_id))

    @contextmanager
    def transaction(self, atomicity: str | None = None, durability: str | None = None) -> Iterator[str]:
        """A tablet transaction: yields its id, commits if the block succeeds, aborts if it raises.

        Should the abort fail too, the block's exception still propagates (with a note saying so).
        """
        transaction_id = self.start_transaction(atomicity=atomicity, durability=durability)
        try:
            yield transaction_id
        except BaseException as exc:
            try:
                self.abort_transaction(transaction_id)
            except YtError as abort_error:
                exc.add_note(f"aborting transaction {transaction_id} failed too: {abort_error}")
            raise
        self.commit_transaction(transaction_id)
