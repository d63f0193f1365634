"""Change streams of one engine (seed 004, docs/streams.md): what a consumer relies on.

Every change once and in order from a token or a timestamp; commits delivered whole; heartbeats
that move a consumer's position while the table is idle; resuming across a reshard and a SIGKILL
of the engine; retention with vital consumers; compare-and-swap consumer offsets; and the
freshness of reads (``include_event_token``/``compare_event_token``), also through the official
``yt.wrapper``'s generic request path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client, compare_tokens, token_timestamp
from reptables.engine.errors import YtError
from reptables.testing import EngineProcess, wait_for

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "n", "type": "int64"}]
ORDERED = [{"name": "msg", "type": "string"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    e = EngineProcess("streams", tmp_path_factory.mktemp("streams") / "engine").start()
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def client(engine: EngineProcess) -> Iterator[Client]:
    with Client(engine.url, engine.token, timeout=60) as c:
        yield c


_counter = iter(range(1_000_000))


def table(client: Client, schema: list[dict[str, Any]] = SCHEMA, **attrs: Any) -> str:
    path = f"//tmp/s{next(_counter)}"
    client.create("table", path, attributes={"dynamic": True, "schema": schema, "enable_change_log": True, **attrs})
    client.mount_table(path)
    return path


def drain(client: Client, path: str, token: str | None = None, ts: int | None = None,
          limit: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """Every change after the position until an idle answer: (changes, the last token)."""
    events: list[dict[str, Any]] = []
    answer = client.pull_changes(path, from_event_token=token, from_timestamp=ts, max_row_count=limit,
                                 wait_timeout=0)
    while True:
        changes = [e for e in answer["events"] if e["kind"] != "heartbeat"]
        events += changes
        if not changes:
            return events, answer["event_token"]
        answer = client.pull_changes(path, from_event_token=answer["event_token"], max_row_count=limit,
                                     wait_timeout=0)


def pull_refusal(client: Client, path: str, **params: Any) -> YtError | None:
    """The error a pull of ``path`` answers with, or None while it is answered (to wait for a trim)."""
    try:
        client.pull_changes(path, wait_timeout=0, **params)
    except YtError as exc:
        return exc
    return None


def test_sorted_changes_have_kinds_keys_values_and_commit_groups(client: Client) -> None:
    path = table(client)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": 1, "v": "a", "n": 1}, {"k": 2, "v": "b", "n": 2}, {"k": 3, "v": "c", "n": 3}])
    client.insert_rows(path, [{"k": 1, "v": "a2", "n": 10}])
    client.insert_rows(path, [{"k": 2, "n": 20}], update=True)
    client.delete_rows(path, [{"k": 3}])
    events, _ = drain(client, path, ts=start)
    assert [(e["kind"], e["key"]) for e in events] == [
        ("insert", {"k": 1}), ("insert", {"k": 2}), ("insert", {"k": 3}),
        ("update", {"k": 1}), ("update", {"k": 2}), ("delete", {"k": 3})]
    assert events[3]["row"] == {"k": 1, "v": "a2", "n": 10}
    # a partial-row update carries the whole new row
    assert events[4]["row"] == {"k": 2, "v": "b", "n": 20}
    assert "row" not in events[5]
    # the first commit's three changes share its timestamp and end together
    assert len({e["timestamp"] for e in events[:3]}) == 1
    assert [e["commit_end"] for e in events] == [False, False, True, True, True, True]
    # timestamps grow with commits, tokens order the changes, and each says its timestamp
    tokens = [e["event_token"] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert all(token_timestamp(e["event_token"]) == e["timestamp"] for e in events)
    assert events[3]["timestamp"] > events[0]["timestamp"]


def test_resuming_from_any_token_gives_exactly_the_later_changes(client: Client) -> None:
    path = table(client)
    start = client.generate_timestamp()
    for i in range(30):
        client.insert_rows(path, [{"k": i % 7, "v": str(i), "n": i}, {"k": 100 + i, "v": "x", "n": i}])
    everything, _ = drain(client, path, ts=start, limit=3)
    assert len(everything) == 60
    for cut in (0, 1, 17, 59):
        rest, _ = drain(client, path, token=everything[cut]["event_token"], limit=7)
        assert [e["event_token"] for e in rest] == [e["event_token"] for e in everything[cut + 1:]]
    # from a timestamp: every change committed after it
    middle = everything[30]["timestamp"]
    later, _ = drain(client, path, ts=middle)
    assert [e["event_token"] for e in later] == [e["event_token"] for e in everything if e["timestamp"] > middle]


def test_an_answer_never_splits_a_commit(client: Client) -> None:
    path = table(client)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": i, "v": "v", "n": i} for i in range(50)])
    answer = client.pull_changes(path, from_timestamp=start, max_row_count=10, wait_timeout=0)
    assert len(answer["events"]) == 50 and answer["events"][-1]["commit_end"]


def test_idle_pulls_answer_heartbeats_whose_tokens_move_on(client: Client) -> None:
    path = table(client)
    first = client.pull_changes(path, wait_timeout=0)
    time.sleep(0.05)
    started = time.monotonic()
    second = client.pull_changes(path, from_event_token=first["event_token"], wait_timeout=300)
    assert time.monotonic() - started >= 0.25  # it waited for a change
    assert [e["kind"] for e in second["events"]] == ["heartbeat"]
    assert compare_tokens(second["event_token"], first["event_token"]) > 0
    client.insert_rows(path, [{"k": 1, "v": "after", "n": 0}])
    third = client.pull_changes(path, from_event_token=second["event_token"], wait_timeout=0)
    assert [e["row"]["v"] for e in third["events"]] == ["after"]


def test_a_waiting_pull_is_answered_as_soon_as_a_change_commits(client: Client, engine: EngineProcess) -> None:
    path = table(client)
    token = client.pull_changes(path, wait_timeout=0)["event_token"]
    got: dict[str, Any] = {}

    def pull() -> None:
        with Client(engine.url, engine.token, timeout=30) as other:
            got["answer"] = other.pull_changes(path, from_event_token=token, wait_timeout=20_000)
            got["at"] = time.monotonic()

    thread = threading.Thread(target=pull)
    thread.start()
    time.sleep(0.3)
    written = time.monotonic()
    client.insert_rows(path, [{"k": 5, "v": "now", "n": 1}])
    thread.join(timeout=20)
    assert [e["key"] for e in got["answer"]["events"]] == [{"k": 5}]
    assert got["at"] - written < 2.0


def test_ordered_table_appends_carry_tablet_and_row_index(client: Client) -> None:
    path = f"//tmp/o{next(_counter)}"
    client.create("table", path, attributes={"dynamic": True, "schema": ORDERED, "tablet_count": 2,
                                                "enable_change_log": True})
    client.mount_table(path)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"$tablet_index": 1, "msg": "a"}, {"$tablet_index": 1, "msg": "b"}])
    client.insert_rows(path, [{"$tablet_index": 0, "msg": "c"}])
    events, _ = drain(client, path, ts=start)
    assert [(e["kind"], e["$tablet_index"], e["$row_index"], e["row"]["msg"]) for e in events] == [
        ("append", 1, 0, "a"), ("append", 1, 1, "b"), ("append", 0, 0, "c")]


def test_stream_changes_iterates_in_order(client: Client) -> None:
    path = table(client)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": i, "v": "s", "n": i} for i in range(5)])
    stream = client.stream_changes(path, from_timestamp=start, wait_timeout=200)
    assert [next(stream)["key"]["k"] for _ in range(5)] == [0, 1, 2, 3, 4]
    client.delete_rows(path, [{"k": 4}])
    assert next(stream)["kind"] == "delete"


def test_bad_stream_requests_name_the_table_and_the_reason(client: Client) -> None:
    path = table(client)
    other = table(client)
    token = client.pull_changes(other, wait_timeout=0)["event_token"]
    with pytest.raises(YtError, match=f"belongs to the table .* not to {path}"):
        client.pull_changes(path, from_event_token=token)
    with pytest.raises(YtError, match="Invalid from_event_token"):
        client.pull_changes(path, from_event_token="not-a-token")
    with pytest.raises(YtError, match="max_row_count"):
        client.pull_changes(path, max_row_count=0)
    with pytest.raises(YtError, match="not both"):
        client.pull_changes(path, from_event_token=token, from_timestamp=1)
    with pytest.raises(YtError, match="//tmp/missing"):
        client.pull_changes("//tmp/missing")


def test_retention_trims_changes_and_says_where_the_stream_can_start(client: Client) -> None:
    path = table(client, change_retention=1)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": 1, "v": "old", "n": 1}])
    refused = wait_for(lambda: pull_refusal(client, path, from_timestamp=start), 15,
                       "changes older than change_retention to be trimmed", interval=0.3)
    assert refused.code == 1760
    assert refused.attributes["oldest_timestamp"] >= start
    oldest = refused.attributes["oldest_event_token"]
    # from the oldest position still kept, the stream goes on
    client.insert_rows(path, [{"k": 2, "v": "new", "n": 2}])
    events, _ = drain(client, path, token=oldest)
    assert [e["key"]["k"] for e in events] == [2]


def test_a_vital_consumer_holds_its_changes_until_it_advances(client: Client) -> None:
    path = table(client, change_retention=1)
    client.register_queue_consumer(path, "//consumers/audit", vital=True)
    client.insert_rows(path, [{"k": i, "v": "kept", "n": i} for i in range(3)])
    time.sleep(2.5)  # well past change_retention: a background pass ran
    answer = client.pull_consumer("//consumers/audit", path, wait_timeout=0)
    assert [e["key"]["k"] for e in answer["events"]] == [0, 1, 2]
    [registration] = client.list_queue_consumer_registrations(path)
    assert registration["consumer_path"] == "//consumers/audit" and registration["vital"]
    client.advance_consumer("//consumers/audit", path, registration["offset"], answer["event_token"])
    assert client.pull_consumer("//consumers/audit", path, wait_timeout=0)["events"][0]["kind"] == "heartbeat"
    # advanced past them: they are trimmed now
    refused = wait_for(lambda: pull_refusal(client, path, from_event_token=registration["offset"]), 10,
                       "acknowledged changes to be trimmed", interval=0.3)
    assert refused.code == 1760


def test_advance_consumer_is_a_compare_and_swap(client: Client) -> None:
    path = table(client)
    client.register_queue_consumer(path, "//consumers/race")
    client.insert_rows(path, [{"k": 1, "v": "x", "n": 1}])
    [registration] = client.list_queue_consumer_registrations(path)
    answer = client.pull_consumer("//consumers/race", path, wait_timeout=0)
    client.advance_consumer("//consumers/race", path, registration["offset"], answer["event_token"])
    with pytest.raises(YtError) as conflict:
        # a second consumer that read the same offset loses the race
        client.advance_consumer("//consumers/race", path, registration["offset"], answer["event_token"])
    assert conflict.value.code == 1761
    assert conflict.value.attributes["current_offset"] == answer["event_token"]
    client.unregister_queue_consumer(path, "//consumers/race")
    with pytest.raises(YtError, match="not registered"):
        client.pull_consumer("//consumers/race", path)


def test_reads_tell_how_fresh_they_are(client: Client, engine: EngineProcess) -> None:
    path = table(client)
    client.insert_rows(path, [{"k": 1, "v": "x", "n": 1}])
    token = drain(client, path, ts=0)[0][-1]["event_token"]
    params: dict[str, Any] = {}
    rows = client.lookup_rows(path, [{"k": 1}], include_event_token=True, compare_event_token=token,
                              response_parameters=params)
    assert rows == [{"k": 1, "v": "x", "n": 1}]
    assert params["fresh"] is True and params["timestamp"] >= token_timestamp(token)
    assert compare_tokens(params["event_token"], token) > 0
    # a token of a change the data cannot include yet (from the future) is not fresh
    future = f"{token_timestamp(token) + (3600 << 30):016x}" + token[16:]
    params = {}
    client.select_rows(f"* from [{path}]", compare_event_token=future, response_parameters=params)
    assert params["fresh"] is False
    # the official client's generic request path reads the same response parameters
    import yt.wrapper as yt
    import yt.wrapper.driver as driver

    yc = yt.YtClient(proxy=engine.url, token=engine.read_token())
    response = driver.make_request("select_rows", {"query": f"* from [{path}]", "include_event_token": True,
                                                   "compare_event_token": token, "output_format": "json"},
                                   return_content=False, client=yc)
    assert response.response_parameters["fresh"] == True  # noqa: E712 - a YSON boolean
    assert compare_tokens(response.response_parameters["event_token"], token) > 0


def test_resharding_is_invisible_to_a_stream(client: Client) -> None:
    path = table(client)
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": i, "v": "before", "n": i} for i in range(10)])
    before, token = drain(client, path, ts=start)
    client.unmount_table(path)
    client.reshard_table(path, pivot_keys=[[], [3], [7]])
    client.mount_table(path)
    client.insert_rows(path, [{"k": i, "v": "after", "n": i} for i in range(10)])
    client.unmount_table(path)
    client.reshard_table(path, pivot_keys=[[], [5]])
    client.mount_table(path)
    client.delete_rows(path, [{"k": 9}])
    after, _ = drain(client, path, token=token)
    assert [(e["kind"], e["key"]["k"]) for e in after] == [("update", i) for i in range(10)] + [("delete", 9)]
    # a token issued before the reshards resumes exactly after it
    again, _ = drain(client, path, token=before[4]["event_token"])
    assert [e["event_token"] for e in again] == [e["event_token"] for e in before[5:] + after]


def test_a_consumer_resuming_after_an_engine_sigkill_misses_nothing(tmp_path: Path) -> None:
    engine = EngineProcess("crash", tmp_path / "engine").start()
    try:
        with Client(engine.url, engine.token) as c:
            path = table(c)
            start = c.generate_timestamp()
            acknowledged: list[int] = []
            for i in range(20):
                c.insert_rows(path, [{"k": i, "v": "w", "n": i}])
                acknowledged.append(i)
            seen, token = drain(c, path, ts=start, limit=5)
            cut = seen[9]["event_token"]
        engine.kill()
        engine.start()
        with Client(engine.url, engine.token) as c:
            for i in range(20, 25):
                c.insert_rows(path, [{"k": i, "v": "w", "n": i}])
            rest, _ = drain(c, path, token=cut)
            assert [e["key"]["k"] for e in rest] == list(range(10, 25))
            # a token from before the crash and one of the heartbeat kind both resume
            tail, _ = drain(c, path, token=token)
            assert [e["key"]["k"] for e in tail] == list(range(20, 25))
    finally:
        engine.stop()


def test_a_slow_consumer_gets_bounded_answers_and_every_change_once(client: Client, engine: EngineProcess) -> None:
    path = table(client)
    start = client.generate_timestamp()
    rss_before = _rss_kib(engine.pid)
    for i in range(40):
        client.insert_rows(path, [{"k": i * 1000 + j, "v": "x" * 200, "n": j} for j in range(1000)])
    seen: list[int] = []
    token: str | None = None
    answers = 0
    while True:
        answer = client.pull_changes(path, from_event_token=token, from_timestamp=None if token else start,
                                     max_row_count=300, wait_timeout=0)
        changes = [e for e in answer["events"] if e["kind"] != "heartbeat"]
        if not changes:
            break
        # at most the limit, completed to the end of its last commit (1000 rows here)
        assert len(changes) <= 300 + 1000
        seen += [e["key"]["k"] for e in changes]
        token = answer["event_token"]
        answers += 1
        time.sleep(0.01)  # a slow consumer
    assert seen == [i * 1000 + j for i in range(40) for j in range(1000)]
    assert answers >= 40
    # the server holds nothing for a consumer between pulls: 40,000 changes behind cost no memory
    assert _rss_kib(engine.pid) - rss_before < 200 * 1024


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_metrics_show_how_far_each_consumer_lags(client: Client, engine: EngineProcess) -> None:
    import httpx

    path = table(client)
    client.register_queue_consumer(path, "//consumers/metrics", vital=True, from_timestamp=client.generate_timestamp())
    client.insert_rows(path, [{"k": 1, "v": "x", "n": 1}])
    time.sleep(1.2)
    scrape = httpx.get(f"{engine.url}/metrics", headers={"Authorization": f"OAuth {engine.token}"}).text
    [line] = [line for line in scrape.splitlines() if line.startswith("reptables_stream_consumer_lag_seconds")
              and f'table="{path}"' in line]
    assert 'consumer="//consumers/metrics"' in line and 'vital="true"' in line
    assert float(line.rsplit(" ", 1)[1]) >= 1.0


def test_change_rows_keep_their_column_types_after_a_partial_update(client: Client) -> None:
    path = table(client, schema=[{"name": "k", "type": "int64", "sort_order": "ascending"},
                                 {"name": "flag", "type": "boolean"}, {"name": "n", "type": "string"}])
    start = client.generate_timestamp()
    client.insert_rows(path, [{"k": 1, "flag": True, "n": "a"}])
    client.insert_rows(path, [{"k": 1, "n": "b"}], update=True)
    events, _ = drain(client, path, ts=start)
    assert events[1]["row"] == {"k": 1, "flag": True, "n": "b"} and events[1]["row"]["flag"] is True


@pytest.mark.asyncio
async def test_the_async_client_streams_too(engine: EngineProcess) -> None:
    from reptables.engine.client import AsyncClient

    async with AsyncClient(engine.url, engine.token) as client:
        path = f"//tmp/async{next(_counter)}"
        await client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True})
        await client.mount_table(path)
        start = await client.generate_timestamp()
        await client.insert_rows(path, [{"k": i, "v": "a", "n": i} for i in range(3)])
        stream = client.stream_changes(path, from_timestamp=start, wait_timeout=200)
        assert [(await anext(stream))["key"]["k"] for _ in range(3)] == [0, 1, 2]
        await client.delete_rows(path, [{"k": 1}])
        event = await anext(stream)
        assert event["kind"] == "delete" and event["key"] == {"k": 1}
        await stream.aclose()


def test_a_stopping_engine_answers_its_waiting_pulls_and_stops_at_once(tmp_path: Path) -> None:
    """SIGTERM while a consumer waits (``wait_timeout`` of a minute): the pull is answered with a
    heartbeat at once, its token good to resume from, and the engine exits without waiting out the
    minute (before, the server's 10 s grace ran out and the pull's worker held the exit until its end)."""
    engine = EngineProcess("stopping", tmp_path / "engine").start()
    try:
        with Client(engine.url, engine.token, timeout=90) as c:
            path = table(c)
            c.insert_rows(path, [{"k": 1, "v": "before", "n": 0}])
            token = c.pull_changes(path, wait_timeout=0)["event_token"]
        got: dict[str, Any] = {}

        def wait() -> None:
            with Client(engine.url, engine.token, timeout=90) as waiting:
                got["answer"] = waiting.pull_changes(path, from_event_token=token, wait_timeout=60_000)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.0)  # the pull is waiting in the engine
        started = time.monotonic()
        engine.stop(timeout=30)
        stopped_in = time.monotonic() - started
        waiter.join(10)
        assert not waiter.is_alive()
        assert stopped_in < 8, f"the engine took {stopped_in:.1f} s to stop"
        assert engine.proc is not None and engine.proc.returncode == 0
        assert [e["kind"] for e in got["answer"]["events"]] == ["heartbeat"]
        assert compare_tokens(got["answer"]["event_token"], token) >= 0
        engine.start()  # the data directory was closed cleanly: the rows are there, the token resumes
        with Client(engine.url, engine.token, timeout=30) as c:
            c.insert_rows(path, [{"k": 2, "v": "after", "n": 0}])
            resumed = c.pull_changes(path, from_event_token=got["answer"]["event_token"], wait_timeout=0)
            assert [e["row"]["v"] for e in resumed["events"] if e["kind"] != "heartbeat"] == ["after"]
    finally:
        engine.stop()


# -- positions a consumer cannot have been given (hardening) ----------------------------------------

def _future(client: Client, seconds: int) -> int:
    """A timestamp ``seconds`` ahead of the engine's clock."""
    return int(client.generate_timestamp()) + (seconds << 30)


