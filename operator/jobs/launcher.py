"""What the reconcile core asks of whatever runs its Spark jobs: start one, look at it, stop it.

The bootstrap of a replica (a copy, then a verify) and the join of an XDCR member run as jobs that
take seconds to hours, and a reconcile never waits for one: it starts a job and returns, and looks
at it on a later pass by the reference (``jobRef``) it kept in the resource's status. So a
:class:`Launcher` is a small protocol — ``start`` returns at once, ``poll`` answers from what the
launcher can see now (None for a reference it does not know, e.g. after an operator restart) — with
two implementations: local processes (``processes.py``: ``reptables up`` and the tests) and
SparkApplications (``spark_applications.py``: Kubernetes).

A job needs tokens. A :class:`JobSpec` carries them as values in ``secrets``; the launcher hands
them to the job as files of its own making (mode 0600, or a Secret mounted into the driver), never
on a command line, in a status, an event or a log line, and :func:`mask` hides them in the one error
line a failed job leaves for the user.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

#: how often a reconcile looks at a running job
POLL_SECONDS = 2.0
_FAILED_LINE = re.compile(r"((?:bootstrap|verify|xdcr join) failed: .*)$")
_VERIFY_SUMMARY = re.compile(r"(verify of .* differing ranges.*)$")
_MASK = "***"


@dataclass(frozen=True)
class Owner:
    """The resource a job works for: a launcher that creates objects for the job makes them its children."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None


@dataclass(frozen=True)
class JobSpec:
    """One run of a job: ``python -m <module> <args> --<secret option> <file> ...``."""

    name: str
    """Unique among the launcher's jobs (a new one per attempt)."""
    module: str
    args: tuple[str, ...]
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Option name (such as ``meta-token-file``) -> secret value; the launcher passes a file."""
    owner: Owner | None = None
    """The TableReplica being bootstrapped."""

    @property
    def job(self) -> str:
        """``bootstrap`` or ``verify``: the last part of the module's name."""
        return self.module.rsplit(".", 1)[-1]


class LaunchError(Exception):
    """A launcher could not start or follow a job; the message says why (it becomes the attempt's error)."""


@dataclass(frozen=True)
class JobState:
    """What a launcher knows of a job."""

    running: bool
    exit_code: int | None = None
    error: str | None = None
    """One line: why the job failed (secrets masked); None when it succeeded or runs."""
    rows_copied: int | None = None
    """From the bootstrap job's log line ``bootstrap copied N rows``."""


class Launcher(Protocol):
    """Runs the bootstrap and verify jobs somewhere; the reconcile core only starts and polls them."""

    def start(self, job: JobSpec) -> str:
        """Start the job and return its reference (``jobRef``) at once, without waiting for it."""
        ...

    def poll(self, ref: str) -> JobState | None:
        """The job's state, or None when this launcher does not know ``ref`` (e.g. it was restarted)."""
        ...

    def stop(self, ref: str) -> None:
        """Stop the job if it still runs (nothing else)."""
        ...

    def close(self) -> None:
        """Stop every job still running and release what the launcher holds."""
        ...


def mask(text: str, secrets: Mapping[str, str] | list[str]) -> str:
    values = secrets.values() if isinstance(secrets, Mapping) else secrets
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, _MASK)
    return text


def error_line(log: str, exit_code: int) -> str:
    """The one line that says why a job failed: its ``... failed: ...`` line, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        found = _FAILED_LINE.search(line)
        if found:
            return found.group(1)[:1000]
    if exit_code == 1:
        for line in reversed(lines):
            found = _VERIFY_SUMMARY.search(line)
            if found:
                return found.group(1)[:1000]
    tail = lines[-1][:1000] if lines else "no output"
    return f"exit status {exit_code}: {tail}"


