"""The one bounded wait of the tests, the benchmarks and the fault runs.

Why it exists: much of what reptables does happens after the call that asked for it returns
(replication, XDCR shipping, ``enabling`` -> ``enabled``, trimming), so tests and benchmarks poll.
Every poll must end (a stuck engine fails its test in seconds, not the CI job in an hour), and its
failure must say what it waited for and what the engine answered last: an engine that refuses with
an error is not the same failure as one that answers "not yet". There were seven copies of this
loop; they differed in just those points.

What is tricky:

* an error the predicate raises counts as "not yet" only if it is one of ``retry_on`` (by default a
  :class:`~reptables.engine.errors.YtError`: an engine that is restarting or not caught up yet);
  any other exception is a bug in the test or the benchmark and propagates at once;
* the predicate is always asked once more at the deadline, so a slow predicate still gets its
  last look;
* a wait that times out is a failed expectation in a test and a timeout in a benchmark:
  :class:`WaitTimeout` is both an ``AssertionError`` (pytest reports a failure, and ``except
  AssertionError`` catches it) and a ``TimeoutError`` (the benchmarks catch that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from reptables.engine.errors import YtError

__all__ = ["POLL_INTERVAL_S", "WaitTimeout", "wait_for"]

T = TypeVar("T")

#: how long a wait sleeps between two looks, unless told otherwise
POLL_INTERVAL_S = 0.05


class WaitTimeout(AssertionError, TimeoutError):
    """A bounded wait ran out of time: a failed expectation (tests) and a timeout (benchmarks)."""


def wait_for(predicate: Callable[[], T | None], timeout: float = 30.0, what: str = "condition", *,
             interval: float = POLL_INTERVAL_S,
             retry_on: tuple[type[BaseException], ...] = (YtError,)) -> T:
    """Call ``predicate()`` until it returns something truthy and return that; at most ``timeout`` s.

    An exception of ``retry_on`` counts as "not yet", and the last one is in the message of the
    :class:`WaitTimeout` raised when time runs out; any other exception propagates.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except retry_on as exc:
            last_error = exc
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}"
                              + (f" (last error: {last_error})" if last_error is not None else ""))
        time.sleep(min(interval, remaining))
