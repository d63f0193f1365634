"""Shared fixtures: real engine processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import EngineProcess


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess("primary", tmp_path / "primary").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    proc = EngineProcess("shared", tmp_path_factory.mktemp("shared")).start()
    try:
        yield proc
    finally:
        proc.stop()
