"""Leadership shared by the replicas of a region: streams in shards, one lease per shard.

**Shards.** A stream belongs to shard `shard_of(name, shards)` (blake2s of its name: stable
across processes, unlike Python's salted `hash`). Shard `i` has its own `Lease`, key
`shards.<i>` of the region's bucket, with the lease's acquire/renew/expire rules; its epoch is
the epoch of every stream in the shard. One lease per shard, not per stream: the renewals
cost `shards` KV writes per `ttl/3` per region whatever the number of streams. Every
acquisition writes a revision of one bucket, higher than any earlier revision of any key, so
a stream's epochs only grow, even when it changes shard (a new shard count).

**Members.** Each replica whose claims are open (below) puts `members.<holder>` (with its
shard count) every round; a member whose key kept its revision for a whole `ttl` (on this
replica's monotonic clock, as for leases) is gone, and one with another shard count does not
share this replica's shards.
Keys of members gone for `_FORGET_TTLS` ttls are purged so the list does not grow with
restarts.

**Balance** (sticky, in rendezvous order). With `n` live members a replica's share is
`ceil(shards / n)`. A replica above its share releases the excess: the shards it ranks
lowest (`rank(shard, holder)`, a hash of both). A replica below its share takes free or
expired shards, those it ranks highest first, until it has its share. A held shard only
moves when its holder is above its share, and moving it brings that holder down to its
share and the taker at most up to its own: with one view of the members, no rule ever makes
a replica take a shard it must then give back, so two replicas cannot trade one back and
forth. A join moves only the others' excess; a leave only the leaver's shards: released on
a clean stop (the others take them at their next round, within `ttl/3`), else they expire
like any lease, within the ttl.

**Claims** (a replica that joins, a new pod of a rolling upgrade). A replica takes no shard
before `open_claims()`, which the runtime calls once its streams are rebuilt and running: a
shard it took earlier would have no working leader (no snapshots, no updates) until then.
Until it opens them it is no member either (it writes no `members.` key), so the others
leave its share in place rather than release shards it cannot take yet; it still watches
every shard, so that expiry is counted from its first look. The first replica of a region
leads nothing until it is rebuilt.

**Gate** (rolling upgrades, shard-count changes). Key `leader` is the single lease of rsub
before shards. One sharding replica holds it (a `Lease` writing `{"shards": N}` along), so
an older replica sees it held and stays a follower. A replica leads shards only while the
gate's holder writes the replica's own shard count: while an older replica (no count) or
one with another count holds the gate, it takes no shard and releases those it holds. The
gate is never released on stop; it expires and another replica takes it over.

Every decision above (the shard of a stream, who is live, the share, what to release and to
take, the gate) is made by the pure `sidecar.protocol.shards`; this module carries them out
against the bucket.

    member = Member(kv, port, "rsub-leases-west", "west-1", ttl_s=10.0, shards=32)
    leases = ShardLeases(member, on_change=print)
    task = asyncio.create_task(leases.run())
    ...; leases.open_claims()           # once its streams run: it takes its share
    leases.for_stream("orders").state     # holder, epoch, whether this replica leads it
    task.cancel(); await leases.release()
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError

from sidecar.nats.lease import LEASE_KEY, Lease, LeaseState
from sidecar.nats.port import JetStreamPort, KeyValueBucket
from sidecar.protocol.shards import (
    MemberView,
    balance,
    gate_open,
    may_take,
    member_value,
    next_round_at,
    preference,
    shard_of,
)

__all__ = ["GATE_KEY", "Member", "ShardLeases", "member_key", "shard_of"]

log = structlog.get_logger(__name__)

GATE_KEY = LEASE_KEY
SHARD_PREFIX = "shards."
MEMBER_PREFIX = "members."
_REQUEST_TIMEOUT_S = 2.0
# A KV key token: what is not allowed in one becomes `_` (a holder is host-pid-suffix).
_NOT_IN_TOKEN = re.compile(r"[^-_=a-zA-Z0-9]")


def member_key(holder: str) -> str:
    return MEMBER_PREFIX + _NOT_IN_TOKEN.sub("_", holder)


@dataclass(frozen=True)
class Member:
    """One replica of a region's sidecar as a member of the region's lease bucket: the bucket
    (`kv`, and the `port` for the requests a bucket lacks: its keys, a purge), its holder
    name, the lease TTL, the shard count and the monotonic clock the TTLs are measured on."""

    kv: KeyValueBucket
    port: JetStreamPort
    bucket: str
    holder: str
    ttl_s: float
    shards: int
    clock: Callable[[], float] = time.monotonic


class Members:
    """This replica's announcement and its view of the live members of the region."""

    def __init__(self, member: Member) -> None:
        self._kv, self._port, self._bucket = member.kv, member.port, member.bucket
        self._holder, self._shards = member.holder, member.shards
        self._clock = member.clock
        self._key = member_key(member.holder)
        self._view = MemberView(member.holder, member.ttl_s, member.shards)
        self.live: tuple[str, ...] = (member.holder,)

    async def announce(self, member: bool) -> tuple[str, ...]:
        """Renew this replica's key when it is a `member` (its claims are open), then read the
        others'; the live members (this replica among them), sorted."""
        if member:
            await self._kv.put(self._key, member_value(self._holder, self._shards))
        now = self._clock()
        entries: dict[str, tuple[int, bytes | None]] = {}
        for key in await self._keys():
            if key == self._key:
                continue
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            entries[key] = (entry.revision or 0, entry.value)
        members = self._view.observed(now, entries)
        for key in members.forget:
            log.info("member_forgotten", member=self._view.holder_of(key))
            await self._purge(key)
        self.live = members.live
        return self.live

    async def leave(self) -> None:
        """Withdraw the announcement (on a clean stop), so the others rebalance at once."""
        try:
            await self._purge(self._key)
        except (TimeoutError, NatsError) as err:
            log.warning("member_leave_failed", holder=self._holder, error=repr(err))

    async def _keys(self) -> list[str]:
        prefix = f"$KV.{self._bucket}."
        info = await self._port.stream_info(
            f"KV_{self._bucket}",
            subjects_filter=f"{prefix}{MEMBER_PREFIX}>",
            timeout_s=_REQUEST_TIMEOUT_S,
        )
        subjects = (info.get("state") or {}).get("subjects") or {}
        return [s.removeprefix(prefix) for s in subjects]

    async def _purge(self, key: str) -> None:
        """Remove every message of `key`, the delete marker too (a KV delete keeps one)."""
        await self._port.stream_purge(
            f"KV_{self._bucket}", f"$KV.{self._bucket}.{key}", timeout_s=_REQUEST_TIMEOUT_S
        )


