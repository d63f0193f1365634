"""A replica added to a table whose replication queue was trimmed: never silently incomplete.

Before, a replica created on such a table started at the head of the queue, never received the
older rows, and ``get_in_sync_replicas`` listed it as in sync. Now enabling it fails, naming the
trimmed history and the bootstrap copy it needs; a replica whose ``start_replication_timestamp``
is after the trimmed history (the bootstrap's snapshot timestamp) is enabled; a replica created
but never enabled holds the queue (it pins the history while its copy runs) until
``--bootstrap-pin-ttl``, and an abandoned one is then marked instead of holding trimming forever.
Real engines over HTTP.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.errors import YtError
from reptables.testing import wait_for

from .conftest import ClusterSet

PIN_TTL = 8.0
REPLICA = "remote_0"
_names = itertools.count()


@pytest.fixture(scope="module")
def cs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("trimmed")), names=("primary", REPLICA))
    try:
        yield clusters.start(extra_args=["--bootstrap-pin-ttl", str(PIN_TTL)])
    finally:
        clusters.stop()


def trimmed_table(cs: ClusterSet, rows: int = 10) -> tuple[str, str]:
    """A replicated table whose first ``rows`` changes reached a replica and left the queue:
    (table path, that replica's id)."""
    n = next(_names)
    path = cs.replicated_table(f"//tmp/trimmed_{n}", attributes={"min_replication_log_ttl": 0})
    first = cs.replica(path, REPLICA, f"//tmp/first_{n}")
    cs.meta.insert_rows(path, [{"k": i, "v": f"old{i}"} for i in range(rows)], require_sync_replica=False)
    wait_for(lambda: trimmed_rows(cs, path) == rows, 30, "the queue trimmed")
    return path, first


def trimmed_rows(cs: ClusterSet, path: str) -> int:
    return int(cs.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"])


def add_replica(cs: ClusterSet, path: str, **attrs: Any) -> tuple[str, str]:
    replica_path = f"//tmp/late_{next(_names)}"
    return cs.replica(path, REPLICA, replica_path, enable=False, **attrs), replica_path


def test_a_replica_missing_trimmed_history_cannot_be_enabled_and_is_never_in_sync(cs: ClusterSet) -> None:
    path, first = trimmed_table(cs)
    late, late_path = add_replica(cs, path)
    with pytest.raises(YtError) as refused:
        cs.alter(late, enabled=True)
    error = refused.value
    assert error.code == 1740
    for words in (late, path, "trimmed", "bootstrap", "start_replication_timestamp"):
        assert words in error.message, (words, error.message)
    assert cs.meta.get(f"#{late}/@state") == "disabled"
    ts = cs.meta.generate_timestamp()
    assert cs.in_sync(path, ts) == [first]
    # new writes still reach the first replica, never the refused one
    cs.meta.insert_rows(path, [{"k": 100, "v": "new"}], require_sync_replica=False)
    first_path = cs.meta.get(f"#{first}/@replica_path")
    wait_for(lambda: {"k": 100, "v": "new"} in cs.rows(REPLICA, first_path), 30, "the new row on the first replica")
    assert cs.rows(REPLICA, late_path) == []
    assert late not in cs.in_sync(path, cs.meta.generate_timestamp())


def test_a_replica_starting_after_the_trimmed_history_is_enabled(cs: ClusterSet) -> None:
    """What a bootstrap does: copy the table as of T, then replicate what comes after T."""
    path, _ = trimmed_table(cs)
    start = cs.meta.generate_timestamp()
    late, late_path = add_replica(cs, path, start_replication_timestamp=start)
    # (the copy as of T is the bootstrap job's part; here the replica table stays empty before T)
    cs.alter(late, enabled=True)
    cs.meta.insert_rows(path, [{"k": 50, "v": "after"}], require_sync_replica=False)
    wait_for(lambda: cs.rows(REPLICA, late_path) == [{"k": 50, "v": "after"}], 30, "the change after T")
    wait_for(lambda: late in cs.in_sync(path, cs.meta.generate_timestamp()), 30, "in sync")


def test_an_untrimmed_table_gives_a_new_replica_its_whole_history(cs: ClusterSet) -> None:
    n = next(_names)
    path = cs.replicated_table(f"//tmp/untrimmed_{n}")  # the default log ttl keeps the queue
    first = cs.replica(path, REPLICA, f"//tmp/untrimmed_first_{n}")
    cs.meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(5)], require_sync_replica=False)
    wait_for(lambda: len(cs.rows(REPLICA, f"//tmp/untrimmed_first_{n}")) == 5, 30)
    late, late_path = add_replica(cs, path)
    cs.alter(late, enabled=True)
    wait_for(lambda: cs.rows(REPLICA, late_path) == [{"k": i, "v": "x"} for i in range(5)], 30, "the history")
    assert first and trimmed_rows(cs, path) == 0


def test_a_replica_never_enabled_pins_the_queue_until_its_pin_expires(cs: ClusterSet) -> None:
    n = next(_names)
    path = cs.replicated_table(f"//tmp/pinned_{n}", attributes={"min_replication_log_ttl": 0})
    first = cs.replica(path, REPLICA, f"//tmp/pinned_first_{n}")
    pending, _ = add_replica(cs, path)  # created at once: its pin holds the history from row 0
    cs.meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(5)], require_sync_replica=False)
    wait_for(lambda: first in cs.in_sync(path, cs.meta.generate_timestamp()), 30, "the first replica in sync")
    # the pending replica pins the queue: three maintenance passes (one a second) trim nothing,
    # where a table without it is trimmed in one (test_a_replica_missing_trimmed_history_...)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert trimmed_rows(cs, path) == 0
        time.sleep(0.2)
    # abandoned: past the pin's time the queue is trimmed, and the replica says what it misses
    wait_for(lambda: trimmed_rows(cs, path) == 5, PIN_TTL + 30, "the queue trimmed after the pin expired")
    errors = cs.meta.get(f"#{pending}/@errors")
    assert errors and errors[0]["code"] == 1740 and "trimmed" in errors[0]["message"]
    with pytest.raises(YtError) as refused:
        cs.alter(pending, enabled=True)
    assert refused.value.code == 1740


def test_the_trimmed_history_is_remembered_across_a_restart(cs: ClusterSet) -> None:
    path, _ = trimmed_table(cs)
    late, _ = add_replica(cs, path)
    cs.restart("primary", kill=True)
    cs.publish_directory()
    with pytest.raises(YtError) as refused:
        cs.alter(late, enabled=True)
    assert refused.value.code == 1740
    other, _ = add_replica(cs, path)  # created after the restart: the trimmed timestamp was kept
    with pytest.raises(YtError) as again:
        cs.alter(other, enabled=True)
    assert again.value.code == 1740
