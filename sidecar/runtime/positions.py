"""`LocalSubscriptions`: one virtual stream's subscriptions in this region, as last read."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from sidecar.naming import VirtualStream
from sidecar.nats import consumers
from sidecar.nats.consumers import stream_first_seq
from sidecar.nats.cursors import CursorStore
from sidecar.nats.effective import EffectivePositions, Floor
from sidecar.nats.port import JetStreamPort
from sidecar.protocol import PositionsListing, SubscriptionInfo, SubscriptionKind
from sidecar.runtime.clock import Clock

_EXTERNAL = SubscriptionInfo(SubscriptionKind.EXTERNAL, True, b"")


class LocalSubscriptions:
    """The durables (one consumer listing) and external cursors (one KV get) of `vs` here.

    `read` lists them for the machine (`PositionsListing`); the API backend answers from the
    same last read (which subscription is a durable, when positions were last read), and a
    cursor commit records the stored value at once (`cursor_stored`, `listing`).
    `lease_epoch` says under which epoch this replica leads the stream now (0: it does not).
    """

    def __init__(
        self, vs: VirtualStream, region: str, clock: Clock, lease_epoch: Callable[[], int]
    ) -> None:
        read_stream = vs.read_stream(region)
        self._vs = vs
        self._clock = clock
        self._lease_epoch = lease_epoch
        self._reader = consumers.PositionReader(read_stream, marker_filter=vs.marker_filter())
        self._cursor_positions = EffectivePositions(read_stream)
        self._data = (vs.data_filter(),)  # what a cursor's reader delivers
        self.durables: dict[str, SubscriptionInfo] = {}
        self.cursors: dict[str, int] = {}
        self.receiving_markers: Mapping[str, tuple[str, ...]] = {}  # `Positions`'s, as last read
        self.last_seq = 0
        """The read stream's last sequence, as read with the durables."""
        self.read_ms: int | None = None
        self._last = PositionsListing(0, {}, {}, 0, True)

    def infos(self) -> dict[str, SubscriptionInfo]:
        """Every local subscription, as last read (and cursors committed since)."""
        return {**{name: _EXTERNAL for name in self.cursors}, **self.durables}

    async def read(
        self, port: JetStreamPort, store: CursorStore, generation: int
    ) -> PositionsListing:
        """Read everything again: the subscriptions, and the mark-delete positions of the
        replicated ones. `generation` is the machine's when the read begins."""
        epoch = self._lease_epoch()  # held from here to the end, or 0 (`lease_epoch`)
        read = await self._reader.read(port)
        self.cursors = await store.load(self._vs.name)
        # `read.last_seq` was read before the scan after the cursors, as it must be.
        cursors = await self._cursor_positions.read(
            port, {name: self._floor(value) for name, value in self.cursors.items()}, read.last_seq
        )
        # Safety (docs/protocol.md §8, `PositionsListing.first_seq`): the machine takes no
        # position at or below the first sequence less one for consumption, as the stream's
        # removals move floors there by themselves (its age, count and size limits and purges
        # remove from its start). So the first sequence is read after every observation a
        # position comes from: the consumer listing (floors a removal moved), the scans past
        # the floors and cursors (`first_delivered` answers the next message still stored,
        # so a scan runs over removed ones) and the cursors' values. Each of their replies
        # came before this request went out, so every removal one of them shows was applied
        # before the stream answers it, and a stream's first sequence never goes back: what
        # they passed that was removed lies below it. Read with `last_seq`, before the
        # listing, it missed a purge during the read, and the floor the purge moved was taken
        # for the consumers' (`make soak` seed 874624534575).
        first_seq = await stream_first_seq(port, read.stream)
        # A durable listed without its state stays as last read, with no position: dropped,
        # the machine would take it for deleted and forget what it holds for it.
        kept = {name: self.durables[name] for name in read.unknown if name in self.durables}
        self.durables = kept | {
            c.name: SubscriptionInfo(
                SubscriptionKind.DURABLE, c.replicated, json.dumps(c.config).encode()
            )
            for c in read.consumers
        }
        self.last_seq = read.last_seq
        self.receiving_markers = read.receiving_markers
        self.read_ms = self._clock()
        if self._lease_epoch() != epoch:
            epoch = 0
        # A position follows the end when an external cursor has it (markers after it count
        # as consumed) or a replicated durable stands at `last_seq` (nothing pending, or only
        # what it does not deliver after its floor).
        follows_end = bool(self.cursors) or any(
            c.replicated and c.mark_delete >= read.last_seq for c in read.consumers
        )
        positions = {**cursors, **{c.name: c.mark_delete for c in read.consumers if c.replicated}}
        sources = {
            region: heard
            for stream, heard in read.sources.items()
            if (region := self._vs.region_of_write_stream(stream)) is not None
        }
        since, created = read.leader_since_ms, read.created_ms
        self._last = PositionsListing(
            generation,
            self.infos(),
            positions,
            read.last_seq,
            follows_end,
            sources,
            None if since is None else max(0, self.read_ms - since),
            first_seq,
            self.read_ms,
            stream_age_ms=None if created is None else max(0, self.read_ms - created),
            lease_epoch=epoch,
            paused={
                c.name: c.paused_ms
                for c in read.consumers
                if c.replicated and c.paused_ms is not None
            },
        )
        return self._last

    def listing(self, positions: Mapping[str, int]) -> PositionsListing:
        """The last read's listing, with these positions instead (a cursor just committed:
        `cursor_stored`): as old as that read, whatever the positions."""
        last = self._last
        return PositionsListing(
            last.generation,
            self.infos(),
            positions,
            last.last_seq,
            last.follows_end,
            last.sources,
            last.leader_age_ms,
            last.first_seq,
            last.read_ms,
            stream_age_ms=last.stream_age_ms,
            lease_epoch=last.lease_epoch,
            paused=last.paused,
        )

    def cursor_stored(self, subscription: str, value: int) -> int:
        """Record a cursor value just stored; its mark-delete position (the read stream's
        last sequence when only markers follow it, as far as already known)."""
        self.cursors[subscription] = value
        return self._cursor_positions.known(subscription, self._floor(value), self.last_seq)

    def _floor(self, cursor: int) -> Floor:
        return Floor(cursor, self._data)