class ShardLeases:
    """The gate, this replica's membership and one lease per shard, stepped every `ttl/3`."""

    def __init__(self, member: Member, *, on_change: Callable[[int, LeaseState], None]) -> None:
        kv, holder, ttl_s, shards = member.kv, member.holder, member.ttl_s, member.shards
        if shards <= 0:
            raise ValueError(f"lease.shards must be positive, got {shards}")
        self.holder = holder
        self.shards = shards
        self._ttl = ttl_s
        clock = member.clock
        self._gate = Lease(kv, holder, ttl_s, key=GATE_KEY, extra={"shards": shards}, clock=clock)
        self._members = Members(member)
        self._leases = [
            Lease(
                kv,
                holder,
                ttl_s,
                key=f"{SHARD_PREFIX}{i}",
                on_change=partial(on_change, i),
                clock=clock,
            )
            for i in range(shards)
        ]
        self._preference = preference(shards, holder)
        self.gate_open: bool | None = None
        self.claims_open = False

    @property
    def known(self) -> bool:
        """True once a round has read the gate (leadership is known, either way)."""
        return self._gate.known

    @property
    def members(self) -> tuple[str, ...]:
        return self._members.live

    @property
    def held(self) -> list[int]:
        return [i for i, lease in enumerate(self._leases) if lease.is_leader]

    def open_claims(self) -> None:
        """This replica's streams run: from its next round it is a member and takes its
        share (see Claims in the module docstring)."""
        if not self.claims_open:
            log.info("shard_claims_opened", holder=self.holder)
        self.claims_open = True

    def lease(self, shard: int) -> Lease:
        return self._leases[shard]

    def for_stream(self, stream: str) -> Lease:
        return self._leases[shard_of(stream, self.shards)]

    async def run(self) -> None:
        """Step forever (cancel to stop); a failed round is logged and the next one retries."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.step()
            except (TimeoutError, NatsError) as err:
                log.warning("shard_round_failed", holder=self.holder, error=repr(err))
            await asyncio.sleep(max(0.0, next_round_at(started, self._ttl) - loop.time()))

    async def step(self) -> None:
        """One round: the gate, the membership, then release the excess and renew, watch or
        take every shard (the ones this replica prefers first)."""
        self.gate_open = await self._gate_open()
        try:
            live = await self._members.announce(self.claims_open)
        except (TimeoutError, NatsError) as err:
            # Renewals must not wait for the membership: go on with the last view of it.
            log.warning("members_round_failed", holder=self.holder, error=repr(err))
            live = self._members.live
        plan = balance(self.shards, len(live), self.held, self.holder, self.gate_open)
        for shard in plan.gate_closed:
            log.warning("shard_released_gate_closed", shard=shard, gate=self._gate.state)
            await self._leases[shard].release()
        for shard in plan.over_share:
            log.info("shard_released_over_share", shard=shard, share=plan.share, members=len(live))
            await self._leases[shard].release()
        # The held shards are renewed all at once, and the others watched all at once
        # unless some are to be taken (then in order of preference): in series, a round
        # takes a round trip per shard, and under load (1,000 streams, 2 cores) the last
        # renewals came after their leases had expired.
        held = self.held
        await self._step_at_once(held)
        others = [shard for shard in self._preference if shard not in held]
        if not may_take(self.claims_open, self.gate_open, len(self.held), plan.share):
            await self._step_at_once(others)
            return
        for shard in others:
            take = may_take(self.claims_open, self.gate_open, len(self.held), plan.share)
            try:
                await self._leases[shard].step(acquire=take)
            except (TimeoutError, NatsError) as err:
                log.warning("shard_step_failed", shard=shard, error=repr(err))

    async def _step_at_once(self, shards: list[int]) -> None:
        """Step the leases of `shards` together, none of them taken (renewed if held, else
        watched); a failed one is logged, the others go on."""
        steps = [self._leases[shard].step(acquire=False) for shard in shards]
        outcomes = await asyncio.gather(*steps, return_exceptions=True)
        for shard, outcome in zip(shards, outcomes, strict=True):
            if isinstance(outcome, TimeoutError | NatsError):
                log.warning("shard_step_failed", shard=shard, error=repr(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome

    async def release(self) -> None:
        """Give every shard up and leave (clean stop): the others take them over at their
        next round. The releases are sent together: one round trip, not one per shard."""
        await asyncio.gather(*(self._leases[shard].release() for shard in self.held))
        await self._members.leave()

    async def _gate_open(self) -> bool | None:
        """Whether this replica's scheme leads (`sidecar.protocol.shards.gate_open`); None
        when the gate cannot be read this round."""
        try:
            state = await self._gate.step()
        except (TimeoutError, NatsError) as err:
            log.warning("gate_step_failed", holder=self.holder, error=repr(err))
            return None
        return gate_open(state, self._gate.extra.get("shards"), self.shards)
