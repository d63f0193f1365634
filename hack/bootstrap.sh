#!/usr/bin/env bash
# Sourced by hack/up.sh and hack/test.sh: make .venv and install reptables (with the test and spark
# extras) into it.
# Needs python3 >= 3.11 with venv; Python packages come from PyPI, the rest from Debian's packages
# (apt-get, as root or with sudo) when this machine lacks them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
# PostgreSQL 15 server binaries (benchmarks and the PostgreSQL peer) come from Debian's packages
if [ ! -x /usr/lib/postgresql/15/bin/initdb ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    postgresql-15 postgresql-client-15 >/dev/null
fi
# Java 17 or later runs local Spark (pyspark, the "spark" extra) in the tests of reptables.sparkapps
if ! command -v java >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    openjdk-17-jre-headless >/dev/null
fi
# Redis (Debian's redis-server) backs the cache-invalidation tests of change streams (reptables.cache)
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    redis-server >/dev/null
fi
# network namespaces, nftables and tc make the faults of the fault runs (hack/chaos.sh, tests/chaos)
if { ! command -v nft >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; } && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    iproute2 nftables >/dev/null
fi
# Patroni and etcd (Debian's patroni, etcd-server, etcd-client) make the HA PostgreSQL of tests/ha
# (reptables.testing.patroni: a primary and a synchronous standby, failed over under the engines).
# The tests start their own etcd and Patroni on free loopback ports; on a machine with systemd the
# etcd-server package also enables and starts a system etcd on 127.0.0.1:2379, which they do not use
if { ! command -v patroni >/dev/null 2>&1 || ! command -v etcd >/dev/null 2>&1; } && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    patroni etcd-server etcd-client >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# strict editable mode links every file of the package folders under build/: mypy and lint-imports
# then resolve reptables.* like any installed package (re-run after adding a module)
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,spark]' --config-settings editable_mode=strict
# the bytecode of the project's own modules, written here once: where PYTHONDONTWRITEBYTECODE is set
# (as on the machines this project is built on), every engine, CLI and Spark job process would
# compile them again at start
.venv/bin/python -m compileall -q -j 0 build/__editable__.reptables-*/reptables >/dev/null
