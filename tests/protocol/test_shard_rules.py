"""The pure decisions of the shard leases (`sidecar.protocol.shards`): membership, the gate,
the share, what a replica releases and takes, with time given as numbers.

`Region` is a model of one region's bucket on these rules alone (a shard is held or free; a
round of a replica releases what `balance` says and takes free shards in `preference` order
while `may_take`): joins, leaves and uneven splits converge, and no shard moves twice."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sidecar.protocol.leases import LeaseState
from sidecar.protocol.shards import (
    FORGET_TTLS,
    Balance,
    MemberView,
    balance,
    excess,
    gate_open,
    may_take,
    member_in,
    member_value,
    next_round_at,
    preference,
    rank,
    shard_of,
    share,
)

TTL = 6.0


def test_shard_of_spreads_streams_over_every_shard() -> None:
    counts = Counter(shard_of(f"tenant-{i}", 8) for i in range(800))
    assert set(counts) == set(range(8)) and min(counts.values()) > 50
    assert shard_of("orders", 8) == shard_of("orders", 8)


def test_the_share_rounds_up_an_uneven_split() -> None:
    assert share(10, 3) == 4
    assert share(9, 3) == 3
    assert share(2, 5) == 1
    assert share(4, 0) == 4  # no view of the members yet: at most all


def test_preference_orders_every_shard_by_rank() -> None:
    order = preference(16, "west-1")
    assert sorted(order) == list(range(16))
    assert [rank(s, "west-1") for s in order] == sorted(
        (rank(s, "west-1") for s in range(16)), reverse=True
    )
    assert order != preference(16, "west-2")


def test_the_excess_is_what_the_holder_ranks_lowest() -> None:
    held = list(range(10))
    dropped = excess(held, 4, "a")
    assert len(dropped) == 6
    kept = set(held) - set(dropped)
    assert min(rank(s, "a") for s in kept) > max(rank(s, "a") for s in dropped)
    assert excess(held, 10, "a") == [] and excess([], 3, "a") == []


def test_balance_releases_the_excess_or_everything_when_the_gate_is_closed() -> None:
    held = [0, 1, 2, 3, 4]
    assert balance(8, 2, held, "a", True) == Balance(4, over_share=tuple(excess(held, 4, "a")))
    # Unknown gate: still release the excess (renewals go on), take nothing.
    assert balance(8, 2, held, "a", None).over_share == tuple(excess(held, 4, "a"))
    assert balance(8, 2, held, "a", False) == Balance(4, gate_closed=tuple(held))
    assert balance(8, 1, held, "a", True) == Balance(8)


def test_a_replica_takes_only_below_its_share_with_the_gate_and_its_claims_open() -> None:
    assert may_take(True, True, 3, 4)
    assert not may_take(True, True, 4, 4)
    assert not may_take(True, None, 0, 4)
    assert not may_take(True, False, 0, 4)
    # Its streams not rebuilt yet: nothing, whatever its share and the gate.
    assert not may_take(False, True, 0, 4)


def test_the_gate() -> None:
    mine = LeaseState(True, 3, "a", 3)
    theirs = LeaseState(False, 0, "b", 3)
    assert gate_open(mine, 8, 8) is True
    assert gate_open(LeaseState(False, 0, None), None, 8) is None  # free or unread
    assert gate_open(theirs, 8, 8) is True
    assert gate_open(theirs, 4, 8) is False  # another shard count
    assert gate_open(theirs, None, 8) is False  # an older replica (no count)


def test_rounds_start_every_third_of_a_ttl_from_the_last_start() -> None:
    assert next_round_at(10.0, 6.0) == 12.0


def entries(**members: tuple[int, str, int | None]) -> dict[str, tuple[int, bytes | None]]:
    return {
        f"members.{name}": (revision, json.dumps({"holder": holder, "shards": shards}).encode())
        for name, (revision, holder, shards) in members.items()
    }


def test_a_member_is_live_while_its_revision_moves() -> None:
    view = MemberView("a", TTL, 8)
    assert view.observed(0.0, entries(b=(1, "b", 8))).live == ("a", "b")
    assert view.observed(TTL - 0.1, entries(b=(1, "b", 8))).live == ("a", "b")
    assert view.observed(TTL, entries(b=(1, "b", 8))).live == ("a",)  # gone quiet
    assert view.observed(TTL + 1, entries(b=(2, "b", 8))).live == ("a", "b")  # back


def test_a_member_with_another_shard_count_does_not_share() -> None:
    view = MemberView("a", TTL, 8)
    assert view.observed(0.0, entries(b=(1, "b", 4), c=(1, "c", None))).live == ("a",)


def test_a_member_gone_for_long_is_forgotten_and_its_key_dropped_from_the_view() -> None:
    view = MemberView("a", TTL, 8)
    view.observed(0.0, entries(b=(1, "b", 8)))
    assert view.observed(FORGET_TTLS * TTL - 0.1, entries(b=(1, "b", 8))).forget == ()
    gone = view.observed(FORGET_TTLS * TTL, entries(b=(1, "b", 8)))
    assert gone.forget == ("members.b",) and gone.live == ("a",)
    assert view.holder_of("members.b") == "b"
    # Purged: no longer listed, no longer seen; listed again, it counts afresh.
    view.observed(FORGET_TTLS * TTL + 1, {})
    assert view.holder_of("members.b") == "members.b"
    again = view.observed(FORGET_TTLS * TTL + 2, entries(b=(1, "b", 8)))
    assert again.live == ("a", "b")


def test_an_unreadable_member_is_named_by_its_key_and_not_live() -> None:
    view = MemberView("a", TTL, 8)
    assert view.observed(0.0, {"members.x": (1, b"junk")}).live == ("a",)
    assert view.holder_of("members.x") == "members.x"
    assert member_in(member_value("b", 8)) == ("b", 8)
    assert member_in(b'{"holder": "b", "shards": true}') == ("b", None)
    assert member_in(b"[]") == (None, None)


class Region:
    """Shards held or free, and the replicas' rounds on the pure rules (every replica sees
    every other: one view of the members)."""

    def __init__(self, shards: int, replicas: list[str]) -> None:
        self.shards = shards
        self.replicas = list(replicas)
        self.holder: dict[int, str] = {}
        self.moves: Counter[int] = Counter()

    def held(self, replica: str) -> list[int]:
        return sorted(s for s, h in self.holder.items() if h == replica)

    def round(self, replica: str) -> None:
        plan = balance(self.shards, len(self.replicas), self.held(replica), replica, True)
        for shard in plan.gate_closed + plan.over_share:
            del self.holder[shard]
        for shard in preference(self.shards, replica):
            if not may_take(True, True, len(self.held(replica)), plan.share):
                break
            if shard not in self.holder:
                self.holder[shard] = replica
                self.moves[shard] += 1

    def settle(self, rounds: int = 10) -> None:
        for _ in range(rounds):
            for replica in self.replicas:
                self.round(replica)

    def check_balanced(self) -> None:
        assert sorted(self.holder) == list(range(self.shards))
        mine = share(self.shards, len(self.replicas))
        assert all(len(self.held(r)) <= mine for r in self.replicas)


@pytest.mark.parametrize(("shards", "replicas"), [(8, 2), (10, 3), (7, 4), (3, 5), (32, 3)])
def test_rounds_converge_on_an_even_or_uneven_split(shards: int, replicas: int) -> None:
    region = Region(shards, [f"r{i}" for i in range(replicas)])
    region.settle()
    region.check_balanced()
    assert max(region.moves.values()) == 1  # every shard taken once, none traded back


def test_a_join_moves_only_the_others_excess() -> None:
    region = Region(12, ["a", "b"])
    region.settle()
    before = dict(region.holder)
    region.replicas.append("c")
    region.moves.clear()
    region.settle()
    region.check_balanced()
    moved = {s for s in before if region.holder[s] != before[s]}
    assert moved == set(region.held("c")) and len(moved) == 4
    assert max(region.moves.values()) == 1


def test_a_leave_moves_only_the_leavers_shards() -> None:
    region = Region(12, ["a", "b", "c"])
    region.settle()
    before = dict(region.holder)
    region.replicas.remove("b")
    for shard in region.held("b"):  # its leases expire
        del region.holder[shard]
    region.moves.clear()
    region.settle()
    region.check_balanced()
    assert {s for s in before if region.holder[s] != before[s]} == {
        s for s, h in before.items() if h == "b"
    }
    assert max(region.moves.values()) == 1


def test_the_order_of_the_rounds_leaves_the_split_balanced() -> None:
    """Ties in timing do not decide: the same members reach a balanced split either way,
    and each replica holds its share or one less."""
    first, second = Region(10, ["a", "b", "c"]), Region(10, ["c", "b", "a"])
    first.settle()
    second.settle()
    for region in (first, second):
        region.check_balanced()
        assert sorted(len(region.held(r)) for r in region.replicas) in ([2, 4, 4], [3, 3, 4])
