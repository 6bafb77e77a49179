"""`StreamDriver`: one virtual stream's machine in this region, fed one input at a time.

The shape of etcd raft's `node.run()`: everything that happens to the stream becomes a job
on one queue (a tailed marker, a positions read, an interval, a lease change, an API write),
and one loop (`drive`) applies each job to the machine, then hands every output, in order,
to `Effects` (actions: NATS writes), to the reader queue (`ReadPositions`) or to
`StreamObserver` (events: metrics and logs) before it takes the next job. The machine is
only ever fed by that loop, and an API write that `submit`s a job returns once its outputs
are carried out. The driver decides nothing: when to tick, when to read positions and
whether a listing is current are the machine's (`needs`, `ReadPositions`, `generation`).

- `rebuild`: replay the origins of the data stored in the read stream, then its markers,
  read the subscriptions and their positions, and `StreamMachine.restore` a follower from
  them (DESIGN §5);
- `tail`: follow the read stream's markers live from where the replay ended;
- `index`: follow the origins of its data messages live from where the replay ended, handed
  to the machine in batches (`StreamMachine.data_indexed`, DESIGN §7);
- `interval`, called by the region's `IntervalLoop` every `snapshot.interval_ms`, and
  `refresh`, a read the machine asked for.

Memory of a backlog: while `rebuild` runs, each stored data message costs 18 bytes
(`Backlog`). Once indexed, the machine's origin index holds 24 bytes per run of
consecutive messages from one origin, so at most 24 bytes per message (origins alternating
message by message) and far less for bursts; it drops the runs below the lowest replicated
mark-delete in chunks (at least 1024 runs and a quarter of an origin's runs at a time), so
what stays is at worst 24 bytes per message not yet consumed by every replicated
subscription, plus per origin what waits for its next chunk (under 1024 runs, or up to a
third more); `rsub_origin_index_bytes` shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import structlog
from nats.errors import Error as NatsError

from sidecar.api.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.marker_log import replay_markers, tail_markers
from sidecar.nats.origin_log import replay_origins, tail_origins
from sidecar.protocol import (
    Action,
    MachineConfig,
    Needs,
    Output,
    PositionsListing,
    ReadPositions,
    StoredMarker,
    StreamMachine,
    SubscriptionAction,
)
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.batches import Backlog, Batches
from sidecar.runtime.effects import Effects
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.positions import LocalSubscriptions

log = structlog.get_logger(__name__)

Input = Callable[[StreamMachine], list[Output]]
"""One input to the machine: calls one (or a few) of its input methods, returns the outputs."""

_TAIL_RETRY_S = 0.5
# Tailed data origins go to the machine as one job per this many, or per this wait.
_INDEX_BATCH = 1000
_INDEX_WAIT_S = 0.1
_READ_FAILED = (TimeoutError, NatsError, OSError)


@dataclass
class _Job:
    apply: Input
    done: asyncio.Future[None] | None = None


class StreamDriver:
    def __init__(
        self,
        vs: VirtualStream,
        config: MachineConfig,
        handles: RegionHandles,
        metrics: SidecarMetrics,
    ) -> None:
        self.vs = vs
        self.subscriptions = LocalSubscriptions(vs, handles.region, handles.clock)
        self.observer = StreamObserver(vs.name, metrics, handles.clock)
        self.machine: StreamMachine | None = None
        """None until `rebuild` is done; only `drive` calls its input methods after that."""
        self.changed = asyncio.Condition()
        """Notified after every job (what `watch_subscription` waits for)."""
        self.read_later: Callable[[StreamDriver], None] = StreamDriver._read_unqueued
        """Queues a `refresh` of this driver (set by the `IntervalLoop` that runs it)."""
        self._config = config
        self._metrics = metrics
        self._handles = handles
        self._effects = Effects(vs, handles, self.subscriptions)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._data = Batches(self._post_data, _INDEX_BATCH, _INDEX_WAIT_S)
        self._stopping = False
        # Coalesced between intervals: how far the tails saw the read stream go (and what
        # the machine was told), and whether a signal said positions moved.
        self._tail_seq = 0
        self._data_seq = 0
        self._told_seq = 0
        self._moved = False
        self._needs = Needs(None, signals=False)  # the machine's, after its last job
        self._steps = 0  # jobs applied
        self._observed = -1  # `_steps` when the observer last looked at the machine

    # ---- inputs ---------------------------------------------------------------------------

    def post(self, apply: Input) -> None:
        """Queue `apply` for the machine (carried out in order, after the jobs before it)."""
        self._jobs.put_nowait(_Job(apply))

    async def submit(self, apply: Input) -> None:
        """Queue `apply` and wait until its outputs are carried out."""
        done = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait(_Job(apply, done))
        await done

    def leadership(self, leader: bool, epoch: int) -> None:
        """The lease changed: the machine learns it in turn with everything else."""
        self.post(partial(self._become_leader, epoch) if leader else StreamMachine.became_follower)

    def _become_leader(self, epoch: int, machine: StreamMachine) -> list[Output]:
        try:
            return machine.became_leader(epoch)
        except ValueError as err:
            # The lease bucket was reset: its revisions restarted below epochs already seen.
            log.error("stale_lease_epoch", stream=self.vs.name, epoch=epoch, error=str(err))
            return []

    def moved(self) -> None:
        """A signal that positions may have moved (an ack, a consumer advisory, a cursor
        write): told to the machine at the next interval."""
        self._moved = True

    async def read_positions(self) -> PositionsListing:
        """Durables and external cursors read again (see `LocalSubscriptions.read`)."""
        self._metrics.position_read(self.vs.name)
        generation = self.machine.generation if self.machine is not None else 0
        listing = await self.subscriptions.read(
            self._handles.port, self._handles.cursors(), generation
        )
        self.observer.durables_receiving_markers(self.subscriptions.receiving_markers)
        return listing

    # ---- the loops ------------------------------------------------------------------------

    async def rebuild(self) -> None:
        port, vs, region = self._handles.port, self.vs, self._handles.region
        # Data first, from the stream's first message: markers replayed after it then find
        # the index as far as the stream went when they were read, or further.
        backlog = Backlog()
        if self._config.progress:
            async for entry in replay_origins(port, vs, region):
                self._data_read(entry)
                backlog.add(entry)
        markers: list[StoredMarker] = []
        async for stored in replay_markers(port, vs.read_stream(region), vs.marker_filter()):
            markers.append(stored)
            self._tail_seq = stored.seq
        listing = await self.read_positions()
        if not self._config.progress:
            # Without progress only data from now on matters (`index` follows it from here).
            self._data_seq = listing.last_seq
        # Leadership reaches the machine through the job queue (`leadership`), never here:
        # `became_leader` twice with one epoch would reuse snapshot ids.
        self.machine, read = StreamMachine.restore(
            self._config,
            markers,
            listing.subscriptions,
            listing.positions,
            listing.last_seq,
            self._handles.clock(),
            data=backlog.entries(),
        )
        for event in read:
            self.observer.event(event)
        self._needs = self.machine.needs()
        log.info(
            "stream_rebuilt",
            stream=vs.name,
            data=len(backlog),
            markers=len(markers),
            snapshots=len(self.machine.completed_snapshots()),
            subscriptions=len(self.machine.subscriptions()),
        )

    async def drive(self) -> None:
        """Apply the jobs one by one; carry out each job's outputs before the next job."""
        assert self.machine is not None, "drive() before rebuild()"
        machine = self.machine
        while not self._stopping:
            job = await self._jobs.get()
            outputs: deque[Output] = deque()
            try:
                outputs.extend(job.apply(machine))
                while outputs:
                    await self._carry_out(machine, outputs.popleft(), outputs)
            except Exception:
                log.exception("stream_job_failed", stream=self.vs.name)
                for output in outputs:  # never carried out: the machine asks for them again
                    if isinstance(output, SubscriptionAction):
                        machine.action_failed(output)
                    elif isinstance(output, ReadPositions):
                        machine.read_failed()
            finally:
                if job.done is not None and not job.done.done():
                    job.done.set_result(None)
            self._needs = machine.needs()
            self._steps += 1
            async with self.changed:
                self.changed.notify_all()

    async def _carry_out(
        self, machine: StreamMachine, output: Output, outputs: deque[Output]
    ) -> None:
        """One output of a job: an action to `Effects`, a read to the reader queue, an event
        to the observer. The outcome of a move or creation goes back to the machine at once
        (before the next output and the next job), and whatever that input returns joins
        the job's outputs."""
        if isinstance(output, ReadPositions):
            self.read_later(self)
        elif not isinstance(output, Action):
            self.observer.event(output)
        else:
            mark_delete = await self._effects.carry_out(machine, output)
            if isinstance(output, SubscriptionAction):
                if mark_delete is None:
                    outputs.extend(machine.action_failed(output))
                else:
                    outputs.extend(machine.action_done(output, mark_delete))

    async def tail(self) -> None:
        """Follow the read stream's markers live, from where the replay ended."""
        await self._follow("marker", self._tail_markers, lambda: self._tail_seq)

    async def _tail_markers(self) -> None:
        vs, region, clock = self.vs, self._handles.region, self._handles.clock
        tail = tail_markers(
            self._handles.port, vs.read_stream(region), vs.marker_filter(), self._tail_seq + 1
        )
        async with contextlib.aclosing(tail):
            async for stored in tail:
                self._tail_seq = stored.seq
                # The data read so far goes first: an update is applied with the index as
                # far as the data tail got (a lagging index only places it less far).
                self._data.flush()
                self.post(partial(StreamMachine.marker_read, stored=stored, now_ms=clock()))

    async def index(self) -> None:
        """Follow the origins of the read stream's data messages live, from where the replay
        ended, and hand them to the machine in batches (never one job per message). With
        progress off, only follow how far the data went (the snapshots' start signal)."""
        try:
            await self._follow("origin", self._tail_origins, lambda: self._data_seq)
        finally:
            self._data.cancel()

    async def _tail_origins(self) -> None:
        # Safety rests on what reaches the machine, not on how fast: the entries come in
        # read-stream order, one per data message (the filter is `vs.data_filter()`, so no
        # marker), none skipped (each tail starts right after the last entry taken, and the
        # ordered consumer recreates itself after the last message it delivered). An index
        # lagging behind the stream is safe: `vector_at(M)` only names messages it holds at
        # or below M (whatever it lacks makes the vector smaller, never larger), and
        # `position_for` never goes past `indexed_through`, the last entry it was given.
        tail = tail_origins(self._handles.port, self.vs, self._handles.region, self._data_seq + 1)
        async with contextlib.aclosing(tail):
            async for entry in tail:
                if self._config.progress:
                    self._data_read(entry)
                    self._data.add(entry)
                else:  # only how far the data went, the signal for a snapshot to start
                    self._data_seq = entry.read_seq

    def _post_data(self, entries: list[DataEntry]) -> None:
        self.post(partial(StreamMachine.data_indexed, entries=entries))

    def _data_read(self, entry: DataEntry) -> None:
        self._data_seq = entry.read_seq
        if entry.origin == UNKNOWN_ORIGIN:
            self.observer.unknown_origin(entry.read_seq)

    async def _follow(
        self, what: str, run: Callable[[], Awaitable[None]], last_seq: Callable[[], int]
    ) -> None:
        """Run one tail (`run`) after another until stopped: each starts after the last
        message the one before it took (`last_seq`), once it ended or failed."""
        while not self._stopping:
            try:
                await run()
                log.warning(f"{what}_tail_ended", stream=self.vs.name, last_seq=last_seq())
            except (TimeoutError, NatsError, OSError) as err:
                log.warning(f"{what}_tail_failed", stream=self.vs.name, error=repr(err))
            await asyncio.sleep(_TAIL_RETRY_S)

    # ---- the interval (`IntervalLoop`) ---------------------------------------------------

    def interval(self, now: int, sweep: bool) -> None:
        """One interval: update the gauges if the machine changed, and post the machine's
        `interval` input when there is something to tell it (the stream grew, a signal its
        machine listens to, its sweep) or when it asked to be called by now (`Needs`). A
        machine with nothing to be told and no deadline is left alone (no job), which keeps
        the cost of an interval with the streams that changed."""
        machine = self.machine
        if machine is not None and self._steps != self._observed:
            self._observed = self._steps
            self.observer.machine_stepped(machine)
        seen = max(self._tail_seq, self._data_seq)
        needs = self._needs
        moved, self._moved = self._moved and needs.signals, False
        due = needs.deadline_ms is not None and needs.deadline_ms <= now
        if seen > self._told_seq or moved or sweep or due:
            self._told_seq = max(self._told_seq, seen)
            self.post(
                partial(StreamMachine.interval, now_ms=now, last_seq=seen, moved=moved, sweep=sweep)
            )

    async def refresh(self, connected: bool) -> None:
        """The positions read the machine asked for (`ReadPositions`), and its outcome."""
        if not connected:
            self.post(StreamMachine.read_failed)
            return
        try:
            listing = await self.read_positions()
        except _READ_FAILED as err:
            log.warning("positions_read_failed", stream=self.vs.name, error=repr(err))
            self.post(StreamMachine.read_failed)
        except Exception:  # the machine must hear of every read's end, or it never asks again
            log.exception("positions_read_crashed", stream=self.vs.name)
            self.post(StreamMachine.read_failed)
        else:
            self.post(partial(StreamMachine.read_done, listing=listing))

    def stop(self) -> None:
        """Let the loops end at their next turn (the root cancels them as well)."""
        self._stopping = True

    def _read_unqueued(self) -> None:
        """No interval loop runs this driver (yet): the read fails, asked for again later."""
        self.post(StreamMachine.read_failed)
