"""The XDCR conflict rules of ``tablets/xdcr.py``, as a cluster applies them: every order of delivery
ends with the same row on every member.

An XDCR member applies a peer's change when it stands above the row here in the order the rules
define (``resolve``), and stores the version a local change gets (``local_version``). Both are
the engine's own functions; what this module adds is the rest of a member as the engine runs it -
the row's version per key, the changes shipped to every peer in the order their origin made them,
each delivered whenever the run chooses - so that many histories can be replayed in a second.
The engines themselves are exercised by ``test_xdcr.py`` (three clusters writing the same keys).

The histories that made the seed's rules diverge are here as examples (one from a CI run of
2026-11-28, with three clusters, and one with two), beside random ones: one key, 2 to 5 members,
inserts, updates and deletes, deliveries interleaved with the writes at random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from reptables.engine.tablets.xdcr import RowVersion, Version, local_version, resolve

#: what travels: (kind, the change's version with its delete horizon, the version it was made on)
Action = tuple[str, RowVersion, RowVersion | None]


@dataclass
class Member:
    """One member's row of the key (None: never a row here) and its version clock."""

    cluster_id: int
    skew: int = 0
    row: RowVersion | None = None
    clock: int = 0
    applied: list[bool] = field(default_factory=list)

    def write(self, kind: str, now: int) -> Action | None:
        """A local insert or update (which one the row here decides) or delete; None: a delete of a
        row that is not here, which changes nothing."""
        current = self.row
        missing = current is None or current.deleted
        if kind == "delete" and missing:
            return None
        if kind != "delete":
            kind = "insert" if missing else "update"
        # the version clock: past every version seen and the row's own (VersionClock.next)
        self.clock = max(self.clock + 1, now + self.skew, (current.version[0] + 1) if current else 0)
        self.row = local_version((self.clock, self.cluster_id), kind == "delete", current)
        assert current is None or self.row.rank > current.rank
        return kind, self.row, current

    def receive(self, action: Action) -> None:
        kind, incoming, expected = action
        self.clock = max(self.clock, incoming.version[0])
        resolution = resolve(kind, incoming, expected, self.row)
        if resolution.accept:
            self.row = incoming
        self.applied.append(resolution.accept)


class Group:
    def __init__(self, members: int, skews: list[int] | None = None) -> None:
        self.members = [Member(i + 1, (skews or [0] * members)[i]) for i in range(members)]
        self.queues: dict[tuple[int, int], list[Action]] = {
            (a, b): [] for a in range(members) for b in range(members) if a != b}

    def write(self, member: int, kind: str, now: int) -> None:
        action = self.members[member].write(kind, now)
        if action is not None:
            for other in range(len(self.members)):
                if other != member:
                    self.queues[(member, other)].append(action)

    def deliver(self, origin: int, to: int, count: int = 1) -> None:
        for _ in range(count):
            self.members[to].receive(self.queues[(origin, to)].pop(0))

    def deliver_all(self) -> None:
        for (origin, to), queue in self.queues.items():
            while queue:
                self.deliver(origin, to)

    def rows(self) -> list[tuple[Version, bool] | None]:
        return [None if m.row is None else (m.row.version, m.row.deleted) for m in self.members]


def test_an_update_and_a_delete_made_at_once_end_deleted_on_both_members() -> None:
    """The seed's example: a user's row updated on A (a later clock) and deleted on B at once. The
    delete wins on both, whichever arrives first."""
    for a_first in (True, False):
        group = Group(2)
        group.write(0, "insert", 1)
        group.deliver_all()
        group.write(1, "delete", 10)
        group.write(0, "update", 12)  # A's clock is later
        if a_first:
            group.deliver(0, 1)
            group.deliver(1, 0)
        else:
            group.deliver(1, 0)
            group.deliver(0, 1)
        assert group.rows() == [((10, 2), True), ((10, 2), True)]


def test_two_updates_made_at_once_end_with_the_later_one() -> None:
    group = Group(2)
    group.write(0, "insert", 1)
    group.deliver_all()
    group.write(0, "update", 15)
    group.write(1, "update", 13)
    group.deliver_all()
    assert group.rows() == [((15, 1), False), ((15, 1), False)]


def test_a_row_inserted_again_after_a_delete_beats_the_delete_and_what_did_not_see_it() -> None:
    """Two members, a delete and a re-insert on B racing two updates on A, which saw neither: the
    seed's rules ended with B's re-insert on A and A's second update on B."""
    group = Group(2)
    group.write(0, "insert", 1)
    group.deliver_all()
    group.write(0, "update", 6)
    group.write(1, "delete", 7)
    group.write(1, "insert", 8)
    group.write(0, "update", 9)
    group.deliver(1, 0, 2)  # A: its row deleted (A's updates did not see the delete), then inserted again
    group.deliver(0, 1, 2)  # B: A's updates met the row inserted after the delete
    assert group.rows() == [((8, 2), False), ((8, 2), False)]


def test_three_members_the_divergence_of_the_ci_run_converges() -> None:
    """Key 10 of test_three_clusters_writing_the_same_keys_converge on 2026-11-28: c deleted it; a
    wrote it without having seen the delete (a later clock); b wrote it after the delete. The
    seed's rules left b's row on a and c, and a's on b."""
    group = Group(3)
    group.write(0, "insert", 1)
    group.deliver_all()
    group.write(2, "delete", 10)  # c
    group.deliver(2, 1)  # b has the delete
    group.write(1, "insert", 20)  # b: made after the delete
    group.write(0, "update", 30)  # a: made before it arrived, with a later clock
    group.deliver(0, 1)  # b: a's update meets b's row
    group.deliver(2, 0)  # a: the delete meets a's update
    group.deliver(1, 0)  # a: b's row meets the tombstone
    group.deliver(1, 2)
    group.deliver(0, 2)
    group.deliver_all()
    assert group.rows() == [((20, 2), False)] * 3


@pytest.mark.parametrize("members", [2, 3, 4, 5])
def test_every_random_history_of_one_key_converges(members: int) -> None:
    """Random histories (writes interleaved with deliveries in any order a peer's changes keep, and
    members' clocks a few ticks apart): at the end every member has the same row."""
    rng = random.Random(members)
    for _ in range(1500):
        group = Group(members, [rng.randint(-5, 5) for _ in range(members)])
        group.write(0, "insert", 10)
        group.deliver_all()
        writes, now = 0, 10
        while writes < 3 * members or any(group.queues.values()):
            now += 1
            pending = [k for k, q in group.queues.items() if q]
            if writes < 3 * members and (not pending or rng.random() < 0.5):
                group.write(rng.randrange(members), rng.choice(["insert", "update", "update", "delete"]), now)
                writes += 1
            else:
                group.deliver(*rng.choice(pending))
        rows = group.rows()
        assert len(set(rows)) == 1, rows
