"""A TableCluster's ``status.leadership``: which engine of an HA table cluster serves, which stand by,
and where its database's primary is.

An HA table cluster is several engines over one PostgreSQL database (docs/ha.md): one holds the
lease in the database and serves, the others stand by. The TableCluster names them (``spec.members``:
each engine's advertised address), and on every pass each one is asked, side by side:

* ``/readyz`` (no token): 200 from the engine that serves; 503 ``{"status": "standby", "leader":
  ...}`` from a standby; 503 with another status from one that serves nothing (its lease ran out by
  its own clock, or another engine replaced it); nothing from one that is down or paused.
* ``/leadership`` of the one that serves (the cluster's token, never logged): its lease's epoch, its
  advertised address and the PostgreSQL server its sessions reached (``host:port``; the engine never
  says the URL's user or password).
* the CloudNativePG Cluster's ``status.currentPrimary`` when ``spec.databaseCluster`` names one,
  through the front end's :class:`~.world.DatabaseClusters` (the kopf front end reads it with the
  Kubernetes client; ``reptables up`` has none, and shows the server the leader reached).

The status says only what was read now: while no member serves (a takeover under way, every
member down) ``leader`` and ``epoch`` are absent - never the last ones seen - and a member that
neither leads nor stands by is in ``unreachable`` with the time since when it has been so (kept
across passes, like ``status.unreachable`` of a TableReplica). ``observedAt`` is refreshed at least
once a minute, and at once with any change, so that an unchanged status is not rewritten on every
pass. A new leader is an event ``LeaderChanged`` naming the one it replaced (the status's last leader,
else the lease the new leader says it took over: a pass in the takeover's gap saw none); none
serving, a Warning ``NoLeader``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from ..models.common import now_text, parse_time
from .world import DatabaseClusterError, Event, Resource, World, probe_tls

#: seconds a member may take to answer ``/readyz`` (a paused engine takes all of it)
MEMBER_TIMEOUT = 1.0
#: seconds the leader may take to answer ``/leadership`` (it reads the database server's address)
LEADER_TIMEOUT = 3.0
#: ``observedAt`` of an unchanged status is rewritten after this many seconds
OBSERVED_REFRESH = 60.0


@dataclass(frozen=True)
class MemberAnswer:
    """What one member's ``/readyz`` said."""

    member: str
    #: leader (200), standby, unavailable (503 otherwise) or unreachable (no answer)
    role: str
    message: str
    #: the leader a standby names (the lease it last saw)
    named_leader: str | None = None


def ask_member(member: str, timeout: float = MEMBER_TIMEOUT) -> MemberAnswer:
    """One member's ``/readyz``."""
    try:
        response = httpx.get(f"{member.rstrip('/')}/readyz", timeout=timeout, verify=probe_tls())
    except httpx.HTTPError as exc:
        return MemberAnswer(member, "unreachable", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    if response.status_code == 200:
        return MemberAnswer(member, "leader", "serves")
    if body.get("status") == "standby":
        named = body.get("leader")
        return MemberAnswer(member, "standby", "stands by", named if isinstance(named, str) else None)
    reason = body.get("reason") or body.get("status") or response.reason_phrase
    return MemberAnswer(member, "unavailable", f"/readyz answered {response.status_code}: {reason}")


def ask_leader(member: str, token: str, timeout: float = LEADER_TIMEOUT) -> dict[str, Any] | None:
    """The serving member's ``/leadership`` (epoch, address, database server); None if it did not say."""
    try:
        response = httpx.get(f"{member.rstrip('/')}/leadership", headers={"Authorization": f"OAuth {token}"},
                             timeout=timeout, verify=probe_tls())
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def observe(res: Resource, world: World, token: str) -> tuple[dict[str, Any], list[Event]]:
    """``status.leadership`` of an HA TableCluster (``spec.members``) and the events of a change."""
    members: list[str] = list(res.spec.members or [])
    written = res.status.get("leadership")
    previous: dict[str, Any] = written if isinstance(written, dict) else {}
    with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="leadership") as pool:
        answers = list(pool.map(ask_member, members))
    serving = [a for a in answers if a.role == "leader"]
    leader: str | None = None
    epoch: int | None = None
    server: str | None = None
    replaced: dict[str, Any] | None = None
    if serving:
        said = ask_leader(serving[0].member, token)
        leader = serving[0].member
        if said is not None:
            leader = said.get("address") or leader
            epoch = said.get("epoch") if isinstance(said.get("epoch"), int) else None
            replaced = said.get("replaced") if isinstance(said.get("replaced"), dict) else None
            database = said.get("database")
            if isinstance(database, dict) and isinstance(database.get("server"), str):
                server = database["server"]
    out: dict[str, Any] = {"standbys": [a.member for a in answers if a.role == "standby"]}
    if leader is not None:
        out["leader"] = leader
    if epoch is not None:
        out["epoch"] = epoch
    primary, problem = _database_primary(res, world)
    if primary is not None or server is not None:
        out["databasePrimary"] = primary if primary is not None else server
    if problem is not None:
        out["databaseClusterError"] = problem
    before = {str(u.get("member")): u for u in previous.get("unreachable") or [] if isinstance(u, dict)}
    out["unreachable"] = [{"member": a.member,
                           "since": before.get(a.member, {}).get("since") or now_text(),
                           "message": a.message}
                          for a in answers if a.role in ("unreachable", "unavailable")]
    for key in _OPTIONAL:
        if key not in out and key in previous:
            out[key] = None  # a merge patch with null removes what is no longer known
    out["observedAt"] = _observed_at(previous, out)
    return out, _events(previous, out, answers, replaced)