def test_a_position_ahead_of_the_clock_is_refused_and_skips_nothing(client: Client) -> None:
    path = table(client)
    ahead = _future(client, 30)
    with pytest.raises(YtError, match="ahead of every commit") as error:
        client.pull_changes(path, from_timestamp=ahead, wait_timeout=0)
    assert error.value.code == 1802
    [token] = [e["event_token"] for e in client.pull_changes(path, wait_timeout=0)["events"]]
    forged = f"{ahead:016x}{(1 << 64) - 1:016x}{token[32:]}"
    with pytest.raises(YtError, match="ahead of every commit"):
        client.pull_changes(path, from_event_token=forged, wait_timeout=0)
    # the position of now (a timestamp just taken) is fine, and the next insert is in the stream
    now = int(client.generate_timestamp())
    client.insert_rows(path, [{"k": 1, "v": "after", "n": 1}])
    events, _ = drain(client, path, ts=now)
    assert [e["key"] for e in events] == [{"k": 1}]


def test_consumer_offsets_are_checked_like_stream_positions(client: Client) -> None:
    path = table(client)
    for bad in (1 << 63, (1 << 64) - 1, _future(client, 30)):
        with pytest.raises(YtError) as error:
            client.register_queue_consumer(path, "//tmp/c-bad", from_timestamp=bad)
        assert error.value.code == 1802, error.value
    client.register_queue_consumer(path, "//tmp/c")
    [token] = [e["event_token"] for e in client.pull_changes(path, wait_timeout=0)["events"]]
    for ts in (1 << 63, _future(client, 30)):
        with pytest.raises(YtError) as error:
            client.advance_consumer("//tmp/c", path, None, f"{ts:016x}{0:016x}{token[32:]}")
        assert error.value.code == 1802, error.value
    assert client.list_queue_consumer_registrations(path)[0]["timestamp"] < _future(client, 1)


