"""This region's NATS handles, shared by the stream drivers, the effects and the API backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.nats.connection import NatsConnection
from sidecar.nats.cursors import CursorStore
from sidecar.nats.marker_log import MarkerPublisher
from sidecar.nats.shards import ShardLeases


@dataclass
class RegionHandles:
    """The connection exists from the start; the cursor store and the shard leases only once
    the bring-up has opened the region's KV bucket (`None` before, and the leases again after
    `stop`). Shared by reference, so every reader sees the bring-up's result at once."""

    region: str
    conn: NatsConnection
    cursor_store: CursorStore | None = None
    leases: ShardLeases | None = None
    markers: MarkerPublisher = field(default_factory=MarkerPublisher)

    def cursors(self) -> CursorStore:
        """The cursor store; only used after the bring-up (drivers and writes start later)."""
        assert self.cursor_store is not None, "the KV bucket is not open yet"
        return self.cursor_store

    def leads(self, stream: str) -> bool:
        """Whether this replica leads `stream` now (its shard's lease)."""
        return self.leases is not None and self.leases.for_stream(stream).is_leader

    def leads_with(self, stream: str, epoch: int) -> bool:
        """Whether this replica leads `stream` now, under `epoch` (its shard's lease)."""
        if self.leases is None:
            return False
        lease = self.leases.for_stream(stream)
        return lease.is_leader and lease.epoch == epoch
