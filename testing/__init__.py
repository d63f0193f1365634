"""Test support shared by the test suite, the benchmarks and the fault-injection runs.

Why a package of its own, in the ``reptables`` namespace: the suite (tests/), the benchmarks
(benchmarks/) and the long fault runs (hack/chaos.sh) all start real engines on loopback, wire them
into clusters and wait on them, and must do it the same way; nothing may import from tests/, so
what they share lives here. The product never imports it (an import-linter contract says so).
"""
