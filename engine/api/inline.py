"""The one rule of what runs on the event loop.

Handing a request to a worker thread and back costs ~0.4 ms here, more than a point lookup or a
one-row commit itself. Small requests that cannot wait on anything - no other cluster (replicated
tables), no in-flight commit (reads at a timestamp), no busy writer - run on the event loop
instead; everything else, and anything big, runs in the thread pool so the loop stays free. A
request that could block on a lock or on the network must never run here: it would stop every
other request of the engine (the deadlock a prepare waiting for an earlier decision once caused).
"""

from __future__ import annotations

from typing import Any

from ..node import Cluster
from .params import arg_tx

#: cluster-to-cluster calls that never wait for another cluster (so may run on the event loop)
_INLINE_INTERNAL = frozenset({"prepare", "commit", "abort", "push", "transaction_status"})


def inline_lookup(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    return (body_bytes <= c.config.inline_body_bytes and p.get("timestamp") is None and arg_tx(p) is None
            and c.tables.is_plain_table(p.get("path")))


def inline_write(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    # inside a transaction a write is only buffered; else it commits, and must not wait for the writer
    return (body_bytes <= c.config.inline_body_bytes and c.tables.is_plain_table(p.get("path"))
            and (arg_tx(p) is not None or not c.storage.write_busy()))


def always(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    return True


def inline_internal(c: Cluster, method: str, body: dict[str, Any], body_bytes: int) -> bool:
    """Small prepares and commits of sync replica writes are on the latency path of every write to
    the meta-cluster: on the event loop, unless they would wait for the writer or for a decision."""
    return (method in _INLINE_INTERNAL and body_bytes <= c.config.inline_body_bytes
            and not c.storage.write_busy()
            and not (method == "prepare" and c.replication.prepare_may_wait(body)))
