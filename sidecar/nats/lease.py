"""A leadership lease among the sidecar replicas of one region (DESIGN §5).

A lease is one key in a KV bucket placed in the region (`open_regional_kv`): `shards.<i>` for
the leadership of one shard of the streams, `leader` for the gate that says which scheme
leads (`sidecar.nats.shards`). Its value names the holder (and whatever `extra` fields the
holder writes along, such as the gate's shard count). A candidate acquires it with
create-if-absent; the holder renews it every `ttl/3` with compare-and-set on the revision;
a follower that sees the revision unchanged for a whole `ttl` (measured on its own monotonic
clock, so clocks of different hosts never get compared) takes it over with compare-and-set
on that revision. The revision written when
the lease was acquired is the holder's **epoch**; later holders always get a higher one.

The holder considers itself leader only until `0.8 * ttl` after it *sent* its last
successful renewal: a follower starts counting no earlier than that send, so the old holder
stops acting before anyone else can acquire.

    lease = Lease(kv, holder="west-1", ttl_s=6.0, key="shards.7", on_change=print)
    await lease.step()            # every ttl/3 (`ShardLeases.run` steps its leases)
    ...; lease.is_leader; lease.epoch
    await lease.release()
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

log = structlog.get_logger(__name__)

LEASE_KEY = "leader"
_VALID_FRACTION = 0.8


class LeaseEntry(Protocol):
    """A lease's key as read: its revision and value."""

    @property
    def revision(self) -> int | None: ...
    @property
    def value(self) -> bytes | None: ...


class LeaseBucket(Protocol):
    """The key-value operations a lease uses (nats-py's `KeyValue` has them; the simulation's
    bucket too): a missing key raises `KeyNotFoundError`, a stale revision
    `KeyWrongLastSequenceError`."""

    async def get(self, key: str) -> LeaseEntry: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int) -> int: ...
    async def delete(self, key: str, last: int | None = None) -> object: ...


@dataclass(frozen=True)
class LeaseState:
    leader: bool
    # This replica's epoch while it leads, else 0.
    epoch: int
    # The holder last observed in the bucket (None when the lease is free or unknown).
    holder: str | None
    # The epoch of that holder (this replica's own while it leads; 0 when unknown).
    leader_epoch: int = 0


