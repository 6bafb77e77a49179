"""Shard leases, members and balance against a real JetStream server (one clock, injected:
rounds are stepped by hand, nothing sleeps)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from nats.aio.client import Client

from sidecar.nats.lease import Lease, LeaseState
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort, KeyValueBucket
from sidecar.nats.regional_kv import open_regional_kv
from sidecar.nats.shards import GATE_KEY, Member, ShardLeases
from sidecar.protocol.shards import excess, shard_of, share
from tests.support.clocks import HandClock

pytestmark = pytest.mark.integration

TTL = 6.0
SHARDS = 32


class Region:
    """A bucket and the replicas stepping over it; `changes` counts every lease change."""

    def __init__(self, kv: KeyValueBucket, nc: Client, bucket: str) -> None:
        self.kv, self.nc, self.bucket = kv, nc, bucket
        self.js = nc.jetstream()
        self.clock = HandClock()
        self.replicas: dict[str, ShardLeases] = {}
        self.acquired: Counter[str] = Counter()

    def add(self, holder: str, shards: int = SHARDS, *, claims: bool = True) -> ShardLeases:
        """A replica; with its claims open (its streams rebuilt) unless `claims` is False."""

        def changed(shard: int, state: LeaseState, holder: str = holder) -> None:
            if state.leader:
                self.acquired[holder] += 1

        member = Member(self.kv, NatsPort(self.nc), self.bucket, holder, TTL, shards, self.clock)
        leases = ShardLeases(member, on_change=changed)
        if claims:
            leases.open_claims()
        self.replicas[holder] = leases
        return leases

    async def rounds(self, n: int, only: Sequence[str] | None = None) -> None:
        for _ in range(n):
            for holder, leases in self.replicas.items():
                if only is None or holder in only:
                    await leases.step()
            self.clock.now += TTL / 3

    def holders(self) -> dict[int, list[str]]:
        """Per shard, the replicas that consider themselves its leader."""
        held: dict[int, list[str]] = {i: [] for i in range(SHARDS)}
        for holder, leases in self.replicas.items():
            for shard in leases.held:
                held[shard].append(holder)
        return held


@pytest.fixture
async def region(nc: Client, port: JetStreamPort) -> Region:
    bucket = f"shards-{uuid.uuid4().hex[:8]}"
    return Region(await open_regional_kv(port, bucket, "west"), nc, bucket)


def test_shard_of_is_the_same_in_every_process() -> None:
    names = [f"tenant-{i}" for i in range(50)]
    here = [shard_of(n, SHARDS) for n in names]
    code = (
        "import json, sys; from sidecar.nats.shards import shard_of; "
        f"print(json.dumps([shard_of(n, {SHARDS}) for n in json.loads(sys.argv[1])]))"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(names)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            text=True,
        ).stdout
        assert json.loads(out) == here
    assert len(set(here)) > SHARDS // 2  # spread over the shards, not lumped


def test_excess_releases_the_lowest_ranked_beyond_the_share() -> None:
    held = list(range(10))
    released = excess(held, 7, "a")
    assert len(released) == 3 and set(released) <= set(held)
    assert excess(held, 10, "a") == [] and excess(held, 12, "a") == []
    assert share(32, 3) == 11 and share(32, 0) == 32


async def test_three_replicas_share_every_shard_once_and_stop_moving(region: Region) -> None:
    for holder in ("a", "b", "c"):
        region.add(holder)
    await region.rounds(4)
    holders = region.holders()
    assert all(len(h) == 1 for h in holders.values()), holders
    counts = Counter(h[0] for h in holders.values())
    assert set(counts) == {"a", "b", "c"} and max(counts.values()) <= share(SHARDS, 3)
    # No flapping: many more rounds and not one shard changes hands.
    before, acquired = holders, dict(region.acquired)
    await region.rounds(15)
    assert region.holders() == before
    assert dict(region.acquired) == acquired


class InFlight:
    """The most calls of a bucket method in flight at once (each held open a little, so that
    calls that can overlap, overlap)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kv: KeyValueBucket, method: str) -> None:
        self.now, self.most = 0, 0
        call = getattr(kv, method)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                await asyncio.sleep(0.01)
                return await call(*args, **kwargs)
            finally:
                self.now -= 1

        monkeypatch.setattr(kv, method, counted)


