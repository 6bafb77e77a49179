"""This region's handles, shared by the stream drivers, the effects and the API backend: the
port to JetStream, the connection's state, the cursor store, the shard leases and the clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sidecar.nats.connection import NatsConnection
from sidecar.nats.cursors import CursorStore
from sidecar.nats.port import JetStreamPort
from sidecar.nats.shards import ShardLeases
from sidecar.runtime.clock import Clock, wall_clock_ms

# Live tails being opened at once in the region (each a `CONSUMER.CREATE`, which the JetStream
# meta leader handles): unbounded, a start of thousands of streams sent thousands at once,
# most timed out on the servers' queue and were sent again (docs/benchmarks.md, "Start-up").
TAIL_OPENS_IN_FLIGHT = 32


@dataclass
class RegionHandles:
    """The connection and the port exist from the start (the port works once the connection
    is up); the cursor store and the shard leases only once the bring-up has opened the
    region's KV bucket (`None` before, and the leases again after `stop`). Shared by
    reference, so every reader sees the bring-up's result at once.

    The runtime reaches JetStream only through `port`, and reads the time only from `clock`
    (a simulation gives its own of both); `conn` is there for whether it is connected."""

    region: str
    conn: NatsConnection
    port: JetStreamPort
    cursor_store: CursorStore | None = None
    leases: ShardLeases | None = None
    clock: Clock = wall_clock_ms
    tail_opens: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(TAIL_OPENS_IN_FLIGHT)
    )
    """Held by a tail from its start until it is open or has failed (`StreamTails`)."""

    def cursors(self) -> CursorStore:
        """The cursor store; only used after the bring-up (drivers and writes start later)."""
        assert self.cursor_store is not None, "the KV bucket is not open yet"
        return self.cursor_store

    def leads(self, stream: str) -> bool:
        """Whether this replica leads `stream` now (its shard's lease)."""
        return self.leases is not None and self.leases.for_stream(stream).is_leader

    def lease_epoch(self, stream: str) -> int:
        """The epoch under which this replica leads `stream` now (its shard's lease), 0 when
        it does not."""
        return 0 if self.leases is None else self.leases.for_stream(stream).epoch

    def leads_with(self, stream: str, epoch: int) -> bool:
        """Whether this replica leads `stream` now, under `epoch` (its shard's lease)."""
        if self.leases is None:
            return False
        lease = self.leases.for_stream(stream)
        return lease.is_leader and lease.epoch == epoch
