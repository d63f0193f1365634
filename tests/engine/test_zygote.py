"""Engines forked by the zygote are engines of their own, and spawned ones still work.

The test suite forks its engines from a zygote that imported the engine once (engine/zygote.py):
each must still be a process of its own - its session, its environment, its log - whose exit its
starter sees with the code it exited with, as ``subprocess.Popen`` reports it. Engines whose
environment changes how Python starts are spawned, and ``exec`` still spawns every engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from reptables.engine import process
from reptables.engine.process import LAUNCH_ENV, ForkedProcess, LocalEngine, start_all, stop_all

FORK = {LAUNCH_ENV: "fork"}


def _list_sys(engine: LocalEngine, token: str) -> httpx.Response:
    return httpx.get(f"{engine.url}/api/v4/list", params={"path": "//sys"},
                     headers={"Authorization": f"OAuth {token}"}, timeout=10)


def test_forked_engines_are_processes_of_their_own_whose_exits_are_seen(tmp_path: Path) -> None:
    engines = start_all([LocalEngine(f"z{i}", tmp_path / f"z{i}", token=f"token-z{i}", env=dict(FORK))
                         for i in range(3)])
    try:
        for index, engine in enumerate(engines):
            assert isinstance(engine.proc, ForkedProcess)
            assert os.getsid(engine.pid) == os.getpgid(engine.pid) == engine.pid  # its own session
            # the token it was started with reached it through its own environment, and no other works
            assert _list_sys(engine, f"token-z{index}").json() == {"value": ["clusters"]}
            assert _list_sys(engine, f"token-z{(index + 1) % 3}").status_code == 401
            assert f'"cluster": "z{index}"' in engine.log_path.read_text()  # its own log
        assert len({engine.pid for engine in engines}) == 3
        first, second, third = engines
        first.stop()  # SIGTERM: a graceful stop, exit status 0
        assert first.proc is not None and first.proc.returncode == 0
        assert "engine stopped" in first.log_path.read_text()
        second.kill()
        assert second.proc is not None and second.proc.returncode == -signal.SIGKILL
        os.kill(third.pid, signal.SIGSTOP)  # paused is not exited
        time.sleep(0.2)
        assert third.alive()
        os.kill(third.pid, signal.SIGCONT)
        assert _list_sys(third, "token-z2").status_code == 200
        with pytest.raises(subprocess.TimeoutExpired):
            assert third.proc is not None
            third.proc.wait(timeout=0.2)
    finally:
        assert stop_all(engines) == []


def test_a_forked_engine_that_fails_to_start_reports_its_exit_and_log(tmp_path: Path) -> None:
    engine = LocalEngine("bad", tmp_path / "bad", env=dict(FORK), extra_args=["--no-such-option"])
    with pytest.raises(RuntimeError) as failed:
        engine.start(timeout=20)
    assert isinstance(engine.proc, ForkedProcess)
    assert "engine bad exited with 2" in str(failed.value) and "--no-such-option" in str(failed.value)


def test_engines_that_need_a_new_interpreter_are_spawned(tmp_path: Path) -> None:
    spawned = [LocalEngine("py", tmp_path / "py", env={**FORK, "PYTHONFAULTHANDLER": "1"}),
               LocalEngine("plain", tmp_path / "plain", env={LAUNCH_ENV: "exec"})]
    start_all(spawned)
    try:
        for engine in spawned:
            assert isinstance(engine.proc, subprocess.Popen)
            assert os.getsid(engine.pid) == engine.pid
            assert _list_sys(engine, engine.read_token()).status_code == 200
    finally:
        assert stop_all(spawned) == []
    assert [engine.proc.returncode for engine in spawned if engine.proc is not None] == [0, 0]


def test_engines_outlive_their_zygote_and_a_new_zygote_forks_the_next(tmp_path: Path) -> None:
    old = LocalEngine("old", tmp_path / "old", env=dict(FORK)).start()
    try:
        process._close_zygote()  # as when the process that started it exits: its engines run on
        assert old.alive()
        assert _list_sys(old, old.read_token()).status_code == 200
        new = LocalEngine("new", tmp_path / "new", env=dict(FORK)).start()
        assert isinstance(new.proc, ForkedProcess)
        new.stop()
        assert new.proc.returncode == 0
    finally:
        old.stop()
    # its code went with the zygote that was its parent: exited, status unknown
    assert old.proc is not None and old.proc.returncode == -1 and not old.alive()
