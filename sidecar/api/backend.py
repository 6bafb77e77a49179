"""The boundary between the API layer and the sidecar runtime: `SidecarBackend`, what the
API needs of it.

The runtime implements it; the gRPC server, the HTTP server and the tests only ever see this
protocol and the frozen views of `sidecar.runtime.views`, never protobuf or NATS objects.
Backend methods signal failures with the exceptions of `sidecar.runtime.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from sidecar.runtime.views import (
    CursorResetView,
    Readiness,
    SnapshotView,
    StatusView,
    SubscriptionView,
)


class SidecarBackend(Protocol):
    """What the API layer needs from the sidecar runtime.

    Every replica of a region serves every method but one, whichever the load balancer picks:
    reads (`status`, `get_*`, `list_*`, `watch_subscription`) and the writes that are NATS
    writes any replica can make safely: `commit_cursor` (a compare-and-set that only moves
    forward), `reset_cursor` (a compare-and-set) and `set_replicated` (consumer metadata).
    The leader's machine takes those in at its next positions read. `trigger_snapshot` needs the stream's leader (replicas share the
    streams: each leads some) and raises `NotLeader` (naming it when known) elsewhere. An unknown stream or subscription raises
    `NotFound`; an operation impossible now (NATS down, leadership changing) `Unavailable`.
    """

    @property
    def is_leader(self) -> bool: ...

    @property
    def readiness(self) -> Readiness:
        """Read often (health polling, every /readyz): must be cheap and never block."""
        ...

    async def status(self) -> StatusView: ...

    async def get_subscription(self, stream: str, subscription: str) -> SubscriptionView: ...

    async def list_subscriptions(self, stream: str) -> Sequence[SubscriptionView]: ...

    async def list_snapshots(self, stream: str) -> Sequence[SnapshotView]:
        """Snapshots still kept for the stream, oldest first."""
        ...

    def watch_subscription(self, stream: str, subscription: str) -> AsyncIterator[SubscriptionView]:
        """Yield the current state at once, then the state after each change.

        Raises `NotFound` (on the first iteration) for an unknown stream or subscription;
        ends when the subscription is deleted.
        """
        ...

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        """Move the external cursor forward to `sequence` (creating it when absent).

        Returns the cursor after the commit: never lower than before, so a stale or repeated
        commit (including `sequence == 0`) returns the current cursor unchanged. Raises
        `InvalidArgument` for a durable's name and for a sequence beyond the read stream's
        last sequence + 1.
        """
        ...

    async def reset_cursor(self, stream: str, subscription: str, sequence: int) -> CursorResetView:
        """Set an existing external cursor to `sequence`, backwards too: an operator's repair
        of a cursor committed wrong (logged). Raises `NotFound` when no such cursor exists
        here, `InvalidArgument` for a sequence beyond the read stream's last sequence + 1 (as
        `commit_cursor` does)."""
        ...

    async def trigger_snapshot(self, stream: str) -> str:
        """Start a snapshot now, whatever the interval; returns its id, or the pending
        attempt's id when one is under way. Raises `FailedPrecondition` when the stream has
        no replicated subscription, `NotLeader` on a replica not leading the stream."""
        ...

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> SubscriptionView:
        """Set or clear `rsub.replicate` on a durable here; its state after the change."""
        ...
