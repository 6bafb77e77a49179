"""This region's NATS handles, shared by the stream drivers, the effects and the API backend."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.nats.connection import NatsConnection
from sidecar.nats.cursors import CursorStore
from sidecar.nats.lease import Lease


@dataclass
class RegionHandles:
    """The connection exists from the start; the cursor store and the lease only once the
    bring-up has opened the region's KV bucket (`None` before, and the lease again after
    `stop`). Shared by reference, so every reader sees the bring-up's result at once."""

    region: str
    conn: NatsConnection
    cursor_store: CursorStore | None = None
    lease: Lease | None = None

    def cursors(self) -> CursorStore:
        """The cursor store; only used after the bring-up (drivers and writes start later)."""
        assert self.cursor_store is not None, "the KV bucket is not open yet"
        return self.cursor_store

    @property
    def is_leader(self) -> bool:
        return self.lease is not None and self.lease.is_leader

    @property
    def epoch(self) -> int:
        return self.lease.epoch if self.lease is not None else 0
