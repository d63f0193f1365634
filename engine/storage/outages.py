"""Whether an exception is the database being away, for the background loops' logs.

A restart or a failover of the database server (PostgreSQL) makes every background pass fail
until it is back: the replicators, the replication maintenance and the node's compaction. That is
expected and retriable - the API answers 105 meanwhile - so those loops log one warning line
naming the reason instead of an error with a traceback per pass, which would bury a real fault in
the log of every outage. Anything else keeps its traceback.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..errors import UnavailableError

_AWAY = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.PendingRollbackError, UnavailableError)


def outage(exc: BaseException) -> str | None:
    """The first line of the reason if ``exc`` says the database is away, else None."""
    if not isinstance(exc, _AWAY):
        return None
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]
