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
from .params import arg, arg_bool, arg_int, arg_path, arg_rows, arg_str, arg_str_list, arg_tx
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
    return {"include_event_token": arg_bool(p, "include_event_token"),
            "compare_event_token": arg(p, "compare_event_token")}


def _with(result: Any, parameters: dict[str, Any]) -> Any:
    return WithParameters(result, parameters) if parameters else result


COMMANDS: dict[str, Command] = {}
#: a pseudo-parameter the protocol layer adds: the decoded request body's size in bytes
BODY_BYTES = "\0body_bytes"


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
    kind = arg_str(p, "type")
    path = p.get("path") if kind in ("table_replica", "table_collocation") else arg_path(p)
    node_id = c.nodes.create(kind, path, p.get("attributes"), arg_bool(p, "recursive"),
                       arg_bool(p, "ignore_existing"), arg_bool(p, "force"))
    return {"node_id": node_id}


@_command("get", None, "structured", False)
def _get(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.get(arg_path(p), arg_str_list(p, "attributes"))}


@_command("set", "structured", None, True)
def _set(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.nodes.set(arg_path(p), body, arg_bool(p, "recursive"), arg_bool(p, "force"))


@_command("remove", None, None, True)
def _remove(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.nodes.remove(arg_path(p), arg_bool(p, "recursive"), arg_bool(p, "force"))


@_command("exists", None, "structured", False)
def _exists(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.exists(arg_path(p))}


@_command("list", None, "structured", False)
def _list(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.reads.list(arg_path(p), arg_str_list(p, "attributes"))}


@_command("mount_table", None, None, True)
def _mount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.mount_table(arg_path(p), arg_bool(p, "freeze"))


@_command("unmount_table", None, None, True)
def _unmount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.unmount_table(arg_path(p), arg_bool(p, "force"))


@_command("remount_table", None, None, True)
def _remount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.remount_table(arg_path(p))


@_command("freeze_table", None, None, True)
def _freeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.freeze_table(arg_path(p))


@_command("unfreeze_table", None, None, True)
def _unfreeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.unfreeze_table(arg_path(p))


@_command("reshard_table", None, None, True)
def _reshard(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.reshard_table(arg_path(p), arg(p, "pivot_keys"), arg(p, "tablet_count"))


@_command("trim_rows", None, None, True)
def _trim(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.trim_rows(arg_path(p), arg_int(p, "tablet_index"), arg_int(p, "trimmed_row_count"))


@_command("alter_table", None, None, True)
def _alter_table(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.tablets.alter_table(arg_path(p), arg(p, "upstream_replica_id"), arg(p, "schema"))


@_command("alter_table_replica", None, None, True)
def _alter_table_replica(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    replica_id = arg_str(p, "replica_id")
    enabled = arg(p, "enabled")
    tracker = arg(p, "enable_replicated_table_tracker")
    if tracker is not None:
        c.nodes.set(f"#{replica_id.lstrip('#')}/@enable_replicated_table_tracker", bool(tracker))
    c.tablets.alter_table_replica(replica_id, None if enabled is None else arg_bool(p, "enabled"), arg(p, "mode"))


@_command("get_in_sync_replicas", "tabular", "structured", False)
def _get_in_sync_replicas(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    keys = None if arg_bool(p, "all_keys") else arg_rows(body)
    return c.tablets.get_in_sync_replicas(arg_path(p), arg_int(p, "timestamp"), keys)


@_command("generate_timestamp", None, "structured", False, inline=always)
def _generate_timestamp(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"timestamp": yson.YsonUint64(c.rows.generate_timestamp())}


@_command("start_transaction", None, "structured", True, aliases=("start_tx",))
def _start_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"transaction_id": c.rows.start_transaction(
        str(arg(p, "type", "tablet")), arg(p, "atomicity"), arg(p, "durability"), arg_int(p, "timeout"),
        arg_int(p, "start_timestamp"))}


@_command("ping_transaction", None, None, True, aliases=("ping_tx",))
def _ping_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.ping_transaction(arg_str(p, "transaction_id"))


@_command("commit_transaction", None, "structured", True, aliases=("commit_tx",))
def _commit_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"commit_timestamp": yson.YsonUint64(c.rows.commit_transaction(arg_str(p, "transaction_id")))}


@_command("abort_transaction", None, None, True, aliases=("abort_tx",))
def _abort_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.rows.abort_transaction(arg_str(p, "transaction_id"))


@_command("insert_rows", "tabular", None, True, heavy=True, inline=inline_write)
def _insert_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.insert_rows(arg_path(p), arg_rows(body), arg_bool(p, "update"), arg_tx(p), arg(p, "atomicity"),
                       arg(p, "durability"), arg_bool(p, "require_sync_replica", True), input_bytes=p.get(BODY_BYTES))


@_command("delete_rows", "tabular", None, True, heavy=True, inline=inline_write)
def _delete_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.delete_rows(arg_path(p), arg_rows(body), arg_tx(p), arg(p, "atomicity"), arg(p, "durability"),
                  arg_bool(p, "require_sync_replica", True))


@_command("lock_rows", "tabular", None, True, heavy=True)
def _lock_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.rows.lock_rows(arg_path(p), arg_rows(body), arg_tx(p), arg_str_list(p, "locks"),
                     str(arg(p, "lock_type", "shared_strong")))


@_command("lookup_rows", "tabular", "tabular", False, heavy=True, inline=inline_lookup)
def _lookup_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    parameters: dict[str, Any] = {}
    rows = c.rows.lookup_rows(arg_path(p), arg_rows(body), arg_str_list(p, "column_names"), arg_int(p, "timestamp"),
                         arg_bool(p, "keep_missing_rows"), arg_tx(p), **_freshness(p), response_parameters=parameters)
    return _with(rows, parameters)


@_command("select_rows", None, "tabular", False, heavy=True)
def _select_rows(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    parameters: dict[str, Any] = {}
    rows = c.rows.select_rows(arg(p, "query"), arg_int(p, "timestamp"), arg_tx(p), arg_int(p, "input_row_limit"),
                              arg_int(p, "output_row_limit"), arg_bool(p, "fail_on_incomplete_result", True),
                              **_freshness(p), response_parameters=parameters)
    return _with(rows, parameters)


# -- change streams (docs/streams.md) ------------------------------------------------------------------

@_command("pull_changes", None, "structured", False)
def _pull_changes(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    answer = c.streams.pull_changes(arg_path(p), arg(p, "from_event_token"), arg_int(p, "from_timestamp"),
                                    arg_int(p, "max_row_count"), arg_int(p, "wait_timeout"), event_texts=True)
    return pull_answer(answer)


@_command("register_queue_consumer", None, None, True)
def _register_queue_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.register_queue_consumer(arg_str(p, "queue_path"), arg_str(p, "consumer_path"),
                                      arg_bool(p, "vital"), arg_int(p, "from_timestamp"))


@_command("unregister_queue_consumer", None, None, True)
def _unregister_queue_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.unregister_queue_consumer(arg_str(p, "queue_path"), arg_str(p, "consumer_path"))


@_command("list_queue_consumer_registrations", None, "structured", False)
def _list_queue_consumer_registrations(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.streams.list_queue_consumer_registrations(arg_str(p, "queue_path"))}


@_command("pull_consumer", None, "structured", False)
def _pull_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return pull_answer(c.streams.pull_consumer(arg_str(p, "consumer_path"), arg_str(p, "queue_path"),
                                               arg_int(p, "max_row_count"), arg_int(p, "wait_timeout")))


@_command("advance_consumer", None, None, True)
def _advance_consumer(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.streams.advance_consumer(arg_str(p, "consumer_path"), arg_str(p, "queue_path"), arg(p, "old_offset"),
                       arg_str(p, "new_offset"))



# -- active-active replication, XDCR (docs/xdcr.md) ---------------------------------------------------

def _timeout(p: dict[str, Any]) -> float:
    value = arg_int(p, "timeout", 60_000)
    if not 0 < value <= 3_600_000:
        raise YtError(f"Invalid timeout {value}: expected milliseconds in (0, 3600000]",
                      code=ErrorCode.INVALID_PARAMETER)
    return value / 1000.0


@_command("dr_pause", None, "structured", True)
def _dr_pause(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_pause(arg_bool(p, "wait", True), _timeout(p))


@_command("dr_resume", None, "structured", True)
def _dr_resume(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_resume()


@_command("dr_reset", None, "structured", True)
def _dr_reset(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    cluster = arg(p, "cluster")
    if cluster is not None and not isinstance(cluster, str):
        raise YtError("Parameter \"cluster\" must be a cluster name", code=ErrorCode.INVALID_PARAMETER)
    return c.xdcr.dr_reset(cluster, arg_bool(p, "force"))


@_command("dr_drop", None, "structured", True)
def _dr_drop(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_drop(_timeout(p))


@_command("dr_join_begin", None, "structured", True)
def _dr_join_begin(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    source = arg(p, "source")
    if source is not None and not isinstance(source, str):
        raise YtError("Parameter \"source\" must be a cluster name", code=ErrorCode.INVALID_PARAMETER)
    return c.xdcr.dr_join_begin(arg_path(p), source, arg_int(p, "page_rows", 5000), arg_bool(p, "restart"))


@_command("dr_join_read", None, "structured", False)
def _dr_join_read(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_join_read(arg_path(p), arg_int(p, "page"))


@_command("dr_join_write", "structured", "structured", True)
def _dr_join_write(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    entries = yson_util.to_python(body)
    check_unicode(entries)  # (rows go to storage as they are: a lone surrogate cannot be stored)
    return c.xdcr.dr_join_write(arg_path(p), arg_int(p, "page"), entries)


@_command("dr_join_finish", None, "structured", True)
def _dr_join_finish(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_join_finish(arg_path(p))


@_command("dr_status", None, "structured", False)
def _dr_status(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.xdcr.dr_status()