#: the keys of ``status.leadership`` that are absent when not known
_OPTIONAL = ("leader", "epoch", "databasePrimary", "databaseClusterError")


def _known(leadership: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in leadership.items() if v is not None and k != "observedAt"}


def _database_primary(res: Resource, world: World) -> tuple[str | None, str | None]:
    """(the CloudNativePG Cluster's currentPrimary, why it could not be read); (None, None) without one."""
    ref = res.spec.database_cluster
    if ref is None:
        return None, None
    where = f"CloudNativePG Cluster {ref.namespace + '/' if ref.namespace else ''}{ref.name}"
    if world.database_clusters is None:
        return None, f"{where}: this front end cannot read it (reptables up has no Kubernetes API)"
    try:
        primary = world.database_clusters.current_primary(ref.namespace, ref.name)
    except DatabaseClusterError as exc:
        return None, str(exc)
    if primary is None:
        return None, f"{where} has no status.currentPrimary yet"
    return primary, None


def _observed_at(previous: dict[str, Any], now: dict[str, Any]) -> str:
    """The previous ``observedAt`` while nothing else changed and it is recent (no rewrite on every pass)."""
    same = _known(previous) == _known(now)
    seen = parse_time(previous.get("observedAt"))
    if same and seen is not None and (datetime.now(UTC) - seen).total_seconds() < OBSERVED_REFRESH:
        return str(previous["observedAt"])
    return now_text()


def _events(previous: dict[str, Any], now: dict[str, Any], answers: list[MemberAnswer],
            replaced: dict[str, Any] | None = None) -> list[Event]:
    leader, epoch = now.get("leader"), now.get("epoch")
    if leader is not None:
        if (leader, epoch) != (previous.get("leader"), previous.get("epoch")):
            # the one replaced: the leader the last status named, else (the status saw no leader
            # in between, or none yet) the lease the new leader says it took over
            before, before_epoch = previous.get("leader"), _epoch(previous)
            if not before and replaced is not None and isinstance(replaced.get("address"), str):
                before, before_epoch = replaced["address"], _epoch(replaced)
            was = f"; before: {before} (epoch {before_epoch})" if before else ""
            return [Event("Normal", "LeaderChanged", f"the engine at {leader} leads (epoch {_epoch(now)}){was}; "
                          f"standing by: {', '.join(now['standbys']) or 'none'}")]
        return []
    if previous.get("leader") is not None or not previous:
        named = sorted({a.named_leader for a in answers if a.named_leader})
        hint = f"; the standbys last saw {', '.join(named)} hold the lease" if named else ""
        return [Event("Warning", "NoLeader", f"no member serves: {len(now['standbys'])} standing by, "
                      f"{len(now['unreachable'])} not answering or not serving{hint}")]
    return []


def leadership_text(leadership: dict[str, Any]) -> str:
    """One line for a condition's message: who leads, how many stand by."""
    if leadership.get("leader") is None:
        return "no member serves"
    return f"{leadership['leader']} leads (epoch {_epoch(leadership)}), {len(leadership['standbys'])} standing by"


def _epoch(leadership: dict[str, Any]) -> str:
    epoch = leadership.get("epoch")
    return "?" if epoch is None else str(epoch)
