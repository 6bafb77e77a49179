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

Every one of these decisions is made by the pure `sidecar.protocol.leases.LeaseRules`; this
module only carries them out against the bucket, logs them and reports changes.

    lease = Lease(kv, holder="west-1", ttl_s=6.0, key="shards.7", on_change=print)
    await lease.step()            # every ttl/3 (`ShardLeases.run` steps its leases)
    ...; lease.is_leader; lease.epoch
    await lease.release()
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from sidecar.nats.port import KeyValueBucket
from sidecar.protocol.leases import Acquire, LeaseRules, LeaseState, Lost, Renew

__all__ = ["LEASE_KEY", "Lease", "LeaseState"]

log = structlog.get_logger(__name__)

LEASE_KEY = "leader"


class Lease:
    def __init__(
        self,
        kv: KeyValueBucket,
        holder: str,
        ttl_s: float,
        *,
        key: str = LEASE_KEY,
        extra: Mapping[str, Any] | None = None,
        on_change: Callable[[LeaseState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rules = LeaseRules(ttl_s)
        self._kv = kv
        self._key = key
        self._extra = dict(extra or {})
        self._holder = holder
        self._on_change = on_change
        self._clock = clock
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
        return self._extra if self.is_leader else self._rules.observed_extra

    @property
    def known(self) -> bool:
        """True when the last round reached the bucket (leadership is known, either way)."""
        return self._known

    @property
    def is_leader(self) -> bool:
        return self._rules.leads(self._clock())

    @property
    def epoch(self) -> int:
        """The epoch while this replica leads, else 0."""
        return self.state.epoch

    @property
    def state(self) -> LeaseState:
        return self._rules.state(self._clock())

    async def step(self, *, acquire: bool = True) -> LeaseState:
        """One round: renew when leading, otherwise look at the lease and, when `acquire`,
        take it if it is free or expired (with `acquire=False` it only keeps watching, so
        that expiry is measured from the first observation either way)."""
        lost, todo = self._rules.begin(self._clock())
        if lost is not None:
            self._log_lost(lost)
        try:
            if isinstance(todo, Renew):
                await self._renew(todo)
            else:
                await self._look(acquire)
        finally:
            # Also when the bucket cannot be reached: a lease that expired meanwhile is
            # reported lost now, not once NATS is back.
            self._notify()
        self._known = True
        return self.state

    async def release(self) -> None:
        """Give the lease up (a clean stop, or a hand-over) so another replica can take it at
        once."""
        revision = self._rules.release()
        if revision is None:
            return
        try:
            await self._kv.delete(self._key, last=revision)
        except (TimeoutError, NatsError) as err:
            log.warning("lease_release_failed", key=self._key, holder=self._holder, error=repr(err))
        self._notify()

    def _value(self, epoch: int | None) -> bytes:
        return json.dumps({**self._extra, "holder": self._holder, "epoch": epoch}).encode()

    async def _renew(self, renew: Renew) -> None:
        sent = self._clock()
        try:
            revision = await self._kv.update(self._key, self._value(renew.epoch), last=renew.last)
        except KeyWrongLastSequenceError:
            self._log_lost(self._rules.refused())
            return
        self._rules.renewed(sent, revision)

    async def _look(self, acquire: bool) -> None:
        now = self._clock()
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            take = self._rules.absent(acquire)
        else:
            take = self._rules.observed(now, entry.revision or 0, entry.value, acquire)
            if take is not None:
                log.info(
                    "lease_expired",
                    key=self._key,
                    holder=self._rules.observed_holder,
                    revision=take.last,
                )
        if take is not None:
            await self._acquire(now, take)

    async def _acquire(self, sent: float, take: Acquire) -> None:
        value = self._value(None)
        try:
            if take.last is None:
                revision = await self._kv.create(self._key, value)
            else:
                revision = await self._kv.update(self._key, value, last=take.last)
        except KeyWrongLastSequenceError:
            return  # someone else was faster
        self._rules.acquired(sent, revision, self._holder)
        log.info("lease_acquired", key=self._key, holder=self._holder, epoch=revision)

    def _log_lost(self, lost: Lost) -> None:
        log.warning(
            "lease_lost", key=self._key, holder=self._holder, epoch=lost.epoch, reason=lost.reason
        )

    def _notify(self) -> None:
        state = self.state
        if state != self._last_state:
            self._last_state = state
            if self._on_change is not None:
                self._on_change(state)
