"""What a PostgreSQL-backed engine adds to what every backend does (those run on both: tests/conftest.py).

* The database is the cluster's own: another cluster's, a newer format's or an incomplete database
  is refused at start in one line that names it and never its password; a password on the command
  line is refused before anything is opened.
* Tables are readable by SQL: ``psql`` reads a replica's rows through the view named after its path.
* Strings order byte by byte, as YT orders them, in a database whose collation says otherwise.
* Durability: PostgreSQL shut down (fast, and immediate: a crash) and started again under writes
  loses no acknowledged write and applies no failed one; the engine answers 105 (retriable) while it
  is away and writes again by itself once it is back, and an async replica on SQLite ends equal to
  the table. A commit made with durability=async that a crash of PostgreSQL lost makes the engine
  refuse writes (its memory is ahead of its database) until a restart reloads it.

The restart tests stop and start a server, so they run on one of their own (the run's server is
shared with every other test); everything else uses the run's server (the ``postgres`` fixture).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError
from reptables.engine.errors import ErrorCode, YtError
from reptables.testing import EngineSet, wait_for
from reptables.testing.backends import DB_USER, RunServer
from reptables.testing.engines import TEST_TOKEN, EngineProcess
from reptables.testing.postgres import PostgresServer

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
PASSWORD = "never-shown-0451"


def serve(name: str, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``engine serve`` expected to refuse to start: its exit, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "reptables.engine.cli", "serve", "--cluster-name", name, "--data-dir",
                           str(data_dir), "--token", TEST_TOKEN, "--port", "1", *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**_base_env(), **(env or {})})


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "REPTABLES_STORAGE"}


def with_password(url: str) -> str:
    """The URL with a password in it (trust authentication ignores it: what matters is where it shows)."""
    return url.replace(f"//{DB_USER}@", f"//{DB_USER}:{PASSWORD}@")


def started(name: str, data_dir: Path, url: str) -> EngineProcess:
    engine = EngineProcess(name, data_dir, extra_args=["--storage", url])
    return engine.start()  # type: ignore[return-value]


# -- the database is the cluster's own ----------------------------------------------------------------


def test_a_database_of_another_cluster_is_refused_in_one_line(postgres: RunServer, tmp_path: Path) -> None:
    url = postgres.create_database("owned")
    first = started("alpha", tmp_path / "alpha", url)
    first.stop()
    # the whole URL, password included, from the environment (a mounted Secret)
    refused = serve("beta", tmp_path / "beta", env={"REPTABLES_STORAGE": with_password(url)})
    assert refused.returncode != 0
    message = refused.stderr.strip().splitlines()
    assert any("Refusing to serve the database" in line and "as cluster beta" in line and "holds cluster alpha"
               in line for line in message), refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout
    assert url.rsplit("/", 1)[1] in refused.stderr  # the database is named
    # nothing of it was touched: its owner starts on it again
    again = started("alpha", tmp_path / "alpha", url)
    again.stop()


def test_a_database_of_a_newer_format_or_incomplete_is_refused(postgres: RunServer, tmp_path: Path) -> None:
    newer = postgres.create_database("newer")
    started("alpha", tmp_path / "a", newer).stop()
    postgres.psql("UPDATE _rt_meta SET value = '999' WHERE name = 'storage_format'", newer.rsplit("/", 1)[1])
    refused = serve("alpha", tmp_path / "a", "--storage", newer)
    assert refused.returncode != 0 and "a newer reptables wrote it (storage format 999" in refused.stderr

    incomplete = postgres.create_database("incomplete")
    started("alpha", tmp_path / "b", incomplete).stop()
    postgres.psql("DROP TABLE _rt_nodes", incomplete.rsplit("/", 1)[1])
    refused = serve("alpha", tmp_path / "b", "--storage", incomplete)
    assert refused.returncode != 0 and "_rt_nodes" in refused.stderr and "missing" in refused.stderr

    foreign = postgres.create_database("foreign")
    postgres.psql("CREATE TABLE _rt_replicas (x int)", foreign.rsplit("/", 1)[1])
    refused = serve("alpha", tmp_path / "c", "--storage", foreign)
    assert refused.returncode != 0 and "has reptables tables (_rt_replicas) but no _rt_meta" in refused.stderr


def test_a_database_of_an_older_schema_is_migrated_at_start(postgres: RunServer, tmp_path: Path) -> None:
    url = postgres.create_database("older")
    database = url.rsplit("/", 1)[1]
    started("alpha", tmp_path / "a", url).stop()
    # as the first PostgreSQL-backed engines left it: schema version 1, bootstrap chunks in 32 bits
    # and XDCR rows with the version each change was made on (schema 2), not their delete horizon
    postgres.psql("ALTER TABLE _rt_replica_sink ALTER COLUMN tablet_index TYPE integer; "
                  "ALTER TABLE _rt_xdcr_rows RENAME COLUMN horizon_timestamp TO parent_timestamp; "
                  "ALTER TABLE _rt_xdcr_rows RENAME COLUMN horizon_cluster_id TO parent_cluster_id; "
                  "INSERT INTO _rt_xdcr_rows VALUES ('t', '[1]', 2, 500, true, 400, 1), "
                  "('t', '[2]', 1, 600, false, 550, 2); "
                  "UPDATE _rt_meta SET value = '1' WHERE name = 'schema_version'; "
                  # and a replicated table's queue with a row per change (schema 3), not runs of them
                  "CREATE TABLE t_older_queue (_rt_tablet_index integer, _rt_row_index bigint, _rt_ts bigint, "
                  "_rt_kind varchar(16), _rt_payload text, PRIMARY KEY (_rt_tablet_index, _rt_row_index)); "
                  "INSERT INTO t_older_queue VALUES (0, 0, 100, 'write', '{}')", database)
    started("alpha", tmp_path / "a", url).stop()
    assert postgres.psql("SELECT value FROM _rt_meta WHERE name = 'schema_version'", database) == "4"
    assert postgres.psql("SELECT _rt_row_count FROM t_older_queue", database) == "1"
    assert postgres.psql("SELECT data_type FROM information_schema.columns WHERE table_name = "
                         "'_rt_replica_sink' AND column_name = 'tablet_index'", database) == "bigint"
    # a tombstone's horizon is its own version; a live row's history is not known: none
    assert postgres.psql("SELECT row_key, horizon_timestamp, horizon_cluster_id FROM _rt_xdcr_rows "
                         "WHERE table_id = 't' ORDER BY row_key", database).splitlines() == ["[1]|500|2", "[2]||"]


def test_a_password_on_the_command_line_is_refused_without_echoing_it(postgres: RunServer, tmp_path: Path) -> None:
    refused = serve("alpha", tmp_path / "a", "--storage", with_password(postgres.url("postgres")))
    assert refused.returncode == 2
    assert "carries a password" in refused.stderr and "$PGPASSWORD" in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout
    refused = serve("alpha", tmp_path / "a", "--storage", "mysql://root@127.0.0.1/x")
    assert refused.returncode == 2 and "'mysql' is not a supported database" in refused.stderr
    # several hosts written as libpq's comma list: the form that works is named, the value is not echoed
    refused = serve("alpha", tmp_path / "a", "--storage", f"postgresql://{DB_USER}:{PASSWORD}@h1:5432,h2:5432/db")
    assert refused.returncode == 2 and "not a database URL" in refused.stderr
    assert "?host=HOST1:PORT&host=HOST2:PORT" in refused.stderr and "Traceback" not in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout


def test_an_unreachable_database_is_named_at_start(tmp_path: Path) -> None:
    from reptables.engine.process import free_port

    refused = serve("alpha", tmp_path / "a", env={
        "REPTABLES_STORAGE": f"postgresql://{DB_USER}:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"})
    assert refused.returncode != 0
    assert "Cannot reach the database" in refused.stderr and "nowhere" in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout


# -- tables are readable by SQL ---------------------------------------------------------------------


def test_psql_reads_a_replica_through_the_view_named_after_its_path(postgres: RunServer, tmp_path: Path) -> None:
    # the meta-cluster on SQLite, the replica's cluster on PostgreSQL (a mixed topology)
    with EngineSet(tmp_path, names=("primary", "replica"), storage={"primary": "sqlite",
                                                                    "replica": postgres.create_database("replica")}) \
            as clusters:
        path = clusters.replicated_table("//tmp/orders", SCHEMA)
        replica_id = clusters.replica(path, "replica", "//tmp/orders", mode="async")
        clusters.meta.insert_rows(path, [{"k": i, "v": f"order {i}"} for i in range(5)], require_sync_replica=False)
        clusters.meta.delete_rows(path, [{"k": 3}], require_sync_replica=False)
        clusters.meta.insert_rows(path, [{"k": 1, "v": "changed"}], require_sync_replica=False)
        clusters.wait_in_sync(replica_id)
        database = clusters.engines["replica"].extra_args[-1].rsplit("/", 1)[1]
        # the latest committed image, without the engine's system columns
        out = postgres.psql('SELECT k, v FROM "//tmp/orders" ORDER BY k', database)
        assert out.splitlines() == ["0|order 0", "1|changed", "2|order 2", "4|order 4"]
        columns = postgres.psql("SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM "
                                "information_schema.columns WHERE table_name = '//tmp/orders'", database)
        assert columns == "k,v"
        # a removed table takes its view with it
        replica = clusters.client("replica")
        replica.unmount_table("//tmp/orders")
        wait_for(lambda: replica.get("//tmp/orders/@tablet_state") == "unmounted", 30, "unmounted")
        replica.remove("//tmp/orders")
        assert postgres.psql("SELECT count(*) FROM information_schema.views WHERE table_name = "
                             "'//tmp/orders'", database) == "0"


def test_a_value_postgresql_cannot_hold_is_refused_with_400_and_nothing_applied(
        postgres: RunServer, tmp_path: Path) -> None:
    engine = started("alpha", tmp_path / "a", postgres.create_database("nul"))
    try:
        with engine.client() as client:
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table("//tmp/t")
            wait_for(lambda: client.get("//tmp/t/@tablet_state") == "mounted", 30, "mounted")
            with pytest.raises(YtError) as refused:
                # PostgreSQL's text holds no NUL character; the batch's other row is not applied either
                client.insert_rows("//tmp/t", [{"k": 1, "v": "fine"}, {"k": 2, "v": "a\x00b"}])
            assert refused.value.code == ErrorCode.INVALID_PARAMETER
            assert "the database refused a value" in str(refused.value) and "NUL" in str(refused.value)
            assert client.select_rows("k from [//tmp/t]") == []
            # the same in a batch big enough to be written by COPY (engine/storage/statements.py)
            with pytest.raises(YtError) as refused:
                client.insert_rows("//tmp/t", [{"k": k, "v": "a\x00b" if k == 150 else "fine"} for k in range(200)])
            assert refused.value.code == ErrorCode.INVALID_PARAMETER
            # (the server's own words here: 'invalid byte sequence for encoding "UTF8": 0x00')
            assert "the database refused a value" in str(refused.value) and "0x00" in str(refused.value)
            assert client.select_rows("k from [//tmp/t]") == []
            client.insert_rows("//tmp/t", [{"k": 1, "v": "fine"}])  # the engine goes on
            assert client.select_rows("k, v from [//tmp/t]") == [{"k": 1, "v": "fine"}]
    finally:
        engine.stop()


def test_connections_the_server_dropped_answer_reads_and_writes_retriably_then_are_replaced(
        postgres: RunServer, tmp_path: Path) -> None:
    """A database server that drops the engine's connections (a restart behind a proxy, an idle-session
    timeout, an administrator's ``pg_terminate_backend``): each statement that meets a dropped
    connection answers 105, never an internal error - also the few-key lookups and the commit
    statements that run on the driver's cursor - and the next request gets a new connection."""
    url = postgres.create_database("dropped")
    database = url.rsplit("/", 1)[1]
    engine = started("alpha", tmp_path / "a", url)
    try:
        with engine.client() as client:
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table("//tmp/t")
            wait_for(lambda: client.get("//tmp/t/@tablet_state") == "mounted", 30, "mounted")
            client.insert_rows("//tmp/t", [{"k": k, "v": f"v{k}"} for k in range(100)])
            def retried(what: str, request: Callable[[], Any]) -> Any:
                for _attempt in range(5):
                    try:
                        return request()
                    except YtError as exc:
                        # retriable; an internal error (500, code 1) would be the engine's fault
                        assert exc.code == ErrorCode.UNAVAILABLE, (what, exc.code, str(exc)[:300])
                raise AssertionError(f"{what} still refused after 5 attempts")

            requests: list[tuple[str, Callable[[], Any]]] = [
                ("lookup", lambda: client.lookup_rows("//tmp/t", [{"k": 1}, {"k": 2}])),
                ("insert", lambda: client.insert_rows("//tmp/t", [{"k": 1000 + n, "v": "new"} for n in range(3)])),
                ("select", lambda: client.select_rows("k from [//tmp/t] where k < 3")),
            ]
            for _round in range(3):
                for what, request in requests:
                    postgres.psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  f"WHERE datname = '{database}' AND pid <> pg_backend_pid()")
                    retried(what, request)
            assert retried("lookup", lambda: client.lookup_rows("//tmp/t", [{"k": 1}, {"k": 1000}])) == [
                {"k": 1, "v": "v1"}, {"k": 1000, "v": "new"}]
        logged = engine.log_path.read_text(errors="replace")
        assert "failed with an internal error" not in logged and '"level": "error"' not in logged
    finally:
        engine.stop()


