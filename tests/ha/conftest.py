"""The HA PostgreSQL of tests/ha: one Patroni cluster (etcd, a primary and a synchronous standby).

Starting it takes initdb, a clone and Patroni's first loops (10-20 s on 2 cores), so the tests of a
module share one, made only if a test asks for it. Module scope, not session scope: a session under
pytest-xdist is a worker's whole run, and the cluster (two Patroni loops a second, two servers)
would stay up beside every module the worker runs after this one. Keep the tests that use it in one
module (test_postgres_failover.py), so that a run starts one cluster. Each test gets it with a
primary and a synchronous standby (a test before it may have killed a primary) and makes its own
databases on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reptables.testing.patroni import PatroniCluster


@pytest.fixture(scope="module")
def patroni_cluster() -> Iterator[PatroniCluster]:
    """The module's Patroni cluster, stopped by pid and its directories removed at the end."""
    with PatroniCluster() as cluster:
        yield cluster


@pytest.fixture
def patroni(patroni_cluster: PatroniCluster) -> PatroniCluster:
    """The Patroni cluster with a primary and a streaming synchronous standby (commits acknowledged)."""
    patroni_cluster.wait_healthy(60)
    return patroni_cluster
