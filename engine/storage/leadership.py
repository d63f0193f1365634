"""Who serves a PostgreSQL database: one leader, standbys waiting for it, and fencing of a replaced one.

Several engine processes may be started for one table cluster over one PostgreSQL database
(``engine serve --standby``, each with its own data directory and port): exactly one serves. The
database itself decides which, so no other coordinator (etcd, Kubernetes leases) is needed and the
engines' clocks do not matter.

Design
------

* **A lease row.** ``_rt_leader`` (``system_tables.py``) holds one row: ``epoch``, ``holder`` (a
  process: host, pid, a random tag), ``address`` (the URL it serves on, ``--advertise-url``) and
  ``expires_at``, by the database's clock (``now()``). The leader renews it every third of the lease
  (``--leader-lease``, 1.5 s by default): ``UPDATE ... SET expires_at = now() + lease WHERE epoch =
  mine``. A standby looks at it every quarter of the lease (at most every 0.5 s) and takes it over
  once ``expires_at < now()``, with one compare-and-set: ``SET epoch = epoch + 1, holder = me,
  expires_at = now() + lease WHERE epoch = seen AND expires_at < now()``. Two standbys racing for it
  queue on the row's lock; the second finds it renewed and goes on waiting.
* **Fencing** (the epoch is the token). Every write transaction of the leader ends, before its
  COMMIT, with the statement that already records its token in ``_rt_last_commit`` (``sql.py``; a
  lost COMMIT answer is looked up by it); that statement now also locks the lease row ``FOR SHARE``
  and compares its epoch, and writes the token only if it is the holder's. One statement, so one
  round trip, as before. The share lock is held from that statement to COMMIT, so a takeover's
  UPDATE waits for a write that is committing, and a write that comes after a takeover sees the new
  epoch (READ COMMITTED reads the newest committed row version once the lock is granted) and rolls
  back. There is no window in which an old leader commits after a new one started: the new leader
  loads its state from the database only after its UPDATE committed, and every commit of the old
  one either finished before that UPDATE could take the row or fails. A write transaction that
  changed nothing takes no lock (there is nothing to fence, and it stays a read-only transaction).
* **Stepping down.** A fenced write answers ``105`` (retriable: it rolled back, nothing happened)
  naming the new leader when it is known, and the engine steps down: it stops serving and its
  ``on_lost`` hook runs (``engine serve`` then stops the process, exit status
  :data:`EXIT_STEPPED_DOWN`, so that its supervisor starts it again, as a standby: demoting in
  process would have to unwind every in-memory structure a leader built, which a restart does by
  construction). A leader also steps down when its renewal finds another epoch.
* **Its own clock for reads.** Fencing guards writes; reads are served from memory (the Cypress
  tree, counters, queue tails), which a new leader's writes make stale. So the leader serves
  nothing - no read, no write - once its own lease has run out by its monotonic clock without a
  successful renewal, counted from the moment the renewal was *sent* (so it ends no later than the
  database's ``expires_at``; with a margin of a tenth of the lease for the rates of the two clocks).
  A leader paused (SIGSTOP, a long GC, a stalled VM) past its lease resumes refusing, finds the new
  epoch at its next renewal, and steps down; it never answers from the memory of before the pause.
  A leader whose renewals fail because the database is away stops serving the same way, and serves
  again when a renewal succeeds with its epoch unchanged (nobody took over meanwhile).
* **Standing by.** A standby connects only to look at the lease (and answers ``/readyz`` 503 and
  every command ``105`` naming the leader's address: ``api/app.py``). When it wins, it builds the
  node from the database exactly as a restart does (``Cluster.open_database``), renewing the lease
  meanwhile, and then serves. Before the takeover's first write it ends the database sessions of the
  holder it replaced (``pg_terminate_backend`` by their ``application_name``, which names the
  holder): a paused leader may hold row locks of an unfinished transaction, or the share lock of a
  commit, and would otherwise block the new leader until it resumed. Ending a session is safe: its
  transaction rolls back, and a COMMIT whose answer it lost is looked up by its token.
* **A single engine** (PostgreSQL without ``--standby``) takes the row at start with no expiry
  (``expires_at`` NULL: nothing renews it, and no clock of its own gates it), with a new epoch, so
  its commits are fenced too: a second engine started on the same database by mistake replaces the
  first, which steps down at its next write (or within seconds: it looks at the row every lease),
  instead of both writing. It refuses to start while a group's leader holds a live lease (start it
  with ``--standby`` to join the group). A standby never takes over from a single engine; an engine
  that stops cleanly (either kind) expires its lease, so a standby takes over at once.

What it assumes: the database server's clock does not jump forward by more than the margin (a jump
ends every lease early: a standby may then take over while the old leader still serves reads for
up to a lease; its writes stay fenced). And the engine's commits happen on its one writer
connection (``sql.py``): the only other statements an engine writes with are the timestamp
reservation (``database.py``), which only ever grows, so an old leader's late write of it is
harmless, and this module's own.

``_lock`` (a leaf, docs/architecture.md) guards the step-down (it happens once) and the leader last
seen; :meth:`serving` reads ``lost`` and the lease's end without it (reference reads).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_LEASE
from ..errors import UnavailableError
from .sql import postgresql_driver_url
from .system_tables import leader_table

log = logging.getLogger("reptables.engine.leadership")

#: the exit status of ``engine serve`` when the engine stepped down (another engine leads now):
#: EX_TEMPFAIL, "try again" - its supervisor starts it again, as a standby
EXIT_STEPPED_DOWN = 75
#: the application_name of the engine's database sessions: this, a space and the holder
APPLICATION = "reptables-engine"
#: the share of the lease the leader counts as its own (the rest covers the two clocks' rates)
_OWN_SHARE = 0.9

_LOOK = sa.text(
    "SELECT epoch, holder, address, expires_at IS NULL OR expires_at > now() AS held, "
    "CASE WHEN expires_at IS NULL THEN NULL ELSE extract(epoch FROM expires_at - now()) END AS remaining "
    "FROM _rt_leader WHERE id = 1")
#: a single engine: the row with no expiry and a new epoch, unless a group's leader holds a live lease
_CLAIM = sa.text(
    "INSERT INTO _rt_leader (id, epoch, holder, address, expires_at) VALUES (1, 1, :holder, :address, NULL) "
    "ON CONFLICT (id) DO UPDATE SET epoch = _rt_leader.epoch + 1, holder = EXCLUDED.holder, "
    "address = EXCLUDED.address, expires_at = NULL "
    "WHERE _rt_leader.expires_at IS NULL OR _rt_leader.expires_at <= now() RETURNING epoch")
#: a standby: the lease it saw expire (or none, if there was no row), compare-and-set on the epoch
_TAKE_OVER = sa.text(
    "INSERT INTO _rt_leader (id, epoch, holder, address, expires_at) "
    "VALUES (1, 1, :holder, :address, now() + :lease * interval '1 second') "
    "ON CONFLICT (id) DO UPDATE SET epoch = _rt_leader.epoch + 1, holder = EXCLUDED.holder, "
    "address = EXCLUDED.address, expires_at = EXCLUDED.expires_at "
    "WHERE _rt_leader.epoch = :seen AND _rt_leader.expires_at <= now() RETURNING epoch")
_RENEW = sa.text(
    "UPDATE _rt_leader SET expires_at = now() + :lease * interval '1 second', address = :address "
    "WHERE id = 1 AND epoch = :epoch AND holder = :holder RETURNING epoch")
_HELD = sa.text("SELECT epoch FROM _rt_leader WHERE id = 1")
_RELEASE = sa.text(
    "UPDATE _rt_leader SET expires_at = now() - interval '1 millisecond' "
    "WHERE id = 1 AND epoch = :epoch AND holder = :holder")
_END_SESSIONS = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = :application AND pid <> pg_backend_pid()")
#: SQLSTATE of lock_not_available (lock_timeout) and query_canceled (statement_timeout)
_TIMED_OUT = ("55P03", "57014")


@dataclass(frozen=True)
class Lease:
    """What one look at ``_rt_leader`` saw."""

    epoch: int
    holder: str
    address: str | None
    #: whether it is live: unexpired by the database's clock, or a single engine's (no expiry)
    held: bool
    #: seconds until it expires by the database's clock (negative: expired); None: no expiry
    remaining: float | None


def new_holder() -> str:
    """This process as a lease holder: host, pid and a random tag (unique across restarts)."""
    return f"{socket.gethostname()[:24]}:{os.getpid()}:{secrets.token_hex(4)}"


def application_name(holder: str) -> str:
    """The ``application_name`` of the database sessions of ``holder`` (at most 63 bytes: the server
    cuts longer ones, and a takeover finds the sessions by it)."""
    return f"{APPLICATION} {holder}"[:63]


class Leadership:
    """This engine's claim on its database: a single engine's (``lease`` None: :meth:`claim`) or a
    candidate's of a leader/standby group (:meth:`campaign`). See the module docstring."""

    def __init__(self, url: str, cluster_name: str, *, address: str | None = None,
                 lease: float | None = None) -> None:
        if lease is not None and lease <= 0:
            raise ValueError(f"the leader lease must be positive, got {lease}")
        self.cluster_name = cluster_name
        self.address = address
        #: seconds of a group leader's lease; None: a single engine (no expiry)
        self.lease = lease
        self.holder = new_holder()
        self.application_name = application_name(self.holder)
        self._url = postgresql_driver_url(url)
        self._engine: sa.Engine | None = None
        #: the epoch this engine holds (its fencing token); None until it claimed or won the row.
        #: Written once, before any write of this engine's storage, then only read
        self.epoch: int | None = None
        #: monotonic time until which this engine may serve (its lease, by its own clock)
        self._valid_until = 0.0
        #: why this engine stepped down (set once, under _lock; read without it)
        self.lost: str | None = None
        #: the lease last seen held by another engine (a standby's, a replaced leader's answers)
        self.leader: Lease | None = None
        #: the lease this engine replaced when it won the row (None: the first holder). Written once,
        #: with ``epoch``, then only read (``GET /leadership`` names it)
        self.replaced: Lease | None = None
        #: called once, in a thread of its own, when this engine steps down (``engine serve``: stop)
        self.on_lost: Callable[[], None] | None = None
        #: a leaf: the step-down and ``leader`` (docs/architecture.md, lock order)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._warned_at = 0.0
        self._table_checked = False

    # -- what the node and the API ask ------------------------------------------------------------

    @property
    def candidate(self) -> bool:
        """Whether this engine is a member of a leader/standby group (``--standby``)."""
        return self.lease is not None

    def serving(self) -> bool:
        """Whether this engine may serve now: it holds the row, has not stepped down, and (a group's
        leader) its lease has not run out by its own clock. Cheap: every request asks."""
        return self.lost is None and time.monotonic() < self._valid_until

    def not_serving_error(self) -> UnavailableError:
        """The answer to a request this engine does not serve (it did nothing with it): 105, naming
        the leader's address (``leader_url``) when another engine holds a live lease."""
        leader = self.leader
        if self.lost is not None:
            why = f"this engine stepped down ({self.lost})"
        elif self.epoch is None:
            why = "this engine is a standby"
        elif self.serving():
            why = "this engine has just taken over and loads the cluster's state"
        else:
            why = "this engine's leader lease ran out and is not renewed yet (is the database reachable?)"
        attributes: dict[str, Any] = {"not_leader": True, "cluster_name": self.cluster_name}
        if leader is not None and leader.held and leader.address and leader.holder != self.holder:
            attributes["leader_url"] = leader.address
            where = f"its leader is at {leader.address}: send requests there"
        else:
            where = "no leader is known right now: retry"
        return UnavailableError(f"Cluster {self.cluster_name}: {why}; {where}", attributes=attributes)

    def fenced(self, found: int | None) -> UnavailableError:
        """A write of this engine found epoch ``found`` (None: no row) instead of its own: another engine
        took over. Steps down; the error the write answers (it rolled back). Called under the writer
        lock: no I/O here (the new leader is looked up in the step-down's own thread)."""
        self._step_down(f"a write found epoch {found} in _rt_leader, this engine holds {self.epoch}: another "
                        "engine took over")
        return self.not_serving_error()

    # -- a single engine ---------------------------------------------------------------------------

    def claim(self) -> Lease | None:
        """Take the row with no expiry and a new epoch (a single engine, at start, before its first
        write): None. If a group's leader holds a live lease, nothing is taken: that lease (the caller
        refuses to start). Once taken, the row is looked at every few seconds: a replaced single engine
        steps down even if it does not write."""
        assert not self.candidate
        for attempt in range(1, 6):
            with self._connect() as conn:
                seen = _look(conn)
                try:
                    epoch = conn.execute(_CLAIM, {"holder": self.holder, "address": self.address}).scalar()
                except sa.exc.OperationalError as exc:
                    if seen is None or attempt == 5 or getattr(exc.orig, "sqlstate", None) not in _TIMED_OUT:
                        raise
                    # the last holder's session holds the row (a paused engine's commit): end it, again
                    self._end_sessions(conn, seen)
                    continue
                if epoch is None:
                    return _look(conn) or Lease(0, "unknown", None, True, None)
                if seen is not None:
                    # the last holder, if it still runs, may hold row locks the first writes would wait for
                    self._end_sessions(conn, seen)
            self._won(int(epoch), seen)
            return None
        raise AssertionError("unreachable")

    # -- a candidate -------------------------------------------------------------------------------

    def campaign(self) -> bool:
        """Stand by until this engine holds the lease (True) or :meth:`close` was called (False)."""
        assert self.candidate and self.lease is not None
        poll = min(self.lease / 4, 0.5)
        log.info("standing by for the leadership of the cluster", extra={
            "cluster": self.cluster_name, "holder": self.holder, "lease_seconds": self.lease})
        while not self._stop.is_set() and self.epoch is None:
            wait = poll
            try:
                with self._connect() as conn:
                    if not self._table_checked:
                        # (an older database, or a new one: the first candidate makes the table)
                        leader_table.create(conn, checkfirst=True)
                        self._table_checked = True
                    seen = _look(conn)
                    if seen is None or not seen.held:
                        if self._take_over(conn, seen):
                            return True
                    else:
                        with self._lock:
                            self.leader = seen
                        if seen.remaining is not None:
                            wait = min(poll, max(seen.remaining, 0.01))
            except sa.exc.SQLAlchemyError as exc:
                self._warn("the database does not answer the standby", exc)
            self._stop.wait(wait)
        return self.epoch is not None and not self._stop.is_set()

    def _take_over(self, conn: sa.Connection, seen: Lease | None) -> bool:
        assert self.lease is not None
        started = time.monotonic()
        try:
            epoch = conn.execute(_TAKE_OVER, {"holder": self.holder, "address": self.address, "lease": self.lease,
                                              "seen": seen.epoch if seen is not None else None}).scalar()
        except sa.exc.OperationalError as exc:
            if seen is None or getattr(exc.orig, "sqlstate", None) not in _TIMED_OUT:
                raise
            # the expired holder's session holds the row (a commit of a paused leader): end its
            # sessions (their transactions roll back) and try again
            self._end_sessions(conn, seen)
            return False
        if epoch is None:
            return False  # renewed, or taken by another standby, since the look
        self._won(int(epoch), seen, started)
        if seen is not None:
            # a paused leader may hold row locks of an unfinished transaction: end its sessions
            # before this engine's first write waits for them
            self._end_sessions(conn, seen)
        return True

    # -- both --------------------------------------------------------------------------------------

    def _won(self, epoch: int, seen: Lease | None, started: float | None = None) -> None:
        self.replaced = seen
        self.epoch = epoch
        if self.lease is None:
            self._valid_until = float("inf")
        else:
            self._valid_until = (started if started is not None else time.monotonic()) + self.lease * _OWN_SHARE
        with self._lock:
            self.leader = None
        log.info("this engine leads the cluster" if self.candidate else "this engine holds the database",
                 extra={"cluster": self.cluster_name, "epoch": epoch, "holder": self.holder,
                        "replaced": seen.holder if seen is not None else None,
                        "replaced_address": seen.address if seen is not None else None})
        self._watch = threading.Thread(target=self._renew_loop if self.candidate else self._watch_loop,
                                       name="leader-lease", daemon=True)
        self._watch.start()

    def _renew_loop(self) -> None:
        """A group leader: renew the lease every third of it; a renewal that finds another epoch steps down."""
        assert self.lease is not None
        period = self.lease / 3
        next_at = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            sent = time.monotonic()
            try:
                with self._connect() as conn:
                    renewed = conn.execute(_RENEW, {"lease": self.lease, "address": self.address,
                                                    "epoch": self.epoch, "holder": self.holder}).scalar()
                    if renewed is None:
                        seen = _look(conn)
                        self._step_down(f"its lease renewal found epoch {seen.epoch if seen else None} held by "
                                        f"{seen.holder if seen else 'nobody'}: another engine took over", seen)
                        return
            except sa.exc.SQLAlchemyError as exc:
                self._warn("renewing the leader lease failed; this engine stops serving when its lease runs out",
                           exc)
                next_at = time.monotonic() + min(period, 0.2)
                continue
            self._valid_until = sent + self.lease * _OWN_SHARE
            next_at = sent + period

    def _watch_loop(self) -> None:
        """A single engine: look at the row every few seconds; another epoch there steps down."""
        while not self._stop.wait(DEFAULT_LEASE):
            try:
                with self._connect() as conn:
                    epoch = conn.execute(_HELD).scalar()
                    if epoch != self.epoch:
                        self._step_down(f"_rt_leader holds epoch {epoch}, this engine holds {self.epoch}: another "
                                        "engine took the database over", _look(conn))
                        return
            except sa.exc.SQLAlchemyError:
                continue  # the database is away: the writer finds out what it must when it is back

    def _step_down(self, reason: str, seen: Lease | None = None) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = reason
            if seen is not None:
                self.leader = seen
        self._stop.set()
        log.error("this engine is no longer the leader of its cluster: it stops serving (every request is "
                  "answered 105 naming the new leader) and exits, for its supervisor to start it again as a standby",
                  extra={"cluster": self.cluster_name, "epoch": self.epoch, "reason": reason})
        threading.Thread(target=self._after_step_down, args=(seen is None,), name="leader-stepped-down",
                         daemon=True).start()

    def _after_step_down(self, look: bool) -> None:
        if look:  # who leads now (for the answers that name it)
            try:
                with self._connect() as conn:
                    seen = _look(conn)
                with self._lock:
                    self.leader = seen
            except sa.exc.SQLAlchemyError:
                pass
        if self.on_lost is not None:
            self.on_lost()

    def stop(self) -> None:
        """Stop standing by, renewing and watching (the lease runs out by itself; :meth:`close` ends it)."""
        self._stop.set()
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout=5)

    def close(self) -> None:
        """Stop, and expire the lease if this engine still holds it (once its storage is closed: no write
        of it follows), so that a standby takes over at once."""
        self.stop()
        if self.epoch is not None and self.lost is None:
            try:
                with self._connect() as conn:
                    conn.execute(_RELEASE, {"epoch": self.epoch, "holder": self.holder})
            except sa.exc.SQLAlchemyError as exc:
                self._warned_at = 0.0
                self._warn("could not end the lease at stop: a standby takes over when it expires", exc)
        if self._engine is not None:
            self._engine.dispose()

    # -- plumbing ----------------------------------------------------------------------------------

    @property
    def display_url(self) -> str:
        return sa.engine.make_url(self._url).render_as_string(hide_password=True)

    def _connect(self) -> sa.Connection:
        """A connection of the lease's own small pool (never the writer's: a renewal must not queue
        behind writes), in autocommit, with timeouts that keep a renewal within its lease."""
        if self._engine is None:
            bound = self.lease if self.lease is not None else DEFAULT_LEASE
            millis = max(200, int(bound * 500))
            self._engine = sa.create_engine(
                self._url, pool_size=1, max_overflow=2, pool_pre_ping=True, isolation_level="AUTOCOMMIT",
                pool_reset_on_return=None,
                connect_args={"connect_timeout": max(2, int(bound + 0.999)), "application_name": self.application_name,
                              "options": f"-c statement_timeout={2 * millis} -c lock_timeout={millis}"})
        return self._engine.connect()

    def _end_sessions(self, conn: sa.Connection, holder: Lease) -> None:
        """End the database sessions of the engine that held ``holder`` (its transactions roll back)."""
        if holder.holder == self.holder:
            return
        try:
            ended = conn.execute(_END_SESSIONS, {"application": application_name(holder.holder)}).scalar()
        except sa.exc.SQLAlchemyError as exc:  # best effort: a session left blocks until it ends itself
            self._warned_at = 0.0
            self._warn("could not end the database sessions of the engine this one replaced", exc)
            return
        if ended:
            log.warning("ended the database sessions of the engine this one replaced", extra={
                "cluster": self.cluster_name, "holder": holder.holder, "sessions": ended})

    def _warn(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10.0:
            self._warned_at = now
            orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc  # (a pool's timeout has none)
            log.warning(what, extra={"cluster": self.cluster_name, "database": self.display_url,
                                     "error": (str(orig).strip().splitlines() or [type(orig).__name__])[0]})


def _look(conn: sa.Connection) -> Lease | None:
    row = conn.execute(_LOOK).first()
    if row is None:
        return None
    return Lease(int(row.epoch), row.holder, row.address, bool(row.held),
                 None if row.remaining is None else float(row.remaining))
