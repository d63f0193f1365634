"""Test support shared by the test suite, the benchmarks and the fault-injection runs.

Why a package of its own, in the ``reptables`` namespace: the suite (tests/), the benchmarks
(benchmarks/) and the long fault runs (hack/chaos.sh) all start real engines on loopback, wire them
into clusters and wait on them, and must do it the same way; nothing may import from tests/, so
what they share lives here. The product never imports it (an import-linter contract says so).

* :mod:`reptables.testing.engines`: one engine (:class:`EngineProcess`) and a set of engines that
  know each other (:class:`EngineSet`: replicated tables, XDCR groups);
* :mod:`reptables.testing.waits`: the one bounded wait (:func:`wait_for`);
* :mod:`reptables.testing.service`: a Kubernetes Service in front of a leader/standby group, on
  loopback (:class:`~reptables.testing.service.LeaderService`: readiness is leadership).
"""

from .engines import KV_SCHEMA, TEST_TOKEN, USERS_SCHEMA, EngineProcess, EngineSet, free_port
from .waits import POLL_INTERVAL_S, WaitTimeout, wait_for

__all__ = ["KV_SCHEMA", "POLL_INTERVAL_S", "TEST_TOKEN", "USERS_SCHEMA", "EngineProcess", "EngineSet", "WaitTimeout",
           "free_port", "wait_for"]
