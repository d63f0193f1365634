"""The command table: each YT command (and its descriptor at ``GET /api/v4``) as one call on the node.

A handler only translates parameters into one call of :class:`~reptables.engine.node.Cluster`;
the descriptors (input/output kind, volatile, heavy) tell the official client which HTTP method
and formats each command uses, so they must be right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yt.yson as yson

from .. import yson_util
from ..errors import ErrorCode, YtError
from ..node import Cluster
from .formats import check_unicode
from .inline import always, inline_lookup, inline_write
from .params import _bool, _int, _p, _path, _required_str, _rows, _str_list, _tx
from .results import WithParameters
from .streams import pull_answer


@dataclass(frozen=True)
class Command:
    name: str
    input_type: str | None
    output_type: str | None
    is_volatile: bool
    is_heavy: bool
    handler: Callable[[Cluster, dict[str, Any], Any], Any]
    #: whether a request may run on the event loop itself (see ``inline.py``); None: never
    inline: Callable[[Cluster, dict[str, Any], int], bool] | None = None

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "input_type": self.input_type or "null",
                "output_type": self.output_type or "null", "is_volatile": self.is_volatile,
                "is_heavy": self.is_heavy}



def _freshness(p: dict[str, Any]) -> dict[str, Any]:
    """The change-stream freshness parameters of a read (docs/streams.md)."""
    return {"include_event_token": _bool(p, "include_event_token"),
            "compare_event_token": _p(p, "compare_event_token")}


def _with(result: Any, parameters: dict[str, Any]) -> Any:
    return WithParameters(result, parameters) if parameters else result


COMMANDS: dict[str, Command] = {}
#: a pseudo-parameter the protocol layer adds: the decoded request body's size in bytes
_BODY_BYTES = "\0body_bytes"


def _command(name: str, input_type: str | None, output_type: str | None, volatile: bool, heavy: bool = False,
             aliases: tuple[str, ...] = (),
             inline: Callable[[Cluster, dict[str, Any], int], bool] | None = None,
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[[Cluster, dict[str, Any], Any], Any]) -> Callable[..., Any]:
        for n in (name, *aliases):
            COMMANDS[n] = Command(n, input_type, output_type, volatile, heavy, fn, inline)
        return fn
    return register



@_command("create", None, "structured", True)
def _create(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    kind = _required_str(p, "type")
    path = p.get("path") if kind in ("table_replica", "table_collocation") else _path(p)
    node_id = c.nodes.create(kind, path, p.get("attributes"), _bool(p, "recursive"),
                       _bool(p, "ignore_existing"), _bool(p, "force"))
    return {"node_id": node_id}


@_command("get", None, "structured", False)
def _get(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.get(_path(p), _str_list(p, "attributes"))}


@_command("set", "structured", None, True)
def _set(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.nodes.set(_path(p), body, _bool(p, "recursive"), _bool(p, "force"))


@_command("remove", None, None, True)
def _remove(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.nodes.remove(_path(p), _bool(p, "recursive"), _bool(p, "force"))


@_command("exists", None, "structured", False)
def _exists(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.exists(_path(p))}


@_command("list", None, "structured", False)
def _list(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.list(_path(p), _str_list(p, "attributes"))}


@_command("mount_table", None, None, True)
def _mount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.mount_table(_path(p), _bool(p, "freeze"))


@_command("unmount_table", None, None, True)
def _unmount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.unmount_table(_path(p), _bool(p, "force"))


@_command("remount_table", None, None, True)
def _remount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.remount_table(_path(p))


@_command("freeze_table", None, None, True)
def _freeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.freeze_table(_path(p))


@_command("unfreeze_table", None, None, True)
def _unfreeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.unfreeze_table(_path(p))


@_command("reshard_table", None, None, True)
def _reshard(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.reshard_table(_path(p), _p(p, "pivot_keys"), _p(p, "tablet_count"))


@_command("trim_rows", None, None, True)
def _trim(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.trim_rows(_path(p), _int(p, "tablet_index"), _int(p, "trimmed_row_count"))


@_command("alter_table", None, None, True)
def _alter_table(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.alter_table(_path(p), _p(p, "upstream_replica_id"), _p(p, "schema"))


@_command("alter_table_replica", None, None, True)
def _alter_table_replica(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    replica_id = _required_str(p, "replica_id")
    enabled = _p(p, "enabled")
    tracker = _p(p, "enable_replicated_table_tracker")
    if tracker is not None:
        c.nodes.set(f"#{replica_id.lstrip('#')}/@enable_replicated_table_tracker", bool(tracker))
    c.tablets.alter_table_replica(replica_id, None if enabled is None else _bool(p, "enabled"), _p(p, "mode"))


@_command("get_in_sync_replicas", "tabular", "structured", False)
def _get_in_sync_replicas(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    keys = None if _bool(p, "all_keys") else _rows(body)
    return c.tablets.get_in_sync_replicas(_path(p), _int(p, "timestamp"), keys)


@_command("generate_timestamp", None, "structured", False, inline=always)
def _generate_timestamp(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"timestamp": yson.YsonUint64(c.rows.generate_timestamp())}


@_command("start_transaction", None, "structured", True, aliases=("start_tx",))
def _start_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"transaction_id": c.rows.start_transaction(
        str(_p(p, "type", "tablet")), _p(p, "atomicity"), _p(p, "durability"), _int(p, "timeout"),
        _int(p, "start_timestamp"))}


@_command("ping_transaction", None, None, True, aliases=("ping_tx",))
def _ping_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.ping_transaction(_required_str(p, "transaction_id"))


@_command("commit_transaction", None, "structured", True, aliases=("commit_tx",))
def _commit_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"commit_timestamp": yson.YsonUint64(c.rows.commit_transaction(_required_str(p, "transaction_id")))}


@_command("abort_transaction", None, None, True, aliases=("abort_tx",))
def _abort_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.abort_transaction(_required_str(p, "transaction_id"))


@_command("insert_rows", "tabular", None, True, heavy=True, inline=inline_write)
def _insert_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.insert_rows(_path(p), _rows(body), _bool(p, "update"), _tx(p), _p(p, "atomicity"), _p(p, "durability"),
                  _bool(p, "require_sync_replica", True), input_bytes=p.get(_BODY_BYTES))


@_command("delete_rows", "tabular", None, True, heavy=True, inline=inline_write)
def _delete_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.delete_rows(_path(p), _rows(body), _tx(p), _p(p, "atomicity"), _p(p, "durability"),
                  _bool(p, "require_sync_replica", True))


@_command("lock_rows", "tabular", None, True, heavy=True)
def _lock_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.lock_rows(_path(p), _rows(body), _tx(p), _str_list(p, "locks"), str(_p(p, "lock_type", "shared_strong")))


@_command("lookup_rows", "tabular", "tabular", False, heavy=True, inline=inline_lookup)
def _lookup_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    parameters: dict[str, Any] = {}
    rows = c.rows.lookup_rows(_path(p), _rows(body), _str_list(p, "column_names"), _int(p, "timestamp"),
                         _bool(p, "keep_missing_rows"), _tx(p), **_freshness(p), response_parameters=parameters)
    return _with(rows, parameters)


@_command("select_rows", None, "tabular", False, heavy=True)
def _select_rows(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    parameters: dict[str, Any] = {}
    rows = c.rows.select_rows(_p(p, "query"), _int(p, "timestamp"), _tx(p), _int(p, "input_row_limit"),
                         _int(p, "output_row_limit"), _bool(p, "fail_on_incomplete_result", True), **_freshness(p),
                         response_parameters=parameters)
    return _with(rows, parameters)


# -- change streams (docs/streams.md) ------------------------------------------------------------------

@_command("pull_changes", None, "structured", False)
def _pull_changes(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return pull_answer(c.streams.pull_changes(_path(p), _p(p, "from_event_token"), _int(p, "from_timestamp"),
                                              _int(p, "max_row_count"), _int(p, "wait_timeout"), event_texts=True))


@_command("register_queue_consumer", None, None, True)
def _register_queue_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.register_queue_consumer(_required_str(p, "queue_path"), _required_str(p, "consumer_path"),
                                      _bool(p, "vital"), _int(p, "from_timestamp"))


@_command("unregister_queue_consumer", None, None, True)
def _unregister_queue_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.unregister_queue_consumer(_required_str(p, "queue_path"), _required_str(p, "consumer_path"))


@_command("list_queue_consumer_registrations", None, "structured", False)
def _list_queue_consumer_registrations(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.streams.list_queue_consumer_registrations(_required_str(p, "queue_path"))}


@_command("pull_consumer", None, "structured", False)
def _pull_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return pull_answer(c.streams.pull_consumer(_required_str(p, "consumer_path"), _required_str(p, "queue_path"),
                                               _int(p, "max_row_count"), _int(p, "wait_timeout")))


@_command("advance_consumer", None, None, True)
def _advance_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.advance_consumer(_required_str(p, "consumer_path"), _required_str(p, "queue_path"), _p(p, "old_offset"),
                       _required_str(p, "new_offset"))



# -- active-active replication, XDCR (docs/xdcr.md) ---------------------------------------------------

def _timeout(p: dict[str, Any]) -> float:
    value = _int(p, "timeout", 60_000)
    if not 0 < value <= 3_600_000:
        raise YtError(f"Invalid timeout {value}: expected milliseconds in (0, 3600000]",
                      code=ErrorCode.INVALID_PARAMETER)
    return value / 1000.0


@_command("dr_pause", None, "structured", True)
def _dr_pause(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_pause(_bool(p, "wait", True), _timeout(p))


@_command("dr_resume", None, "structured", True)
def _dr_resume(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_resume()


@_command("dr_reset", None, "structured", True)
def _dr_reset(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    cluster = _p(p, "cluster")
    if cluster is not None and not isinstance(cluster, str):
        raise YtError("Parameter \"cluster\" must be a cluster name", code=ErrorCode.INVALID_PARAMETER)
    return c.xdcr.dr_reset(cluster, _bool(p, "force"))


@_command("dr_drop", None, "structured", True)
def _dr_drop(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_drop(_timeout(p))


@_command("dr_join_begin", None, "structured", True)
def _dr_join_begin(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    source = _p(p, "source")
    if source is not None and not isinstance(source, str):
        raise YtError("Parameter \"source\" must be a cluster name", code=ErrorCode.INVALID_PARAMETER)
    return c.xdcr.dr_join_begin(_path(p), source, _int(p, "page_rows", 5000), _bool(p, "restart"))


@_command("dr_join_read", None, "structured", False)
def _dr_join_read(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_join_read(_path(p), _int(p, "page"))


@_command("dr_join_write", "structured", "structured", True)
def _dr_join_write(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    entries = yson_util.to_python(body)
    check_unicode(entries)  # (rows go to storage as they are: a lone surrogate cannot be stored)
    return c.xdcr.dr_join_write(_path(p), _int(p, "page"), entries)


@_command("dr_join_finish", None, "structured", True)
def _dr_join_finish(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_join_finish(_path(p))


@_command("dr_status", None, "structured", False)
def _dr_status(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_status()
