"""Who is calling: peer credentials, one per ordered pair of clusters, and cell tags.

A cluster's API token is its administrator's key. Handing it to the peers that push rows into
that cluster would let any one of them read and change everything there — and forge the rows of
replicas that belong to *other* meta-clusters. So cluster-to-cluster calls (``/internal/v1``)
authenticate with a **peer credential** instead: the credential with which cluster ``A`` calls
cluster ``B`` is ``peer:A:<mac>``, where ``<mac>`` is an HMAC-SHA256, keyed with ``B``'s API token,
of the caller's name. ``B`` verifies it without any stored list (it recomputes the MAC), learns the
caller's name from it, and accepts it only on ``/internal/v1`` — never on the API. ``A`` stores it
in its ``//sys/clusters/B/token``; whoever reads it there (a dump of ``A``'s disk) can act as ``A``
towards ``B`` and nothing more. Whoever holds ``B``'s API token can mint credentials for ``B``:
the operator (it reads the TableCluster Secrets) and ``reptables peer-credential``.

Knowing the caller is half the check; the other half is knowing who may write a given replica
table. As in YTsaurus, an object id carries the **cell tag** of the cluster that created it (the
high 16 bits of its third part), and a replica's id is created by its meta-cluster. A replica
table's ``upstream_replica_id`` therefore names its meta-cluster, and a push or prepare for it is
accepted only from the cluster whose cell tag that is. Cell tags are derived from cluster names
(:func:`cell_tag`), so every engine computes the same one without configuration; two names of one
directory that share a tag are refused when the directory is written.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib

PEER_PREFIX = "peer:"
#: hex digits of a credential's MAC (SHA-256)
_MAC_LENGTH = 64
#: the tag of ids made before cell tags existed: no cluster has it
NO_CELL_TAG = 0


def peer_credential(target_token: str, caller: str) -> str:
    """The credential with which cluster ``caller`` calls the cluster whose API token is ``target_token``."""
    mac = hmac.new(target_token.encode(), f"reptables-peer:{caller}".encode(), hashlib.sha256).hexdigest()
    return f"{PEER_PREFIX}{caller}:{mac}"


def is_peer_credential(value: str) -> bool:
    return value.startswith(PEER_PREFIX)


def verify_peer_credential(own_token: str, value: str) -> str | None:
    """The caller's name if ``value`` is a peer credential minted with ``own_token``, else None."""
    if not value.startswith(PEER_PREFIX):
        return None
    caller, sep, mac = value[len(PEER_PREFIX):].rpartition(":")
    if not sep or not caller or len(mac) != _MAC_LENGTH:
        return None
    if hmac.compare_digest(peer_credential(own_token, caller).encode(), value.encode()):
        return caller
    return None


def cell_tag(cluster_name: str) -> int:
    """The cell tag of a cluster: 1..0xFFFE, derived from its name."""
    return zlib.crc32(cluster_name.encode()) % 0xFFFE + 1


def made_by(object_id: str, cluster_name: str) -> bool:
    """Whether the object with this id was made by cluster ``cluster_name`` (its cell tag says so):
    the one rule behind "only a replica's meta-cluster writes or reads its replica table"."""
    return id_cell_tag(object_id) == cell_tag(cluster_name)


def id_cell_tag(object_id: str) -> int:
    """The cell tag an object id carries (:data:`NO_CELL_TAG` for ids without one or malformed ids)."""
    parts = object_id.split("-")
    if len(parts) != 4:
        return NO_CELL_TAG
    try:
        return (int(parts[2], 16) >> 16) & 0xFFFF
    except ValueError:
        return NO_CELL_TAG
