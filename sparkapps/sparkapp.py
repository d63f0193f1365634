"""The main file of the reptables SparkApplications: ``sparkapp.py bootstrap|verify|xdcr_join <the job's options>``.

The spark-operator runs a Python application by handing one *file* to spark-submit, and a module
of a package cannot run as a file (its relative imports need the package). So this file is the
one entry point of every job on Kubernetes: the first argument names the job, the rest are that
job's own options, exactly those of ``python -m reptables.sparkapps.bootstrap``, ``... .verify``
and ``... .xdcr_join``.
The job image (``Dockerfile.spark``) copies it to ``/opt/reptables/sparkapp.py``, the operator's
default ``mainApplicationFile``.

It imports by absolute name because it runs as ``__main__``, outside the package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

JOBS = ("bootstrap", "verify", "xdcr_join")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in JOBS:
        print(f"usage: sparkapp.py {{{','.join(JOBS)}}} [the job's options]; got {args[:1] or 'nothing'}",
              file=sys.stderr)
        return 2
    if args[0] == "bootstrap":
        from reptables.sparkapps import bootstrap

        return bootstrap.main(args[1:])
    if args[0] == "xdcr_join":
        from reptables.sparkapps import xdcr_join

        return xdcr_join.main(args[1:])
    from reptables.sparkapps import verify

    return verify.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
