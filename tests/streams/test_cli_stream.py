"""``reptables stream`` as a user runs it (a subprocess, token in $YT_TOKEN) against real engines.

What a change log kept with it relies on: heartbeats at the interval asked for while the table is
idle; an engine restart that costs nothing (every change printed once, in order, and a line on
stderr when the engine went away and when it came back); an engine gone for good that ends the
command with exit code 1 and a message saying where to resume, after --retry-for seconds, not
before; and an error that asking again cannot cure (a missing table) that ends it at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.testing import EngineProcess, WaitTimeout, wait_for

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
PATH = "//tmp/orders"


class Stream:
    """A running ``reptables stream``: its stdout lines (each with the time it arrived) and its stderr."""

    def __init__(self, engine: EngineProcess, *args: str) -> None:
        env = {**os.environ, "YT_TOKEN": engine.read_token()}
        env.pop("YT_PROXY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reptables.operator.cli", "stream", PATH, "--proxy", engine.url, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.stderr = ""
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), json.loads(line)))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr += line

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for _, e in self.lines if kind is None or e["kind"] == kind]

    def keys(self) -> list[int]:
        return [e["key"]["k"] for e in self.events() if e["kind"] != "heartbeat"]

    def expect(self, what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
        """Wait (bounded) until ``check()``; fail at once, with its stderr, if the command exits first."""
        def seen() -> bool:
            if check():
                return True
            if self.proc.poll() is not None:
                self.finish()
                pytest.fail(f"reptables stream exited with {self.proc.returncode} waiting for {what}:\n{self.stderr}")
            return False

        try:
            wait_for(seen, timeout, what)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}; stdout {self.events()}, stderr:\n{self.stderr}")

    def finish(self) -> None:
        """Let the readers take the rest of the output (the process has exited or was killed)."""
        for reader in self._readers:
            reader.join(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.finish()


@pytest.fixture
def streams() -> Iterator[list[Stream]]:
    started: list[Stream] = []
    try:
        yield started
    finally:
        for stream in started:
            stream.stop()


def create_table(engine: EngineProcess) -> int:
    """The table to stream, mounted; the timestamp to stream from (before any of its changes)."""
    with Client(engine.url, engine.token) as client:
        client.create("table", PATH, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True},
                      force=True)
        client.mount_table(PATH)
        return client.generate_timestamp()


def insert(engine: EngineProcess, keys: range) -> None:
    with Client(engine.url, engine.token) as client:
        for k in keys:
            client.insert_rows(PATH, [{"k": k, "v": f"row {k}"}])


def test_heartbeats_come_at_the_heartbeat_interval_on_an_idle_table(engine: EngineProcess,
                                                                    streams: list[Stream]) -> None:
    create_table(engine)
    stream = Stream(engine, "--heartbeats", "--heartbeat-interval", "0.5")
    streams.append(stream)
    stream.expect("four heartbeats", lambda: len(stream.events("heartbeat")) >= 4)
    arrivals = [at for at, event in stream.lines if event["kind"] == "heartbeat"]
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    assert max(gaps) < 1.5, gaps  # about every 0.5 s (the default pull waited 30 s)
    assert all(event["path"] == PATH for event in stream.events("heartbeat"))


def test_an_engine_restart_loses_and_repeats_no_change(engine: EngineProcess, streams: list[Stream]) -> None:
    start = create_table(engine)
    stream = Stream(engine, "--from-timestamp", str(start), "--heartbeat-interval", "1")
    streams.append(stream)
    insert(engine, range(0, 5))
    stream.expect("the first five changes", lambda: len(stream.keys()) >= 5)
    engine.stop()  # a restart: the same port and data directory
    stream.expect("the outage to be reported", lambda: "unavailable" in stream.stderr)
    engine.start()
    insert(engine, range(5, 10))
    stream.expect("the changes after the restart", lambda: len(stream.keys()) >= 10)
    time.sleep(1.5)  # a pull more: a change printed twice would show now
    assert stream.keys() == list(range(10))
    assert len({e["event_token"] for e in stream.events()}) == 10
    assert stream.proc.poll() is None  # still streaming
    outage, recovery = stream.stderr.splitlines()[:2]
    assert f"the engine at {engine.url} is unavailable (" in outage and "retrying for up to 60 s" in outage
    assert f"the engine at {engine.url} answers again after" in recovery and "resuming after event token" in recovery


def test_an_engine_gone_for_good_ends_the_stream_after_retry_for(tmp_path: Path, streams: list[Stream]) -> None:
    engine = EngineProcess("gone", tmp_path / "gone").start()
    try:
        start = create_table(engine)
        stream = Stream(engine, "--from-timestamp", str(start), "--heartbeat-interval", "1", "--retry-for", "2")
        streams.append(stream)
        insert(engine, range(3))
        stream.expect("the changes", lambda: len(stream.keys()) >= 3)
    finally:
        engine.stop()
    gone = time.monotonic()
    assert stream.proc.wait(15) == 1
    took = time.monotonic() - gone
    stream.finish()
    assert 1.5 <= took < 6, took
    assert stream.keys() == [0, 1, 2]
    lines = stream.stderr.splitlines()
    assert "retrying for up to 2 s" in lines[0]
    last_token = stream.events()[-1]["event_token"]
    assert lines[-1].startswith(f"error: the engine at {engine.url} is still unavailable after ")
    assert "(--retry-for 2)" in lines[-1] and "Cannot reach YT proxy" in lines[-1]
    # where to go on from: the last change printed, or a heartbeat after it (nothing changed since)
    resume = lines[-1].rsplit("resume with --from-token ", 1)[1]
    assert resume >= last_token and resume[32:] == last_token[32:]


def test_a_missing_table_is_an_error_at_once_not_retried(engine: EngineProcess, streams: list[Stream]) -> None:
    stream = Stream(engine, "--retry-for", "60")
    streams.append(stream)
    assert stream.proc.wait(15) == 1
    stream.finish()
    assert "retrying" not in stream.stderr
    assert stream.stderr.startswith("error: ") and PATH in stream.stderr


@pytest.mark.parametrize("interval", ["0", "61"])
def test_a_heartbeat_interval_the_engine_cannot_wait_is_refused(interval: str) -> None:
    result = subprocess.run([sys.executable, "-m", "reptables.operator.cli", "stream", PATH, "--proxy",
                             "http://127.0.0.1:1", "--heartbeat-interval", interval],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Invalid value for '--heartbeat-interval'" in result.stderr
