"""`StreamTails`: what one read stream holds, read for its machine: replayed at a rebuild,
then followed live, its markers (one job each) and the origins of its data (in batches).

Memory of a backlog: while a rebuild replays, each stored data message costs 18 bytes
(`Backlog`). Once indexed, the machine's origin index holds 24 bytes per run of consecutive
messages from one origin, so at most 24 bytes per message (origins alternating message by
message) and far less for bursts; it drops the runs below the lowest replicated mark-delete
in chunks (at least 1024 runs and a quarter of an origin's runs at a time), so what stays is
at worst 24 bytes per message not yet consumed by every replicated subscription, plus per
origin what waits for its next chunk (under 1024 runs, or up to a third more);
`rsub_origin_index_bytes` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial

import structlog
from nats.errors import Error as NatsError

from sidecar.naming import VirtualStream
from sidecar.nats.marker_log import replay_markers, tail_markers
from sidecar.nats.origin_log import replay_origins, tail_origins
from sidecar.nats.port import counting_creations_asked_again
from sidecar.protocol import Output, StoredMarker, StreamMachine
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.batches import Backlog, Batches
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver

log = structlog.get_logger(__name__)

Input = Callable[[StreamMachine], list[Output]]
"""One input to the machine: calls one (or a few) of its input methods, returns the outputs."""

_TAIL_RETRY_S = 0.5
# Tailed data origins go to the machine as one job per this many, or per this wait.
_INDEX_BATCH = 1000
_INDEX_WAIT_S = 0.1


class StreamTails:
    def __init__(
        self,
        vs: VirtualStream,
        handles: RegionHandles,
        progress: bool,
        observer: StreamObserver,
        post: Callable[[Input], None],
    ) -> None:
        self._vs = vs
        self._handles = handles
        self._progress = progress
        self._observer = observer
        self._post = post
        self._data = Batches(self._post_data, _INDEX_BATCH, _INDEX_WAIT_S)
        self._stopping = False
        # Set once each tail's first read was taken by the server (`opened`).
        self._marker_opened = asyncio.Event()
        self._origin_opened = asyncio.Event()
        self.marker_seq = 0
        """The last marker taken (replayed or tailed)."""
        self.data_seq = 0
        """The last data message taken (with progress off: how far the data went)."""

    def seen(self) -> int:
        """How far the tails saw the read stream go."""
        return max(self.marker_seq, self.data_seq)

    async def replay(self) -> tuple[Backlog, list[StoredMarker]]:
        """What the read stream holds now: the origins of its data first, from the stream's
        first message (markers replayed after them then find the index as far as the stream
        went when they were read, or further), then its markers."""
        port, vs, region = self._handles.port, self._vs, self._handles.region
        backlog = Backlog()
        markers: list[StoredMarker] = []
        with counting_creations_asked_again(self._observer.consumer_creation_asked_again):
            if self._progress:
                async for entry in replay_origins(port, vs, region):
                    self._data_read(entry)
                    backlog.add(entry)
            async for stored in replay_markers(port, vs.read_stream(region), vs.marker_filter()):
                markers.append(stored)
                self.marker_seq = stored.seq
        return backlog, markers

    async def opened(self) -> None:
        """Wait until both tails follow the read stream (each one's first consumer created):
        until then the stream counts as rebuilding. A tail that keeps failing (a consumer
        the server refuses, `_follow` warns and retries) keeps it waiting."""
        await self._marker_opened.wait()
        await self._origin_opened.wait()

    def data_from(self, last_seq: int) -> None:
        """With progress off only data from `last_seq` on matters (`origins` follows it)."""
        if not self._progress:
            self.data_seq = last_seq

    async def markers(self) -> None:
        """Follow the read stream's markers live, from where the replay ended."""
        await self._follow(
            "marker", self._tail_markers, lambda: self.marker_seq, self._marker_opened
        )

    async def _tail_markers(self, opened: Callable[[], None]) -> None:
        vs, region, clock = self._vs, self._handles.region, self._handles.clock
        tail = tail_markers(
            self._handles.port,
            vs.read_stream(region),
            vs.marker_filter(),
            self.marker_seq + 1,
            opened,
        )
        async with contextlib.aclosing(tail):
            async for stored in tail:
                self.marker_seq = stored.seq
                # The data read so far goes first: an update is applied with the index as
                # far as the data tail got (a lagging index only places it less far).
                self._data.flush()
                self._post(partial(StreamMachine.marker_read, stored=stored, now_ms=clock()))

    async def origins(self) -> None:
        """Follow the origins of the read stream's data messages live, from where the replay
        ended, and hand them to the machine in batches (never one job per message). With
        progress off, only follow how far the data went (the snapshots' start signal)."""
        try:
            await self._follow(
                "origin", self._tail_origins, lambda: self.data_seq, self._origin_opened
            )
        finally:
            self._data.cancel()

    async def _tail_origins(self, opened: Callable[[], None]) -> None:
        # Safety rests on what reaches the machine, not on how fast: the entries come in
        # read-stream order, one per data message (the filter is `vs.data_filter()`, so no
        # marker), none skipped (each tail starts right after the last entry taken, and the
        # ordered consumer recreates itself after the last message it delivered). An index
        # lagging behind the stream is safe: `vector_at(M)` only names messages it holds at
        # or below M (whatever it lacks makes the vector smaller, never larger), and
        # `position_for` never goes past `indexed_through`, the last entry it was given.
        handles = self._handles
        tail = tail_origins(handles.port, self._vs, handles.region, self.data_seq + 1, opened)
        async with contextlib.aclosing(tail):
            async for entry in tail:
                if self._progress:
                    self._data_read(entry)
                    self._data.add(entry)
                else:  # only how far the data went, the signal for a snapshot to start
                    self.data_seq = entry.read_seq

    def _post_data(self, entries: list[DataEntry]) -> None:
        self._post(partial(StreamMachine.data_indexed, entries=entries))

    def _data_read(self, entry: DataEntry) -> None:
        self.data_seq = entry.read_seq
        if entry.origin == UNKNOWN_ORIGIN:
            self._observer.unknown_origin(entry.read_seq)

    async def _follow(
        self,
        what: str,
        run: Callable[[Callable[[], None]], Awaitable[None]],
        last_seq: Callable[[], int],
        opened: asyncio.Event,
    ) -> None:
        """Run one tail (`run`) after another until stopped: each starts after the last
        message the one before it took (`last_seq`), once it ended or failed. Each holds one
        of the region's `tail_opens` from its start until it is open (then `opened` is set)
        or has failed, so a start of thousands of streams (or a reconnect) opens them a few
        at a time instead of all at once. A tail's consumer creation the servers leave
        unanswered is asked again under the same name within the read (the port), and counted
        by the observer; a tail fails here once that gave up."""
        opening = self._handles.tail_opens
        with counting_creations_asked_again(self._observer.consumer_creation_asked_again):
            while not self._stopping:
                await opening.acquire()
                slot = _Slot(opening)
                try:
                    await run(partial(_open_done, slot, opened))
                    log.warning(f"{what}_tail_ended", stream=self._vs.name, last_seq=last_seq())
                except (TimeoutError, NatsError, OSError) as err:
                    log.warning(f"{what}_tail_failed", stream=self._vs.name, error=repr(err))
                finally:
                    slot.release()
                await asyncio.sleep(_TAIL_RETRY_S)

    def stop(self) -> None:
        self._stopping = True


class _Slot:
    """One of the region's `tail_opens`, held until released (once, whichever comes first:
    the tail open, or its end)."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore: asyncio.Semaphore | None = semaphore

    def release(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()
            self._semaphore = None


def _open_done(slot: _Slot, opened: asyncio.Event) -> None:
    slot.release()
    opened.set()
