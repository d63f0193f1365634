"""Three real engine processes that know each other: a meta-cluster and two replica clusters.

``ClusterSet`` is the harness of ``reptables.testing`` (``EngineSet``) as these tests name it: the
engines ``primary``, ``remote_0`` and ``remote_1`` on free loopback ports, the same
``//sys/clusters`` directory in each, and helpers that build a replicated table with replicas the
way a user would (replica objects on the meta-cluster, replica tables with ``upstream_replica_id``
on the replica clusters, enable). ``SCHEMA`` and ``wait_for`` are re-exported for the modules that
import them from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reptables.testing import KV_SCHEMA, EngineSet, wait_for

__all__ = ["SCHEMA", "ClusterSet", "clusters", "wait_for"]

SCHEMA = KV_SCHEMA
ClusterSet = EngineSet


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[ClusterSet]:
    cs = ClusterSet(tmp_path).start()
    try:
        yield cs
    finally:
        cs.stop()
