"""reptables.cache: seed 004's cache invalidation against a real Redis and real engines.

One ``redis-server`` per module (Debian's, on a free loopback port, its own process group, stopped
by pid). The rule tests drive the Redis store directly with tokens written by hand; the engine
tests follow real change streams; the last test is the issue's check: writers, an invalidator
(stopped and restarted from its checkpoint) and readers run at once, and afterwards every cached
value equals the table's row.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from reptables.cache import (
    CHANGES_TRIMMED,
    MISSING,
    CachedReader,
    Checkpoint,
    Entry,
    FillResult,
    Invalidator,
    Outcome,
    RowCache,
    apply_change,
)
from reptables.cache import tokens as tk
from reptables.engine.client import Client, LockConflict, YtError
from reptables.testing import EngineProcess, EngineSet, free_port, wait_for

REDIS_SERVER = "/usr/bin/redis-server"
SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "n", "type": "int64"}]
KEY = {"k": 1}


def tok(ts: int, seq: int = 0, table: str = "1-2-3-4") -> str:
    return f"{ts:016x}{seq:016x}{table}"


# -- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.skip(f"{REDIS_SERVER} is not installed")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    with open(workdir / "redis.log", "wb") as log:
        proc = subprocess.Popen([REDIS_SERVER, "--save", "", "--appendonly", "no", "--port", str(port),
                                 "--bind", "127.0.0.1", "--dir", str(workdir)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        probe = redis.Redis(port=port)
        wait_for(lambda: proc.poll() is not None or _pings(probe), 15, "redis-server to answer")
        assert proc.poll() is None, (workdir / "redis.log").read_text(errors="replace")
        probe.close()
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def rdb(redis_port: int) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_port)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def cache(rdb: redis.Redis) -> RowCache:
    return RowCache(rdb, prefix="test")


@pytest.fixture
def engine(clean_engine: EngineProcess) -> EngineProcess:
    return clean_engine


@pytest.fixture
def client(engine: EngineProcess) -> Iterator[Client]:
    with Client(engine.url, token=engine.token) as c:
        yield c


def sorted_table(client: Client, path: str) -> str:
    client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA}, recursive=True)
    client.mount_table(path)
    return path


def committed(client: Client, write: Callable[[str], None]) -> int:
    """Run ``write(tx)`` in a tablet transaction; its commit timestamp."""
    tx = client.start_transaction()
    try:
        write(tx)
    except BaseException:
        client.abort_transaction(tx)
        raise
    return client.commit_transaction(tx)


def catch_up(invalidator: Invalidator, timestamp: int, timeout: float = 30.0) -> None:
    """Run the invalidator until every change at or below ``timestamp`` is applied."""
    def caught_up() -> bool:
        invalidator.run_once()
        return invalidator.position is not None and invalidator.position.timestamp >= timestamp
    wait_for(caught_up, timeout, f"the invalidator of {invalidator.path} to reach {timestamp}")


# -- tokens -----------------------------------------------------------------------------------------

def test_tokens_of_one_stream_order_by_timestamp_then_sequence():
    assert tk.compare(tok(5, 1), tok(5, 2)) == -1
    assert tk.compare(tok(6, 0), tok(5, 9)) == 1
    assert tk.compare(tok(5, 3), tok(5, 3)) == 0


def test_tokens_of_two_streams_with_one_timestamp_have_no_known_order_unless_one_is_a_heartbeat():
    meta, replica = tok(5, 1, "meta-id"), tok(5, 1, "replica-id")
    assert tk.compare(meta, replica) is None
    assert tk.compare(tok(4, 9, "meta-id"), replica) == -1
    heartbeat = f"{5:016x}{'f' * 16}replica-id"
    assert tk.compare(heartbeat, meta) == 1 and tk.compare(meta, heartbeat) == -1


def test_a_malformed_token_is_refused_with_the_token_named():
    with pytest.raises(ValueError, match="'abc'.*32 lowercase hex digits"):
        tk.compare("abc", tok(1))


# -- the invalidator's rules on real Redis ------------------------------------------------------------

def test_a_change_of_an_uncached_row_stores_its_token_without_a_value(cache):
    assert apply_change(cache, "//t", KEY, tok(10)) == (Outcome.STORED, 0)
    assert cache.get("//t", KEY) == Entry(tok(10))


def test_a_change_newer_than_the_cached_token_clears_the_value(cache):
    cache.compare_and_set("//t", KEY, None, Entry(tok(10), {"k": 1, "v": "old"}))
    assert apply_change(cache, "//t", KEY, tok(11))[0] is Outcome.INVALIDATED
    entry = cache.get("//t", KEY)
    assert entry == Entry(tok(11)) and not entry.has_value


def test_a_change_older_than_the_cached_token_is_discarded(cache):
    cache.compare_and_set("//t", KEY, None, Entry(tok(10), {"k": 1, "v": "fresh"}))
    assert apply_change(cache, "//t", KEY, tok(9, 7))[0] is Outcome.DISCARDED
    assert cache.get("//t", KEY) == Entry(tok(10), {"k": 1, "v": "fresh"})


def test_replaying_a_change_changes_nothing(cache):
    apply_change(cache, "//t", KEY, tok(10, 2))
    assert apply_change(cache, "//t", KEY, tok(10, 2))[0] is Outcome.DISCARDED
    assert cache.get("//t", KEY) == Entry(tok(10, 2))


def test_a_change_of_unknown_order_invalidates_with_its_own_token(cache):
    cache.compare_and_set("//t", KEY, None, Entry(tok(10, 3, "meta-id"), {"k": 1, "v": "x"}))
    assert apply_change(cache, "//t", KEY, tok(10, 1, "replica-id"))[0] is Outcome.UNKNOWN
    assert cache.get("//t", KEY) == Entry(tok(10, 1, "replica-id"))


def test_a_write_based_on_a_stale_read_loses_the_compare_and_swap(cache):
    cache.compare_and_set("//t", KEY, None, Entry(tok(10)))
    read = cache.get("//t", KEY)
    assert apply_change(cache, "//t", KEY, tok(12))[0] is Outcome.INVALIDATED
    assert cache.compare_and_set("//t", KEY, read, Entry(tok(11), {"k": 1})) is FillResult.CONFLICT
    assert cache.compare_and_set("//t", KEY, None, Entry(tok(13))) is FillResult.CONFLICT
    assert cache.get("//t", KEY) == Entry(tok(12))


def test_concurrent_invalidators_leave_the_newest_token(cache, redis_port):
    changes = [tok(ts, seq) for ts in range(100, 140) for seq in range(3)]
    random.Random(4).shuffle(changes)
    retries: list[int] = []

    def invalidate(part: list[str]) -> None:
        own = RowCache(redis.Redis(port=redis_port), prefix="test")
        for token in part:
            retries.append(apply_change(own, "//t", KEY, token)[1])

    threads = [threading.Thread(target=invalidate, args=(changes[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.get("//t", KEY) == Entry(max(changes))
    assert len(retries) == len(changes)


def test_a_reset_raises_the_floor_and_empties_only_that_table(cache):
    cache.compare_and_set("//t[1]*", KEY, None, Entry(tok(10), {"k": 1}))
    cache.compare_and_set("//t[1]*", {"k": 2}, None, Entry(tok(10)))
    cache.compare_and_set("//other", KEY, None, Entry(tok(10), {"k": 1}))
    assert cache.reset("//t[1]*", 50) == 2
    assert list(cache.entries("//t[1]*")) == [] and cache.get("//other", KEY) is not None
    assert cache.compare_and_set("//t[1]*", KEY, None, Entry(tok(40)), read_timestamp=40) is FillResult.BELOW_FLOOR
    assert cache.compare_and_set("//t[1]*", KEY, None, Entry(tok(50)), read_timestamp=50) is FillResult.WRITTEN
    cache.reset("//t[1]*", 20)
    assert cache.floor("//t[1]*") == 50


def test_the_floor_compares_full_64_bit_timestamps(cache):
    high = (1_800_000_000 << 30) | 5
    cache.reset("//t", high)
    assert cache.compare_and_set("//t", KEY, None, Entry(tok(high - 1)), read_timestamp=high - 1) \
        is FillResult.BELOW_FLOOR
    assert cache.compare_and_set("//t", KEY, None, Entry(tok(high + 1)), read_timestamp=high + 1) \
        is FillResult.WRITTEN


def test_checkpoints_only_move_forward_unless_forced(cache):
    assert cache.save_checkpoint("//t", "inv", Checkpoint(tok(10), 10))
    assert not cache.save_checkpoint("//t", "inv", Checkpoint(tok(9), 9))
    assert cache.checkpoint("//t", "inv") == Checkpoint(tok(10), 10)
    assert cache.save_checkpoint("//t", "inv", Checkpoint(None, 5), force=True)
    assert cache.checkpoint("//t", "inv") == Checkpoint(None, 5)


def test_entries_written_by_someone_else_are_refused_with_the_key_named(cache, rdb):
    rdb.set(cache.entry_key("//t", KEY), b"not json")
    with pytest.raises(ValueError, match=r"test:row://t:\{\"k\":1\}.*not a reptables cache entry"):
        cache.get("//t", KEY)


def test_a_redis_client_that_decodes_responses_is_refused(redis_port):
    with pytest.raises(ValueError, match="decode_responses=False"):
        RowCache(redis.Redis(port=redis_port, decode_responses=True))


# -- against a real engine ----------------------------------------------------------------------------

def test_read_fill_hit_invalidate_refill(client, cache):
    path = sorted_table(client, "//tmp/cache/basic")
    client.insert_rows(path, [{"k": 1, "v": "a", "n": 1}])
    invalidator = Invalidator(cache, client, path, wait_timeout=100)
    invalidator.run_once()
    reader = CachedReader(cache, client, path)

    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": 1}
    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": 1}
    assert (reader.stats.misses, reader.stats.hits, reader.stats.fills) == (1, 1, 1)

    ts = committed(client, lambda tx: client.insert_rows(path, [{"k": 1, "v": "b", "n": 2}], transaction_id=tx))
    catch_up(invalidator, ts)
    entry = cache.get(path, {"k": 1})
    assert entry is not None and not entry.has_value and tk.timestamp_of(entry.event_token) == ts
    assert reader.get({"k": 1}) == {"k": 1, "v": "b", "n": 2}
    assert reader.get({"k": 1}) == {"k": 1, "v": "b", "n": 2} and reader.stats.hits == 2

    ts = committed(client, lambda tx: client.delete_rows(path, [{"k": 1}], transaction_id=tx))
    catch_up(invalidator, ts)
    assert reader.get({"k": 1}) is None
    assert cache.get(path, {"k": 1}).value == MISSING
    assert reader.get({"k": 1}) is None and reader.stats.hits == 3


def test_a_first_start_forgets_entries_filled_before_it(client, cache):
    path = sorted_table(client, "//tmp/cache/first_start")
    client.insert_rows(path, [{"k": 1, "v": "a"}])
    reader = CachedReader(cache, client, path)
    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": None}
    assert cache.get(path, {"k": 1}).has_value
    before = client.generate_timestamp()
    invalidator = Invalidator(cache, client, path, wait_timeout=100)
    invalidator.run_once()
    assert invalidator.stats.resets == 1 and cache.get(path, {"k": 1}) is None
    floor = cache.floor(path)
    assert floor is not None and floor > before
    assert cache.compare_and_set(path, {"k": 1}, None, Entry(tok(before), {"k": 1, "v": "a", "n": None}),
                                 read_timestamp=before) is FillResult.BELOW_FLOOR
    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": None} and reader.stats.fills == 2


def test_a_restarted_invalidator_resumes_from_its_checkpoint(client, cache):
    path = sorted_table(client, "//tmp/cache/restart")
    first = Invalidator(cache, client, path, wait_timeout=100, checkpoint_interval=60)
    stop = threading.Event()
    runner = threading.Thread(target=first.run, args=(stop,))
    runner.start()
    wait_for(lambda: first.position is not None and first.position.event_token is not None, 10, "a first pull")
    stop.set()
    runner.join()  # a clean stop stores the position reached
    checkpoint = cache.checkpoint(path, "invalidator")
    assert checkpoint is not None and checkpoint == first.position

    ts = committed(client, lambda tx: client.insert_rows(path, [{"k": 7, "v": "while down"}], transaction_id=tx))
    second = Invalidator(cache, client, path, wait_timeout=100)
    catch_up(second, ts)
    assert second.stats.resets == 0 and second.stats.stored == 1
    assert cache.get(path, {"k": 7}) is not None and tk.timestamp_of(cache.get(path, {"k": 7}).event_token) == ts


def test_a_checkpoint_older_than_the_retained_changes_resets_the_tables_entries(client, cache):
    path = sorted_table(client, "//tmp/cache/trimmed")
    client.set(f"{path}/@change_retention", 100)
    client.insert_rows(path, [{"k": 1, "v": "a"}])
    first = Invalidator(cache, client, path, wait_timeout=100, checkpoint_interval=0)
    first.run_once()
    reader = CachedReader(cache, client, path)
    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": None} and cache.get(path, {"k": 1}).has_value
    checkpoint = cache.checkpoint(path, "invalidator")

    client.insert_rows(path, [{"k": 1, "v": "b"}])  # while no invalidator runs, and then trimmed
    def trimmed() -> bool:
        try:
            client.pull_changes(path, from_event_token=checkpoint.event_token, wait_timeout=0)
        except YtError as exc:
            return exc.code == CHANGES_TRIMMED
        return False
    wait_for(trimmed, 30, "the engine to trim the change")

    second = Invalidator(cache, client, path, wait_timeout=100)
    second.run_once()
    assert second.stats.resets == 1 and cache.get(path, {"k": 1}) is None
    assert reader.get({"k": 1}) == {"k": 1, "v": "b", "n": None}


def test_a_key_that_is_not_the_tables_key_is_refused(client, cache):
    path = sorted_table(client, "//tmp/cache/bad_key")
    reader = CachedReader(cache, client, path)
    with pytest.raises(ValueError, match=r"//tmp/cache/bad_key.*expected exactly the key columns \['k'\]"):
        reader.get({"v": "x"})


# -- a replica cluster --------------------------------------------------------------------------------

@pytest.fixture
def two_clusters(tmp_path: Path) -> Iterator[EngineSet]:
    clusters = EngineSet(tmp_path, names=("primary", "remote_0")).start()
    try:
        yield clusters
    finally:
        clusters.stop()


def test_reads_of_a_lagging_replica_are_returned_but_not_cached(two_clusters, cache):
    cs = two_clusters
    path, replica_path = "//tmp/cache_rt", "//tmp/cache_rt_replica"
    cs.replicated_table(path, schema=SCHEMA)
    replica_id = cs.replica(path, "remote_0", replica_path, schema=SCHEMA)
    cs.meta.insert_rows(path, [{"k": 1, "v": "a", "n": 1}], require_sync_replica=False)
    wait_for(lambda: cs.rows("remote_0", replica_path), 30, "the replica to receive the row")

    invalidator = Invalidator(cache, cs.meta, path, wait_timeout=100)
    invalidator.run_once()
    reader = CachedReader(cache, cs.client("remote_0"), replica_path, table=path)
    # the invalidator's start is the fill floor: the replica's reads fill the cache once its
    # replication progress (the freshness of its reads) has passed it
    wait_for(lambda: reader.get({"k": 1}) == {"k": 1, "v": "a", "n": 1} and reader.stats.fills == 1, 30,
             "a read of the replica to fill the cache")

    cs.alter(replica_id, enabled=False)
    ts = committed(cs.meta, lambda tx: cs.meta.insert_rows(path, [{"k": 1, "v": "b", "n": 2}], transaction_id=tx,
                                                          require_sync_replica=False))
    catch_up(invalidator, ts)
    assert not cache.get(path, {"k": 1}).has_value

    not_fresh = reader.stats.not_fresh
    assert reader.get({"k": 1}) == {"k": 1, "v": "a", "n": 1}  # the replica's (old) row ...
    assert reader.stats.not_fresh == not_fresh + 1 and not cache.get(path, {"k": 1}).has_value  # ... not cached

    cs.alter(replica_id, enabled=True)
    wait_for(lambda: cs.rows("remote_0", replica_path) == [{"k": 1, "v": "b", "n": 2}], 30, "replication")
    wait_for(lambda: reader.get({"k": 1}) == {"k": 1, "v": "b", "n": 2} and cache.get(path, {"k": 1}).has_value,
             30, "a fresh read of the replica to fill the cache")
    assert cache.get(path, {"k": 1}).value == {"k": 1, "v": "b", "n": 2}


# -- the check: everything at once ------------------------------------------------------------

def test_concurrent_writers_readers_and_a_restarted_invalidator_leave_no_stale_value(engine, cache, redis_port):
    keys = 16
    last_commit: dict[int, int] = {}
    commit_lock = threading.Lock()
    writers_stop, readers_stop = threading.Event(), threading.Event()
    # after the restart the writers leave half of the keys alone: their changes made while no
    # invalidator ran are invalidated by the replay from the checkpoint, or by nothing
    only_low_keys = threading.Event()
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)
        return run

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with Client(engine.url, token=engine.token) as c:
            while not writers_stop.is_set():
                k = rng.randrange(keys // 2 if only_low_keys.is_set() else keys)
                op = rng.choice(("insert", "insert", "update", "delete"))
                tx = c.start_transaction()
                try:
                    if op == "insert":
                        c.insert_rows(path, [{"k": k, "v": f"w{seed}-{rng.random():.6f}", "n": rng.randrange(99)}],
                                      transaction_id=tx)
                    elif op == "update":
                        c.insert_rows(path, [{"k": k, "n": rng.randrange(99)}], update=True, transaction_id=tx)
                    else:
                        c.delete_rows(path, [{"k": k}], transaction_id=tx)
                    ts = c.commit_transaction(tx)
                except LockConflict:
                    continue
                with commit_lock:
                    last_commit[k] = max(last_commit.get(k, 0), ts)

    readers: list[CachedReader] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        with Client(engine.url, token=engine.token) as c:
            own = CachedReader(RowCache(redis.Redis(port=redis_port), prefix="test"), c, path)
            readers.append(own)
            while not readers_stop.is_set():
                own.get({"k": rng.randrange(keys)})

    with Client(engine.url, token=engine.token) as inv_client:
        path = sorted_table(inv_client, "//tmp/cache/stress")
        first = Invalidator(cache, inv_client, path, checkpoint_interval=0.5, wait_timeout=200)
        first.run_once()  # the first start: resets the table's entries, stores a checkpoint
        crash = threading.Event()

        def crashing_invalidator() -> None:
            # run_once in a loop and no final checkpoint: stopping this is a crash, not a clean stop
            while not crash.is_set():
                first.run_once()

        threads = [threading.Thread(target=guarded(functools.partial(writer, s))) for s in (1, 2)]
        threads += [threading.Thread(target=guarded(functools.partial(reader, s))) for s in (3, 4)]
        inv_thread = threading.Thread(target=guarded(crashing_invalidator))
        for thread in [*threads, inv_thread]:
            thread.start()
        try:
            time.sleep(4)
            crash.set()
            inv_thread.join()
            time.sleep(2)  # writes and reads go on while no invalidator runs
            only_low_keys.set()
            checkpoint = cache.checkpoint(path, "invalidator")
            second = Invalidator(cache, inv_client, path, checkpoint_interval=0.5, wait_timeout=200)
            stop_second = threading.Event()
            second_thread = threading.Thread(target=guarded(lambda: second.run(stop_second)))
            second_thread.start()
            time.sleep(4)
        finally:
            writers_stop.set()
            for thread in threads[:2]:
                thread.join()
            readers_stop.set()
            for thread in threads[2:]:
                thread.join()
        end = inv_client.generate_timestamp()
        try:
            wait_for(lambda: errors or (second.position is not None and second.position.timestamp >= end), 60,
                     "the restarted invalidator to catch up")
        finally:
            stop_second.set()
            second_thread.join()
        assert not errors, errors

        assert checkpoint is not None and second.stats.resets == 0
        assert first.stats.changes > 0 and second.stats.changes > 0
        assert second.stats.checkpoints >= 1
        assert sum(r.stats.hits for r in readers) > 0 and sum(r.stats.fills for r in readers) > 0
        assert first.stats.invalidated + second.stats.invalidated > 0

        checked = 0
        for key, entry in cache.entries(path):
            k = key["k"]
            if last_commit.get(k):
                # no cached token (and so no value) is older than the table's last change of the row
                assert tk.timestamp_of(entry.event_token) >= last_commit[k], (key, entry)
            if entry.has_value:
                rows = inv_client.lookup_rows(path, [key])
                assert entry.value == (rows[0] if rows else MISSING), (key, entry, rows)
                checked += 1
        assert checked > 0
