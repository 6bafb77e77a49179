"""The decisions of the shard leases (DESIGN §5), pure: no I/O, no clock, no asyncio.

`sidecar.nats.shards` carries them out (its docstring gives the scheme); here is what it
decides from what it read, every time passed in (seconds on the replica's monotonic clock):

- `shard_of`: the shard of a stream (blake2s of its name: the same in every process);
- `MemberView`: from the member keys read in a round, which members are live (revision
  changed within a ttl, same shard count), and which keys to forget (unchanged for
  `FORGET_TTLS` ttls);
- `gate_open`: from the gate lease's state, whether this replica's scheme leads;
- `balance`: from the live members, the gate and the shards held, this replica's share and
  the shards it releases; `may_take`: whether it takes one more (never before its claims
  are open: its streams rebuilt); `preference`: in which order it looks at the shards
  (rendezvous rank, highest first);
- `next_round_at`: when the next round starts (every ttl/3 from the start of the last,
  however long that one took).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sidecar.protocol.leases import LeaseState

# Keys of members gone for this many ttls are purged.
FORGET_TTLS = 3
# Rounds (renewals) per ttl.
ROUNDS_PER_TTL = 3


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2s(text.encode(), digest_size=8).digest(), "big")


def shard_of(stream: str, shards: int) -> int:
    """The shard of `stream` among `shards`: the same in every process and version."""
    return _hash64(stream) % shards


def rank(shard: int, holder: str) -> int:
    """How much `holder` wants `shard` (rendezvous hashing: highest first)."""
    return _hash64(f"{shard}/{holder}")


def preference(shards: int, holder: str) -> list[int]:
    """Every shard, the ones `holder` wants most first."""
    return sorted(range(shards), key=lambda s: rank(s, holder), reverse=True)


def share(shards: int, members: int) -> int:
    """The most shards one of `members` live replicas should lead."""
    return math.ceil(shards / max(1, members))


def excess(held: Collection[int], share: int, holder: str) -> list[int]:
    """The shards `holder` releases when it holds `held`: beyond `share`, lowest rank first."""
    ordered = sorted(held, key=lambda s: rank(s, holder))
    return ordered[: max(0, len(held) - share)]


def next_round_at(started: float, ttl_s: float) -> float:
    """When the round after one that started at `started` starts (a slow round must not
    push the next renewal past the lease's validity)."""
    return started + ttl_s / ROUNDS_PER_TTL


def gate_open(gate: LeaseState, gate_shards: object, shards: int) -> bool | None:
    """Whether this replica's scheme leads, from the gate's state and the shard count its
    holder writes (`gate_shards`): True (this replica holds it, or its holder shards as
    this replica does), False (an older replica, or another shard count), None (unknown:
    keep renewing, take nothing)."""
    if gate.leader:
        return True
    if gate.holder is None:
        return None
    return gate_shards == shards


@dataclass(frozen=True)
class Balance:
    """What a round releases before it renews and takes: `gate_closed` (every held shard,
    another scheme leads) or `over_share` (the excess), and this replica's `share`."""

    share: int
    gate_closed: tuple[int, ...] = ()
    over_share: tuple[int, ...] = ()


def balance(
    shards: int, members: int, held: Collection[int], holder: str, gate: bool | None
) -> Balance:
    """The round's releases with `members` live members (this replica among them) while
    this replica holds `held`; the gate (`gate_open`) closed releases them all."""
    mine = share(shards, members)
    if gate is False:
        return Balance(mine, gate_closed=tuple(held))
    return Balance(mine, over_share=tuple(excess(held, mine, holder)))


def may_take(claims: bool, gate: bool | None, held: int, share: int) -> bool:
    """Whether a replica holding `held` shards takes one more: only once its `claims` are
    open (its streams rebuilt: a shard taken before would have no working leader until
    they run), while the gate is open for it and it is below its share."""
    return claims and gate is True and held < share


@dataclass(frozen=True)
class _Seen:
    holder: str
    shards: int | None
    revision: int
    since: float


@dataclass(frozen=True)
class Members:
    """A round's view of the members: the live ones (sorted, this replica among them) and
    the keys to forget (gone for `FORGET_TTLS` ttls)."""

    live: tuple[str, ...]
    forget: tuple[str, ...] = ()


class MemberView:
    """What this replica has seen of the other members' keys."""

    def __init__(self, holder: str, ttl_s: float, shards: int) -> None:
        self._holder, self._ttl, self._shards = holder, ttl_s, shards
        # Per other member's key: who, its shard count, its revision, since when it has it.
        self._seen: dict[str, _Seen] = {}

    def observed(self, now: float, entries: Mapping[str, tuple[int, bytes | None]]) -> Members:
        """The other members' keys as read at `now` (key -> revision, value; a key not
        there is gone). A member is live while its revision changed within a ttl and it
        has this replica's shard count; a key unchanged for `FORGET_TTLS` ttls is forgotten."""
        for key in set(self._seen) - set(entries):
            del self._seen[key]
        live, forget = [self._holder], []
        for key, (revision, value) in entries.items():
            seen = self._seen.get(key)
            if seen is None or seen.revision != revision:
                holder, shards = member_in(value)
                seen = self._seen[key] = _Seen(holder or key, shards, revision, now)
            if now - seen.since < self._ttl:
                if seen.shards == self._shards:
                    live.append(seen.holder)
            elif now - seen.since >= FORGET_TTLS * self._ttl:
                forget.append(key)
        return Members(tuple(sorted(live)), tuple(forget))

    def holder_of(self, key: str) -> str:
        """The holder last read under `key` (the key when never read)."""
        seen = self._seen.get(key)
        return seen.holder if seen is not None else key


def member_value(holder: str, shards: int) -> bytes:
    """What a member writes under its key."""
    return json.dumps({"holder": holder, "shards": shards}).encode()


def member_in(value: bytes | None) -> tuple[str | None, int | None]:
    """(holder, shard count) of a member's value; None for what cannot be read."""
    try:
        data = json.loads(value or b"null")
        holder, shards = data["holder"], data.get("shards")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, None
    valid = isinstance(shards, int) and not isinstance(shards, bool)
    return (holder if isinstance(holder, str) else None), (shards if valid else None)