class Lease:
    def __init__(
        self,
        kv: LeaseBucket,
        holder: str,
        ttl_s: float,
        *,
        key: str = LEASE_KEY,
        extra: Mapping[str, Any] | None = None,
        on_change: Callable[[LeaseState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease.ttl_s must be positive, got {ttl_s}")
        self._kv = kv
        self._key = key
        self._extra = dict(extra or {})
        self._holder = holder
        self._ttl = ttl_s
        self._on_change = on_change
        self._clock = clock
        self._epoch = 0
        self._revision = 0
        self._valid_until = 0.0
        self._observed_holder: str | None = None
        self._observed_epoch = 0
        self._observed_extra: Mapping[str, Any] = {}
        self._observed_revision = 0
        self._observed_since = 0.0
        self._last_state = LeaseState(False, 0, None)
        self._known = False

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def key(self) -> str:
        return self._key

    @property
    def extra(self) -> Mapping[str, Any]:
        """The `extra` fields of the holder: this replica's own while it leads, else those
        last read from the bucket (empty when the lease is free, unknown or unreadable)."""
        return self._extra if self.is_leader else self._observed_extra

    @property
    def known(self) -> bool:
        """True when the last round reached the bucket (leadership is known, either way)."""
        return self._known

    @property
    def is_leader(self) -> bool:
        return self._epoch > 0 and self._clock() < self._valid_until

    @property
    def epoch(self) -> int:
        """The epoch while this replica leads, else 0."""
        return self._epoch if self.is_leader else 0

    @property
    def state(self) -> LeaseState:
        leader_epoch = self.epoch if self.is_leader else self._observed_epoch
        return LeaseState(self.is_leader, self.epoch, self._observed_holder, leader_epoch)

    async def step(self, *, acquire: bool = True) -> LeaseState:
        """One round: renew when leading, otherwise look at the lease and, when `acquire`,
        take it if it is free or expired (with `acquire=False` it only keeps watching, so
        that expiry is measured from the first observation either way)."""
        if self._epoch > 0 and not self.is_leader:
            self._lose("expired")
        try:
            if self._epoch > 0:
                await self._renew()
            else:
                await self._observe_or_acquire(acquire)
        finally:
            # Also when the bucket cannot be reached: a lease that expired meanwhile is
            # reported lost now, not once NATS is back.
            self._notify()
        self._known = True
        return self.state

    async def release(self) -> None:
        """Give the lease up (a clean stop, or a hand-over) so another replica can take it at
        once."""
        if self._epoch == 0:
            return
        revision, self._epoch = self._revision, 0
        try:
            await self._kv.delete(self._key, last=revision)
        except (TimeoutError, NatsError) as err:
            log.warning("lease_release_failed", key=self._key, holder=self._holder, error=repr(err))
        self._observed_holder, self._observed_epoch, self._observed_extra = None, 0, {}
        self._notify()

    def _value(self, epoch: int | None) -> bytes:
        return json.dumps({**self._extra, "holder": self._holder, "epoch": epoch}).encode()

    async def _renew(self) -> None:
        sent = self._clock()
        try:
            self._revision = await self._kv.update(
                self._key, self._value(self._epoch), last=self._revision
            )
        except KeyWrongLastSequenceError:
            self._lose("taken_over")
            return
        self._valid_until = sent + _VALID_FRACTION * self._ttl

    async def _observe_or_acquire(self, acquire: bool) -> None:
        now = self._clock()
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            self._observed_holder, self._observed_epoch, self._observed_extra = None, 0, {}
            if acquire:
                await self._acquire(now, last=None)
            return
        revision = entry.revision or 0
        self._observed_holder, epoch, self._observed_extra = _holder_of(entry.value)
        # A holder writes its epoch with each renewal; before the first, it is the revision
        # at which it took the lease, which is this entry's.
        self._observed_epoch = epoch or revision
        if revision != self._observed_revision:
            self._observed_revision, self._observed_since = revision, now
        elif acquire and now - self._observed_since >= self._ttl:
            log.info(
                "lease_expired", key=self._key, holder=self._observed_holder, revision=revision
            )
            await self._acquire(now, last=revision)

    async def _acquire(self, sent: float, last: int | None) -> None:
        value = self._value(None)
        try:
            if last is None:
                revision = await self._kv.create(self._key, value)
            else:
                revision = await self._kv.update(self._key, value, last=last)
        except KeyWrongLastSequenceError:
            return  # someone else was faster
        self._epoch = self._revision = revision
        self._valid_until = sent + _VALID_FRACTION * self._ttl
        self._observed_holder = self._holder
        log.info("lease_acquired", key=self._key, holder=self._holder, epoch=revision)

    def _lose(self, reason: str) -> None:
        log.warning(
            "lease_lost", key=self._key, holder=self._holder, epoch=self._epoch, reason=reason
        )
        self._epoch = 0
        self._observed_holder = None
        self._observed_epoch = 0
        self._observed_extra = {}
        self._observed_revision = 0

    def _notify(self) -> None:
        state = self.state
        if state != self._last_state:
            self._last_state = state
            if self._on_change is not None:
                self._on_change(state)


def _holder_of(value: bytes | None) -> tuple[str | None, int, Mapping[str, Any]]:
    """(holder, epoch, the other fields) of a lease value; None, 0 and {} for what cannot
    be read."""
    try:
        data = json.loads(value or b"null")
        holder, epoch = data.pop("holder"), data.pop("epoch", None)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None, 0, {}
    valid_epoch = isinstance(epoch, int) and not isinstance(epoch, bool) and epoch > 0
    return (holder if isinstance(holder, str) else None), (epoch if valid_epoch else 0), data
