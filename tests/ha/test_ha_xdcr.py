"""An XDCR group one of whose members is a leader engine and a standby over PostgreSQL, under writes on
every member, and the member's leader SIGKILLed, or paused past its lease (issue 24, item 4).

The group: members ``a``, ``b`` and ``c`` (``--cluster-id`` 1-3) sharing the XDCR table
``//home/users``. Member ``a`` is two engines over one database of the run's PostgreSQL server
(``--standby``, docs/ha.md); ``b`` and ``c`` are single engines on SQLite. No Service fronts ``a``:
the directories of ``b`` and ``c`` name both of its engines (``proxy_url`` a list), and their calls
find the leader by themselves (peers/directory.py). Beside the group, two replicated tables make
``a`` both ends of two-phase commits:

* ``//tmp/orders`` on ``a`` (the meta-cluster) with a *sync* replica on ``b`` and an async one on ``c``;
* ``//tmp/inbox`` on ``b`` with a *sync* replica on ``a`` (``b`` prepares on ``a``) and an async one
  (``//tmp/inbox_async``, pushed to ``a`` by ``b``'s replicator).

Writers insert one new key per commit on every member and table, through clients given every engine
of the member (and update a few shared keys of the XDCR table, which conflicts). After the fault:

* every acknowledged write is on every member (XDCR) or replica exactly once: one event of its
  change stream there (a change applied twice would show twice), with the value written;
* nothing answered with an error is anywhere, and nothing sent to a replaced leader;
* the group converges: the three members hold the same rows, and ``dr_status`` shows every pair
  ``connected`` with nothing queued;
* the conflict log is consistent: conflicts only on the shared keys (a change applied twice would
  conflict with itself), all ``DIVERGENCE`` C;
* ``//sys/clusters`` of ``b`` and ``c`` did not change: the new leader was found through the same
  entries (pushes, prepares, XDCR batches, and the questions about transactions held in doubt).

The primary kill of ``a``'s database is in test_postgres_failover.py, the module of the run's one
Patroni cluster (tests/ha/conftest.py says why there is one). The set-up, the writers and the checks
are tests/ha/xdcr_load.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.storage.leadership import EXIT_STEPPED_DOWN
from reptables.testing import EngineSet
from tests.ha.xdcr_load import MEMBERS, OLD_LEADER_KEYS, Load, build, check_group, directories, raw_writes, send_raw


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineSet]:
    base: Path = tmp_path_factory.mktemp("ha-xdcr")
    with EngineSet(base, names=MEMBERS, cluster_ids=True, standbys={"a": 1}, client_timeout=30,
                   start_timeout=60) as engines:
        yield build(engines)


@pytest.fixture
def healthy(group: EngineSet) -> EngineSet:
    """The group with both engines of ``a`` up (a test before may have killed one) and a leader."""
    group.revive("a")
    group.leader("a", 60)
    return group


# -- the faults ------------------------------------------------------------------------------------------


def test_xdcr_member_survives_its_leader_killed(healthy: EngineSet) -> None:
    group = healthy
    before = directories(group)
    assert before["b"]["a"]["proxy_url"] == [e.url for e in group.group("a")]  # no Service: both engines
    old = group.leader("a")
    with Load(group, 1) as load:
        load.acked_after(20, 60)
        fault = time.monotonic()
        old.kill()
        new = group.leader("a", 30)
        assert new is not old
        # writes acknowledged by the new leader on every table; b's two-phase commits with it too
        load.acked_after(20, 60)
        took = load.first_ack_after(fault, new.url)
        print(f"\nSIGKILL: the new leader of a acknowledged a write {took:.2f} s after the kill")
        assert took < 20, f"the takeover took {took:.1f} s"
    check_group(group, load, before)


def test_xdcr_member_leader_paused_past_its_lease_never_writes_again(healthy: EngineSet) -> None:
    group = healthy
    before = directories(group)
    old = group.leader("a")
    sent: list[Any] = []
    with Load(group, 2) as load:
        load.acked_after(20, 60)
        fault = time.monotonic()
        os.killpg(old.pid, signal.SIGSTOP)
        try:
            new = group.leader("a", 30)
            assert new is not old
            load.acked_after(10, 60, [load.users["a"], load.orders])
            took = load.first_ack_after(fault, new.url)
            print(f"\nSIGSTOP: the new leader of a acknowledged a write {took:.2f} s after the pause")
            # writes sent straight to the paused engine wait in its socket until it resumes
            senders = [threading.Thread(target=send_raw, args=(old, path, row, sent), daemon=True)
                       for path, row in raw_writes(OLD_LEADER_KEYS[:4])]
            for sender in senders:
                sender.start()
            time.sleep(0.5)
        finally:
            os.killpg(old.pid, signal.SIGCONT)
        for sender in senders:
            sender.join(30)
        for path, row in raw_writes(OLD_LEADER_KEYS[4:]):
            if not old.alive():
                break
            send_raw(old, path, row, sent)
        assert old.proc is not None and old.proc.wait(timeout=30) == EXIT_STEPPED_DOWN
        # the batches, pushes and prepares the peers had sent to the paused engine were answered "not the
        # leader" once it resumed, and went on to the new one: everything flows again
        load.acked_after(10, 60)
    print(f"writes sent to the replaced leader: {Counter(map(str, sent))}")
    assert all(outcome in ("refused", "gone") for outcome in sent), sent
    assert "this engine is no longer the leader of its cluster" in old.log_path.read_text()
    check_group(group, load, before, absent=OLD_LEADER_KEYS)