async def test_a_round_renews_and_watches_the_shards_at_once(
    region: Region, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's renewals are in flight together, and so are its looks at the shards others
    hold: in series a round takes a round trip per shard, and under load the last renewals
    came after their leases had expired."""
    a = region.add("a")
    await region.rounds(2)
    assert len(a.held) == SHARDS
    renewals = InFlight(monkeypatch, region.kv, "update")
    await region.rounds(1)
    assert len(a.held) == SHARDS
    assert renewals.most == SHARDS

    b = region.add("b")
    await region.rounds(4)
    assert len(a.held) + len(b.held) == SHARDS and len(b.held) == share(SHARDS, 2)
    looks = InFlight(monkeypatch, region.kv, "get")
    await region.rounds(1, only=["b"])
    assert looks.most >= SHARDS - len(b.held)


async def test_a_join_moves_only_the_excess_and_takes_its_share(region: Region) -> None:
    for holder in ("a", "b", "c"):
        region.add(holder)
    await region.rounds(4)
    before = {s: h[0] for s, h in region.holders().items()}
    counts = Counter(before.values())
    quota = share(SHARDS, 4)
    region.add("d")
    await region.rounds(4)
    after = region.holders()
    assert all(len(h) == 1 for h in after.values()), after
    moved = [s for s, h in after.items() if h[0] != before[s]]
    # Exactly the others' excess moved, and all of it to the newcomer.
    assert len(moved) == sum(n - quota for n in counts.values() if n > quota)
    assert {after[s][0] for s in moved} == {"d"}
    assert len(region.replicas["d"].held) == len(moved) > 0
    assert max(Counter(h[0] for h in after.values()).values()) <= quota


async def test_a_joining_replica_claims_nothing_until_rebuilt_and_no_shard_goes_unled(
    region: Region,
) -> None:
    """A replica still rebuilding its streams takes no shard, and the others do not release
    any to it (it is no member yet); once its claims are open it takes the others' excess,
    each shard free for at most one round of the others (ttl/3), not a ttl."""
    for holder in ("a", "b", "c"):
        region.add(holder)
    await region.rounds(4)
    before = {s: h[0] for s, h in region.holders().items()}
    joining = region.add("d", claims=False)
    await region.rounds(6)
    assert joining.held == []
    assert {s: h[0] for s, h in region.holders().items()} == before
    assert region.replicas["a"].members == ("a", "b", "c")

    joining.open_claims()
    unled_rounds: Counter[int] = Counter()
    for _ in range(6):
        await region.rounds(1)
        holders = region.holders()
        assert all(len(h) <= 1 for h in holders.values()), holders
        unled_rounds.update(s for s, h in holders.items() if not h)
    assert len(joining.held) == share(SHARDS, 4)
    assert all(len(h) == 1 for h in region.holders().values())
    assert max(unled_rounds.values(), default=0) <= 1, unled_rounds


async def test_a_stopped_replicas_shards_are_taken_at_the_next_round(region: Region) -> None:
    """A clean stop releases the shards and the member key: one round of the others later
    every shard is led again (not a ttl later, as after a crash)."""
    for holder in ("a", "b", "c", "d"):
        region.add(holder)
    await region.rounds(4)
    stopping = region.replicas.pop("d")
    assert stopping.held
    await stopping.release()
    assert stopping.held == []
    await region.rounds(1)
    holders = region.holders()
    assert all(len(h) == 1 for h in holders.values()), holders
    assert max(Counter(h[0] for h in holders.values()).values()) <= share(SHARDS, 3)


async def test_a_dead_replicas_shards_are_taken_over_with_higher_epochs(region: Region) -> None:
    for holder in ("a", "b", "c"):
        region.add(holder)
    await region.rounds(4)
    dead = region.replicas["c"]
    orphaned = {s: dead.lease(s).epoch for s in dead.held}
    # c stops stepping (killed): its leases and its member key are no longer renewed.
    rounds = 0
    while any(not region.holders()[s] or region.holders()[s] == ["c"] for s in orphaned):
        await region.rounds(1, only=("a", "b"))
        rounds += 1
        assert rounds <= 8, "not taken over within the TTL and a margin"
    # c's own clock ran too: it no longer considers itself leader of anything.
    assert dead.held == []
    for shard, old_epoch in orphaned.items():
        [taker] = region.holders()[shard]
        assert taker in ("a", "b")
        assert region.replicas[taker].lease(shard).epoch > old_epoch
    assert region.replicas["a"].members == ("a", "b")
    # The dead member's key is purged after a while, not kept forever.
    subjects = f"$KV.{region.bucket}.members.>"
    await region.rounds(10, only=("a", "b"))
    info = await region.js.stream_info(f"KV_{region.bucket}", subjects_filter=subjects)
    assert sorted(info.state.subjects or {}) == [
        f"$KV.{region.bucket}.members.a",
        f"$KV.{region.bucket}.members.b",
    ]


async def test_no_shard_is_taken_while_an_older_version_holds_the_single_lease(
    region: Region,
) -> None:
    # An rsub replica from before shards: the single lease `leader`, no shard count in it.
    old = Lease(region.kv, "old", TTL, key=GATE_KEY, clock=region.clock)
    await old.step()
    new = region.add("new")
    for _ in range(4):
        await old.step()
        await region.rounds(1)
    assert new.held == [] and new.gate_open is False
    # The old replica goes away (killed, or stopped: it releases): its lease expires, the
    # new replica takes the gate, and then the shards.
    await region.rounds(6)
    assert new.gate_open is True and len(new.held) == SHARDS
    # And an older replica now stays a follower: it sees the single lease held.
    late = Lease(region.kv, "late-old", TTL, key=GATE_KEY, clock=region.clock)
    for _ in range(6):
        await late.step()
        await region.rounds(1)
    assert not late.is_leader and late.state.holder == "new"


async def test_replicas_with_another_shard_count_lead_nothing(region: Region) -> None:
    first = region.add("a")
    await region.rounds(2)
    assert len(first.held) == SHARDS
    other = region.add("b", shards=SHARDS * 2)
    await region.rounds(4)
    assert other.gate_open is False and other.held == []
    assert len(first.held) == SHARDS
