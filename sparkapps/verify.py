"""The verify job: do two copies of a table hold the same rows at one timestamp? (VDiff-like)

After a bootstrap, or whenever a replica is suspected to differ from its source, the question is
not "do the row counts match" but "which keys differ". The job splits the left table into the data
source's key ranges at a timestamp T, and in one Spark task per range reads that range on both
sides at T and compares a row count and an order-independent checksum (the sum, modulo 2^64, of a
64-bit hash of each row's canonical JSON) — and, only for a range that differs, the keys: missing
on the left, missing on the right, or different. Exit status 0 when every range matches, 1 with the
differing keys listed (the first ``--max-keys``) otherwise, 2 when a side cannot be read.

Both sides are read at the same T: for two replicas of one replicated table that is the
meta-cluster's timestamp, which both carry (replicated rows keep their commit timestamps); give
``--timestamp`` (e.g. one in sync for both: ``get_in_sync_replicas``). Default: the later of a
timestamp generated on each cluster (each has its own clock). Tokens or peer credentials come from
files or the environment.

    python -m reptables.sparkapps.verify --left-proxy URL --left-token-file F --left-path //t \\
        --right-proxy URL --right-token-file G --right-path //t [--timestamp T] [--partitions N]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from reptables.engine.errors import YtError

from .options import ReptablesSparkError, SourceOptions
from .reader import KeyRange, ReptablesReader, plan_partitions
from .schema_mapping import spark_schema
from .session import job_session
from .tables import TableInfo

log = logging.getLogger("reptables.sparkapps.verify")

_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RangeResult:
    """One key range compared: counts and checksums of both sides, and the keys that differ."""

    index: int
    left_rows: int
    right_rows: int
    left_checksum: int
    right_checksum: int
    #: (key, how): "missing on the right", "missing on the left", "differs"
    differences: tuple[tuple[tuple[Any, ...], str], ...] = field(default_factory=tuple)

    @property
    def matches(self) -> bool:
        return self.left_rows == self.right_rows and self.left_checksum == self.right_checksum


def row_hash(row: dict[str, Any]) -> int:
    """A 64-bit hash of a row's canonical form (columns sorted by name)."""
    text = orjson.dumps(row, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _hashes(batches: Iterator[pa.RecordBatch], key_names: Sequence[str]) -> dict[tuple[Any, ...], int]:
    out: dict[tuple[Any, ...], int] = {}
    for batch in batches:
        for row in batch.to_pylist():
            out[tuple(row[k] for k in key_names)] = row_hash(row)
    return out


def compare_range(left: ReptablesReader, right: ReptablesReader, key_range: KeyRange, max_keys: int) -> RangeResult:
    """Read one range on both sides and compare it (runs in a Spark task)."""
    keys = key_range.key_names
    mine, theirs = _hashes(left.read(key_range), keys), _hashes(right.read(key_range), keys)
    result = RangeResult(key_range.index, len(mine), len(theirs), sum(mine.values()) & _MASK,
                         sum(theirs.values()) & _MASK)
    if result.matches:
        return result
    differences: list[tuple[tuple[Any, ...], str]] = []
    for key in sorted(mine.keys() | theirs.keys(), key=repr):
        if len(differences) >= max_keys:
            break
        if key not in theirs:
            differences.append((key, "missing on the right"))
        elif key not in mine:
            differences.append((key, "missing on the left"))
        elif mine[key] != theirs[key]:
            differences.append((key, "differs"))
    return RangeResult(result.index, result.left_rows, result.right_rows, result.left_checksum,
                       result.right_checksum, tuple(differences))


def verify(spark: Any, left: SourceOptions, right: SourceOptions, timestamp: int, partitions: int | None = None,
           max_keys: int = 100) -> list[RangeResult]:
    """Compare two sorted tables at ``timestamp`` in the left table's key ranges; results per range."""
    try:
        with left.client() as client:
            info = TableInfo.fetch(client, left.path)
            if not info.sorted:
                raise ReptablesSparkError(f"verify: table {left.path} is ordered; the verify job compares sorted "
                                          "tables (by key)")
            ranges = plan_partitions(client, info, timestamp, partitions)
        with right.client() as client:
            other = TableInfo.fetch(client, right.path)
    except (YtError, ValueError) as exc:
        raise left.failure("verify", exc) from None
    if [(c.name, c.type, c.key) for c in info.columns] != [(c.name, c.type, c.key) for c in other.columns]:
        raise ReptablesSparkError(f"verify: tables {left.path} and {right.path} have different schemas")
    schema = spark_schema(info.columns)
    left_reader, right_reader = ReptablesReader(left, schema), ReptablesReader(right, schema)
    rdd = spark.sparkContext.parallelize(ranges, max(1, len(ranges)))
    results: list[RangeResult] = rdd.map(lambda r: compare_range(left_reader, right_reader, r, max_keys)).collect()
    return sorted(results, key=lambda r: r.index)


def _options(proxy: str, secret_file: Path | None, env: str, path: str, timestamp: int) -> SourceOptions:
    token = secret_file.read_text().strip() if secret_file is not None else os.environ.get(env, "").strip()
    if not token:
        raise ReptablesSparkError(f"verify: no token for {proxy}: give a token file or set {env}")
    return SourceOptions.parse({"proxy": proxy, "token": token, "path": path, "timestamp": str(timestamp)})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.sparkapps.verify", description=__doc__.split("\n")[0])
    for side in ("left", "right"):
        parser.add_argument(f"--{side}-proxy", required=True)
        parser.add_argument(f"--{side}-token-file", type=Path,
                            help=f"token or peer credential (default: $REPTABLES_{side.upper()}_TOKEN)")
        parser.add_argument(f"--{side}-path", required=True)
    parser.add_argument("--timestamp", type=lambda v: int(v, 0), default=None)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--max-keys", type=int, default=100, help="differing keys listed per range at most")
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        if args.timestamp is None:
            # each cluster has its own clock: the later of the two "now"s sees every change either
            # side had acknowledged when the job started
            stamps = []
            for proxy, secret, env, path in ((args.left_proxy, args.left_token_file, "REPTABLES_LEFT_TOKEN",
                                              args.left_path),
                                             (args.right_proxy, args.right_token_file, "REPTABLES_RIGHT_TOKEN",
                                              args.right_path)):
                with _options(proxy, secret, env, path, 1).client() as client:
                    stamps.append(int(client.generate_timestamp()))
            args.timestamp = max(stamps)
        left = _options(args.left_proxy, args.left_token_file, "REPTABLES_LEFT_TOKEN", args.left_path, args.timestamp)
        right = _options(args.right_proxy, args.right_token_file, "REPTABLES_RIGHT_TOKEN", args.right_path,
                         args.timestamp)
        with job_session("reptables-verify", args.master) as spark:
            started = time.monotonic()
            results = verify(spark, left, right, args.timestamp, args.partitions, args.max_keys)
    except (ReptablesSparkError, YtError) as exc:
        log.error("verify failed: %s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - Spark wraps a task's error; its message names the table
        log.error("verify failed: %s", str(exc).strip().splitlines()[-1] if str(exc).strip() else exc)
        return 2
    seconds = time.monotonic() - started
    rows = sum(r.left_rows for r in results)
    bad = [r for r in results if not r.matches]
    for r in results:
        log.info("range %d: left %d rows (checksum %016x), right %d rows (checksum %016x): %s", r.index, r.left_rows,
                 r.left_checksum, r.right_rows, r.right_checksum, "match" if r.matches else "DIFFER")
        for key, how in r.differences:
            log.info("  key %s: %s", list(key), how)
    log.info("verify of %s (%s) and %s (%s) at %#x: %d ranges, %d rows on the left, %d differing ranges, %.1f s",
             args.left_path, args.left_proxy, args.right_path, args.right_proxy, args.timestamp, len(results), rows,
             len(bad), seconds)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
