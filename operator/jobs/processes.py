"""Running the jobs as local processes with local Spark: ``reptables up`` and the tests.

Every job is a child process in a process group of its own (``start_new_session``), so stopping a
job stops its Spark JVM too and nothing else: the launcher signals exactly the groups of the
processes it started, by pid. Its secrets go to files of mode 0600 in a directory of mode 0700 that
only this launcher uses, and are deleted when the job ends. A job's output is its log; its
``... failed: ...`` line (secrets masked) is what the user sees of a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .launcher import JobSpec, JobState, error_line, mask

_ROWS_COPIED = re.compile(r"bootstrap copied (\d+) rows")


@dataclass
class _LocalJob:
    spec: JobSpec
    process: subprocess.Popen[bytes]
    directory: Path
    log: Path
    state: JobState | None = None


class LocalLauncher:
    """Runs each job as a local process with local Spark (``reptables up``, tests).

    Every job runs in a process group of its own (``start_new_session``), so stopping it stops its
    Spark JVM too and nothing else: the launcher signals exactly the groups of the processes it
    started, by pid. Secrets go to files of mode 0600 in a directory of mode 0700 that only this
    launcher uses, deleted when the job ends.
    """

    def __init__(self, base_dir: Path | None = None, python: str = sys.executable, master: str = "local[2]",
                 env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.master = master
        self.env = dict(env or {})
        self.directory = Path(tempfile.mkdtemp(prefix="reptables-jobs-", dir=base_dir))
        self.directory.chmod(0o700)
        #: guards _jobs; a leaf (starting or signalling a process never waits for another lock)
        self._lock = threading.Lock()
        self._jobs: dict[str, _LocalJob] = {}  # guarded by _lock

    def start(self, job: JobSpec) -> str:
        ref = f"local:{job.name}"
        with self._lock:
            if ref in self._jobs:
                return ref
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job.name)
            directory = self.directory / safe
            directory.mkdir(mode=0o700)
            argv = [self.python, "-m", job.module, *job.args]
            for option, value in job.secrets.items():
                path = directory / option
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(value)
                argv += [f"--{option}", str(path)]
            argv += ["--master", self.master]
            env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": self.python, **self.env}
            for name in ("REPTABLES_META_TOKEN", "REPTABLES_SOURCE_CREDENTIAL", "REPTABLES_TARGET_CREDENTIAL",
                         "REPTABLES_LEFT_TOKEN", "REPTABLES_RIGHT_TOKEN"):
                env.pop(name, None)  # the files are the only secrets a job gets
            log = directory / "log"
            with open(log, "wb") as out:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True, close_fds=True)
            self._jobs[ref] = _LocalJob(job, process, directory, log)
        return ref

    def poll(self, ref: str) -> JobState | None:
        with self._lock:
            job = self._jobs.get(ref)
        if job is None:
            return None
        if job.state is not None:
            return job.state
        code = job.process.poll()
        if code is None:
            return JobState(running=True)
        text = job.log.read_text(errors="replace")
        rows = _ROWS_COPIED.findall(text)
        state = JobState(running=False, exit_code=code,
                         error=None if code == 0 else mask(error_line(text, code), job.spec.secrets),
                         rows_copied=int(rows[-1]) if rows else None)
        self._forget_secrets(job)
        job.state = state
        return state

    def log_of(self, ref: str) -> str:
        """The job's output (for a person debugging; secrets masked)."""
        with self._lock:
            job = self._jobs.get(ref)
        if job is None or not job.log.exists():
            return ""
        return mask(job.log.read_text(errors="replace"), job.spec.secrets)

    def pids(self) -> list[int]:
        """Process ids of the jobs still running."""
        with self._lock:
            return [j.process.pid for j in self._jobs.values() if j.process.poll() is None]

    def stop(self, ref: str) -> None:
        with self._lock:
            job = self._jobs.get(ref)
        if job is not None:
            self._stop(job)

    def _stop(self, job: _LocalJob) -> None:
        if job.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
                try:
                    os.killpg(job.process.pid, sig)  # the group this launcher created: the job and its JVM
                except ProcessLookupError:
                    break
                try:
                    job.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._forget_secrets(job)

    @staticmethod
    def _forget_secrets(job: _LocalJob) -> None:
        for option in job.spec.secrets:
            (job.directory / option).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._stop(job)
        shutil.rmtree(self.directory, ignore_errors=True)

