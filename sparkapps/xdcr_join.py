"""The XDCR join job: a cluster joins a group that holds data, from a snapshot of one member.

Seed 001: a cluster that joins an XDCR group holding data first receives a snapshot from one member
(the donor, ``preferred_source`` among three or more), then the members' changes made after it.
The engines do the delicate parts (``engine/node/xdcr_join.py``): the donor takes a consistent cut
of the table (rows, their versions and tombstones, and the log positions the members continue
from) as numbered pages; the joining cluster loads each page exactly once and, at the end, takes
the cut's positions so that every member ships from there. This job moves the pages:

1. ``dr_join_begin`` on the joining cluster: the table is marked joining and the donor (``--source``,
   else ``//sys/@xdcr_preferred_source``, else its first connection) takes the cut. A job run again
   resumes the same cut (``--restart`` takes a new one);
2. the pages still missing, spread over Spark tasks: each task reads a page (``dr_join_read``, through
   the joining cluster, which holds the credential for the donor) and writes it
   (``dr_join_write``), so a retried task or job loads nothing twice;
3. ``dr_join_finish``: the joining cluster is a member, and the members ship to it.

It needs only the joining cluster's URL and API token (``--token-file`` or ``$YT_TOKEN``, never on
the command line). Run as ``python -m reptables.sparkapps.xdcr_join`` (local Spark),
``reptables dr join`` or as a SparkApplication's main file.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError

from .options import ReptablesSparkError
from .session import job_session

log = logging.getLogger("reptables.sparkapps.xdcr_join")

#: what a retry may cure: an unreachable or overloaded cluster, a timeout, a lock conflict
RETRIABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.TRANSACTION_LOCK_CONFLICT})
#: attempts per page (a page is idempotent: a retry after a lost answer loads nothing twice)
ATTEMPTS = 4


def _load_pages(proxy: str, token: str, path: str, pages: Iterator[int]) -> Iterator[tuple[int, int, int, bool]]:
    """One Spark task: read and write its pages; (page, rows, tombstones, applied) each."""
    with Client(proxy, token, timeout=300.0) as client:
        for page in pages:
            delay = 0.5
            for attempt in range(ATTEMPTS):
                try:
                    entries = client.dr_join_read(path, page)["entries"]
                    answer = client.dr_join_write(path, page, entries)
                    break
                except YtError as exc:
                    if exc.code not in RETRIABLE or attempt + 1 == ATTEMPTS:
                        raise ReptablesSparkError(f"xdcr join of {path} at {proxy}: page {page} failed: "
                                                  f"{exc.message} (YT error code {exc.code})") from None
                    time.sleep(delay)
                    delay *= 2
            yield page, int(answer["rows"]), int(answer["tombstones"]), bool(answer["applied"])


def join(spark: Any, proxy: str, token: str, path: str, source: str | None = None, partitions: int | None = None,
         page_rows: int | None = None, restart: bool = False) -> dict[str, Any]:
    """Begin (or resume) the join of ``path`` on the cluster at ``proxy``, load the missing pages
    in Spark tasks, finish; the totals."""
    try:
        with Client(proxy, token, timeout=900.0) as client:
            begun = client.dr_join_begin(path, source, page_rows, restart)
    except YtError as exc:
        raise ReptablesSparkError(f"xdcr join of {path} at {proxy} could not begin: {exc.message} "
                                  f"(YT error code {exc.code})") from None
    missing = [int(p) for p in begun["missing_pages"]]
    log.info("xdcr join of %s from %s: snapshot %s, %d pages (%d rows, %d tombstones), %d to load", path,
             begun["source"], begun["snapshot_id"], begun["pages"], begun["rows"], begun["tombstones"], len(missing))
    results: list[tuple[int, int, int, bool]] = []
    if missing:
        slices = max(1, min(len(missing), partitions or spark.sparkContext.defaultParallelism))
        results = spark.sparkContext.parallelize(missing, slices).mapPartitions(
            lambda pages: _load_pages(proxy, token, path, pages)).collect()
    try:
        with Client(proxy, token, timeout=120.0) as client:
            finished = client.dr_join_finish(path)
    except YtError as exc:
        raise ReptablesSparkError(f"xdcr join of {path} at {proxy} could not finish: {exc.message} "
                                  f"(YT error code {exc.code})") from None
    return {"source": finished["source"], "pages": int(finished["pages"]),
            "pages_loaded": sum(1 for r in results if r[3]), "pages_already_there": sum(1 for r in results if not r[3])
            + int(begun["pages"]) - len(missing), "rows": int(finished["rows"]),
            "tombstones": int(finished["tombstones"])}


def _token(path: Path | None) -> str:
    if path is not None:
        return path.read_text().strip()
    value = os.environ.get("YT_TOKEN", "").strip()
    if not value:
        raise ReptablesSparkError("xdcr join: no API token for the joining cluster: give --token-file or set YT_TOKEN")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.sparkapps.xdcr_join", description=__doc__.split("\n")[0])
    parser.add_argument("--proxy", default=os.environ.get("YT_PROXY"), help="URL of the joining cluster ($YT_PROXY)")
    parser.add_argument("--token-file", type=Path, help="its API token (default: $YT_TOKEN)")
    parser.add_argument("--path", required=True, help="the XDCR table to join")
    parser.add_argument("--source", default=None, help="the donor, by its //sys/clusters name (default: "
                        "//sys/@xdcr_preferred_source, else the first connection)")
    parser.add_argument("--partitions", type=int, default=None, help="Spark tasks (default: the default parallelism)")
    parser.add_argument("--page-rows", type=int, default=None, help="rows per snapshot page (default 5000)")
    parser.add_argument("--restart", action="store_true", help="take a new snapshot instead of resuming")
    parser.add_argument("--master", default=None, help="Spark master (default: the session's, else local[*])")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        if not args.proxy:
            raise ReptablesSparkError("xdcr join: no joining cluster: give --proxy URL or set YT_PROXY")
        token = _token(args.token_file)
        with job_session(f"reptables-xdcr-join-{args.path}", args.master) as spark:
            started = time.monotonic()
            totals = join(spark, args.proxy, token, args.path, args.source, args.partitions, args.page_rows,
                          args.restart)
        seconds = time.monotonic() - started
        log.info("xdcr join of %s from %s done: %d rows and %d tombstones in %d pages (%d loaded now, %d already "
                 "there) in %.1f s", args.path, totals["source"], totals["rows"], totals["tombstones"], totals["pages"],
                 totals["pages_loaded"], totals["pages_already_there"], seconds)
    except (ReptablesSparkError, OSError) as exc:
        log.error("xdcr join failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