def test_compare_event_token_refuses_a_token_of_another_table(client: Client) -> None:
    path, other = table(client), table(client)
    client.insert_rows(other, [{"k": 1, "v": "x", "n": 1}])
    [change], _ = drain(client, other, ts=1 << 30)
    with pytest.raises(YtError, match="token of the table with id") as error:
        client.lookup_rows(path, [{"k": 1}], compare_event_token=change["event_token"], response_parameters={})
    assert error.value.code == 1802


def test_a_pull_waiting_on_a_removed_table_is_answered_at_once(client: Client, engine: EngineProcess) -> None:
    path = table(client)
    outcome: dict[str, Any] = {}

    def pull() -> None:
        started = time.monotonic()
        with Client(engine.url, engine.token, timeout=60) as waiting:
            try:
                waiting.pull_changes(path, wait_timeout=30_000)
                outcome["answer"] = "a heartbeat"
            except YtError as exc:
                outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=pull)
    thread.start()
    time.sleep(0.5)
    client.unmount_table(path)
    client.remove(path)
    thread.join(20)
    assert outcome.get("seconds", 99) < 5, outcome
    assert outcome["error"].code == 500 and "was removed" in outcome["error"].message, outcome


def test_waiting_pulls_on_a_replica_table_are_bounded_too(client: Client, engine: EngineProcess) -> None:
    """A replica table's pull polls its freshness while it waits: it counts against the limit of
    waiting pulls (16) like any other, so 42 of them leave the engine's other requests alone."""
    import httpx

    path = f"//tmp/replica{next(_counter)}"
    client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "upstream_replica_id": "1-2-3-4",
                                                "enable_change_log": True})
    client.mount_table(path)
    results: list[float] = []

    def pull() -> None:
        started = time.monotonic()
        with Client(engine.url, engine.token, timeout=60) as waiting:
            waiting.pull_changes(path, wait_timeout=8_000)
        results.append(time.monotonic() - started)

    threads = [threading.Thread(target=pull) for _ in range(42)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    assert httpx.get(f"{engine.url}/readyz", timeout=10).status_code == 200
    client.select_rows(f"* from [{path}]")
    assert time.monotonic() - started < 2.0
    for thread in threads:
        thread.join(30)
    # 16 waited their 8 s; the others were answered at once
    assert sum(1 for r in results if r < 4) >= 42 - 16, sorted(results)


def test_change_retention_reads_its_default_until_set(client: Client) -> None:
    path = table(client)
    assert client.get(f"{path}/@change_retention") == 3_600_000
    client.set(f"{path}/@change_retention", 60_000)
    assert client.get(f"{path}/@change_retention") == 60_000


# -- which tables keep a change log (docs/streams.md) -------------------------------------------------


def test_a_table_nobody_streams_keeps_no_log_and_one_switched_on_streams_what_came_after(client: Client) -> None:
    """A table keeps a change log only when asked (the log would double what every commit writes):
    a stream of one without is refused naming the attribute; switched on, it streams every change
    committed after the switch, and a start before the switch is refused (1760), never a gap."""
    path = table(client, enable_change_log=False)
    assert client.get(f"{path}/@enable_change_log") is False
    client.insert_rows(path, [{"k": 1, "v": "before"}])
    before = client.generate_timestamp()
    with pytest.raises(YtError) as refused:
        client.pull_changes(path, wait_timeout=0)
    assert refused.value.code == 1762
    assert f"{path}/@enable_change_log" in str(refused.value) and refused.value.attributes["path"] == path

    assert client.keep_change_log(path) is True and client.keep_change_log(path) is False
    assert client.get(f"{path}/@enable_change_log") is True
    with pytest.raises(YtError) as trimmed:
        client.pull_changes(path, from_timestamp=before, wait_timeout=0)
    assert trimmed.value.code == 1760
    oldest = trimmed.value.attributes["oldest_event_token"]
    client.insert_rows(path, [{"k": 1, "v": "after"}, {"k": 2, "v": "after"}])
    events, _ = drain(client, path, token=oldest)
    assert [(e["kind"], e["key"]["k"], e["row"]["v"]) for e in events] == [("update", 1, "after"),
                                                                             ("insert", 2, "after")]

    # off again: the log is gone, streams are refused; on again: from then on
    client.set(f"{path}/@enable_change_log", False)
    with pytest.raises(YtError) as off:
        client.pull_changes(path, from_event_token=oldest, wait_timeout=0)
    assert off.value.code == 1762
    client.remove(f"{path}/@enable_change_log")  # removing it is the default: off
    assert client.get(f"{path}/@enable_change_log") is False
    with pytest.raises(YtError, match="must be %true or %false"):
        client.set(f"{path}/@enable_change_log", "yes")


def test_registering_a_consumer_switches_the_log_on_and_the_log_stays_while_one_is_registered(
        client: Client) -> None:
    path = table(client, enable_change_log=False)
    client.insert_rows(path, [{"k": 1, "v": "unlogged"}])
    client.register_queue_consumer(path, "//consumers/c1")
    assert client.get(f"{path}/@enable_change_log") is True
    client.insert_rows(path, [{"k": 2, "v": "logged"}])
    answer = client.pull_consumer("//consumers/c1", path, wait_timeout=0)
    assert [e["row"]["v"] for e in answer["events"] if e["kind"] != "heartbeat"] == ["logged"]
    with pytest.raises(YtError) as refused:
        client.set(f"{path}/@enable_change_log", False)
    assert "//consumers/c1" in str(refused.value) and "unregister" in str(refused.value)
    assert client.get(f"{path}/@enable_change_log") is True
    client.unregister_queue_consumer(path, "//consumers/c1")
    client.set(f"{path}/@enable_change_log", False)
    assert client.get(f"{path}/@enable_change_log") is False


def test_the_change_log_setting_is_refused_where_it_does_not_apply(client: Client) -> None:
    replicated = f"//tmp/rep{next(_counter)}"
    with pytest.raises(YtError, match="streams its replication queue"):
        client.create("replicated_table", replicated,
                      attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True})
    client.create("replicated_table", replicated, attributes={"dynamic": True, "schema": SCHEMA})
    with pytest.raises(YtError, match="streams its replication queue"):
        client.set(f"{replicated}/@enable_change_log", True)
    with pytest.raises(YtError, match="enable_change_log must be %true or %false"):
        client.create("table", f"//tmp/bad{next(_counter)}",
                      attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": 1})


def test_the_switch_survives_a_restart(tmp_path: Path) -> None:
    engine = EngineProcess("restart", tmp_path / "engine").start()
    try:
        with engine.client() as c:
            on, off = table(c), table(c, enable_change_log=False)
            c.set(f"{off}/@enable_change_log", True)
            c.set(f"{off}/@enable_change_log", False)
            start = c.generate_timestamp()
        engine.stop()
        engine.start()
        with engine.client() as c:
            c.insert_rows(on, [{"k": 1, "v": "x"}])
            c.insert_rows(off, [{"k": 1, "v": "x"}])
            events, _ = drain(c, on, ts=start)
            assert [e["key"]["k"] for e in events] == [1]
            with pytest.raises(YtError) as refused:
                c.pull_changes(off, from_timestamp=start, wait_timeout=0)
            assert refused.value.code == 1762
    finally:
        engine.stop()