def test_strings_order_byte_by_byte_whatever_the_database_collation(postgres: RunServer, tmp_path: Path) -> None:
    # a database whose default collation puts "B" after "a" (ICU's en-US: no OS locale needed)
    url = postgres.create_database("collated", "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                                               "LOCALE 'C.UTF-8'")
    engine = started("alpha", tmp_path / "a", url)
    try:
        with engine.client() as client:
            path = "//tmp/names"
            client.create("table", path, attributes={
                "dynamic": True, "pivot_keys": [[], ["a"]],
                "schema": [{"name": "k", "type": "string", "sort_order": "ascending"}, {"name": "n", "type": "int64"}]})
            client.mount_table(path)
            wait_for(lambda: client.get(f"{path}/@tablet_state") == "mounted", 30, "mounted")
            keys = ["b", "B", "a", "A", "ä", "Z", "_"]
            client.insert_rows(path, [{"k": k, "n": i} for i, k in enumerate(keys)])
            ordered = [r["k"] for r in client.select_rows(f"k from [{path}]")]
            assert ordered == sorted(keys, key=lambda k: k.encode())  # A B Z _ a b ä
            assert [r["k"] for r in client.select_rows(f'k from [{path}] where k < "a"')] == ["A", "B", "Z", "_"]
            assert [r["k"] for r in client.select_rows(f'k from [{path}] where k >= "a" and k < "b"')] == ["a"]
            assert [(r or {}).get("k") for r in client.lookup_rows(path, [{"k": "ä"}, {"k": "A"}])] == ["ä", "A"]
    finally:
        engine.stop()


# -- durability across PostgreSQL restarts -----------------------------------------------------------


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A server of this module's own (it is shut down and started again); a slow WAL writer, so that
    a crash right after a commit made with durability=async loses it."""
    with PostgresServer(settings={"wal_writer_delay": "10s", "wal_writer_flush_after": "0"}) as server:
        yield server


class Writer(threading.Thread):
    """Inserts one new key per commit until stopped; remembers what was acknowledged and what failed."""

    def __init__(self, client: Client, path: str, first_key: int, **options: Any) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.options, self.first_key = client, path, options, first_key
        self.acked: list[int] = []
        self.failed: dict[int, int] = {}  # key -> the error code the engine answered
        self.unknown: list[int] = []  # no answer at all (the outcome is the engine's to tell)
        self.stop_event = threading.Event()

    def run(self) -> None:
        key = self.first_key
        while not self.stop_event.is_set():
            key += 1
            try:
                self.client.insert_rows(self.path, [{"k": key, "v": f"v{key}"}], **self.options)
            except TransportError:
                self.unknown.append(key)
            except YtError as exc:
                self.failed[key] = int(exc.code)
                time.sleep(0.05)
            else:
                self.acked.append(key)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)

    def acked_after(self, count: int, timeout: float) -> None:
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target, timeout, f"{count} more acknowledged writes")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgresql_restarting_under_writes_loses_no_acknowledged_write(
        own_server: PostgresServer, tmp_path: Path, mode: str) -> None:
    meta_db = own_server.create_database(f"meta_{mode}")
    with EngineSet(tmp_path, names=("primary", "replica"), storage={"primary": meta_db, "replica": "sqlite"}) \
            as clusters:
        path = clusters.replicated_table("//tmp/t", SCHEMA)
        replica_id = clusters.replica(path, "replica", "//tmp/t", mode="async")
        pid = clusters.engines["primary"].pid
        url = clusters.engines["primary"].url
        # two writers: while one waits for the database to say whether its commit happened, the
        # other is answered at once
        with Client(url, TEST_TOKEN, timeout=120) as one, Client(url, TEST_TOKEN, timeout=120) as other:
            writers = [Writer(one, path, 0, require_sync_replica=False),
                       Writer(other, path, 10_000_000, require_sync_replica=False)]
            for writer in writers:
                writer.start()
            try:
                writers[0].acked_after(50, 30)
                own_server.shut_down(mode)
                # while it is away: retriable answers, never an internal error
                wait_for(lambda: sum(len(w.failed) for w in writers) >= 3, 30,
                         "writes answered while PostgreSQL is away")
                with httpx.Client() as http:
                    ready = http.get(f"{url}/readyz")
                assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
                time.sleep(1.0)
                own_server.start_again()
                # back by itself: no restart of the engine
                for writer in writers:
                    writer.acked_after(20, 60)
            finally:
                for writer in writers:
                    writer.finish()
                if not own_server.running:
                    own_server.start_again()
        assert clusters.engines["primary"].pid == pid
        # an expected outage: warnings naming the reason, no error with a traceback per background pass
        logged = clusters.engines["primary"].log_path.read_text(errors="replace").splitlines()
        assert not [line for line in logged if '"level": "error"' in line][:3]
        assert any("waits for the database" in line for line in logged)
        acked = {k for w in writers for k in w.acked}
        failed = {k: code for w in writers for k, code in w.failed.items()}
        unknown = {k for w in writers for k in w.unknown}
        assert set(failed.values()) == {ErrorCode.UNAVAILABLE}, failed
        # what the table holds, as its async replica on SQLite received it (the replication queue
        # in PostgreSQL, pushed in order: a row twice or a gap would stall or differ)
        clusters.wait_in_sync(replica_id, timeout=60)
        replica_rows = clusters.client("replica").select_rows("k, v from [//tmp/t]")
        rows = {r["k"] for r in replica_rows}
        assert len(rows) == len(replica_rows) and all(r["v"] == f"v{r['k']}" for r in replica_rows)
        assert acked <= rows, sorted(acked - rows)[:10]
        # a failed write did not happen (a commit whose answer was lost was looked up, not guessed)
        assert not rows & set(failed), sorted(rows & set(failed))
        assert rows <= acked | unknown


def test_a_lost_async_commit_stops_writes_until_a_restart(own_server: PostgresServer, tmp_path: Path) -> None:
    url = own_server.create_database("relaxed")
    engine = started("alpha", tmp_path / "a", url)
    try:
        with engine.client() as client:
            path = "//tmp/relaxed"
            client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "atomicity": "none"})
            client.mount_table(path)
            wait_for(lambda: client.get(f"{path}/@tablet_state") == "mounted", 30, "mounted")
            client.insert_rows(path, [{"k": 0, "v": "durable"}], atomicity="none")
            lost = False
            for attempt in range(1, 6):
                probe = 100 + attempt
                # acknowledged without a WAL flush; PostgreSQL crashes before its WAL writer flushes it
                client.insert_rows(path, [{"k": attempt, "v": "relaxed"}], atomicity="none", durability="async")
                own_server.shut_down("immediate")
                own_server.start_again()
                sql = RunServer(f"127.0.0.1:{own_server.port}")
                present = sql.psql(f'SELECT count(*) FROM "{path}" WHERE k = {attempt}', url.rsplit("/", 1)[1]) == "1"
                if present:
                    # it was flushed after all (another commit flushed the WAL): the engine goes on
                    wait_for(lambda: _inserted(client, path, probe), 30, "writes again")  # noqa: B023
                    continue
                lost = True
                with pytest.raises(YtError) as refused:
                    wait_for(lambda: _inserted(client, path, probe), 30, "the refusal",  # noqa: B023
                             retry_on=(TransportError,))
                assert refused.value.code == ErrorCode.IO_ERROR
                assert "memory is ahead of its database" in str(refused.value)
                with httpx.Client() as http:
                    assert http.get(f"{engine.url}/healthz").status_code == 503
                    assert http.get(f"{engine.url}/readyz").status_code == 503
                break
            assert lost, "no crash lost an async commit in 5 attempts (wal_writer_delay = 10s)"
    finally:
        engine.stop()
    # a restart reloads it from the database: it writes again, and reads what the database holds
    engine.start()
    try:
        with engine.client() as client:
            client.insert_rows("//tmp/relaxed", [{"k": 1000, "v": "after"}], atomicity="none")
            keys = [r["k"] for r in client.select_rows("k from [//tmp/relaxed]")]
            assert 0 in keys and 1000 in keys and attempt not in keys
    finally:
        engine.stop()


def _inserted(client: Client, path: str, key: int) -> bool:
    """One insert: True once it succeeds, False while the engine answers 105 (PostgreSQL still
    coming back); any other error raises."""
    try:
        client.insert_rows(path, [{"k": key, "v": "probe"}], atomicity="none")
    except YtError as exc:
        if exc.code == ErrorCode.UNAVAILABLE and not isinstance(exc, TransportError):
            return False
        raise
    return True


def test_a_sync_replica_losing_its_database_while_it_prepares_holds_nothing_once_it_is_back(
        own_server: PostgresServer, tmp_path: Path) -> None:
    """A prepare whose SQL transaction never committed (the server crashed inside it) leaves no
    record, so nothing ever asks its coordinator about it: what it held in memory (row locks, the
    wait of every read) goes back with it. Found by the fault suite: a replica's reads timed out
    for good after such a crash, when the coordinator's abort was lost too (the database was away)."""
    replica_db = own_server.create_database("prepare_lost")
    clusters = EngineSet(tmp_path, names=("primary", "replica"), storage={"replica": replica_db})
    clusters.start()
    try:
        replica_engine = clusters.engines["replica"]
        path = clusters.replicated_table("//tmp/t", SCHEMA)
        # enabled once caught up; writes go in once it turned in sync (until then 1732, retriable)
        clusters.wait_in_sync(clusters.replica(path, "replica", "//tmp/t", mode="sync"))
        clusters.meta.insert_rows(path, [{"k": 1, "v": "before"}])
        replica_engine.stop()
        # the replica sleeps inside its prepare's SQL transaction, rows held: the server crashes meanwhile
        replica_engine.env = {"REPTABLES_DELAY_AT": "participant_prepare_held:2.0"}
        replica_engine.start()
        failed: list[YtError] = []

        def write() -> None:
            try:
                clusters.meta.insert_rows(path, [{"k": 2, "v": "lost"}])
            except YtError as exc:
                failed.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(1.0)
        own_server.shut_down("immediate")
        writer.join(30)
        assert failed, "the write was acknowledged though its sync replica's database crashed in its prepare"
        time.sleep(1.5)  # the coordinator's abort finds the database away too: it is lost
        own_server.start_again()
        with replica_engine.client() as client:
            # a read after it neither waits for the lost prepare nor finds its row (before the fix:
            # "Timed out waiting for prepared transactions ..." on every read, for good)
            rows = wait_for(lambda: client.select_rows("k, v from [//tmp/t]"), 30, "a read of the replica",
                            retry_on=(YtError,))
            assert rows == [{"k": 1, "v": "before"}]
        # the key is writable again: no row lock of the lost prepare is left
        replica_engine.stop()
        replica_engine.env = {}
        replica_engine.start()
        wait_for(lambda: _written(clusters, path, {"k": 2, "v": "after"}), 30, "a write of the same key")
        assert sorted(clusters.rows("replica", "//tmp/t"), key=lambda r: r["k"]) == [
            {"k": 1, "v": "before"}, {"k": 2, "v": "after"}]
    finally:
        if not own_server.running:
            own_server.start_again()
        clusters.stop()


def _written(clusters: EngineSet, path: str, row: dict[str, Any]) -> bool:
    try:
        clusters.meta.insert_rows(path, [row])
    except YtError as exc:
        if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT) or "sync" in exc.message:
            return False
        raise
    return True
