"""`StreamDriver`: one virtual stream's machine in this region, fed one input at a time.

The shape of etcd raft's `node.run()`: everything that happens to the stream becomes a job
on one queue (a tailed marker, the positions read every interval, a tick, a lease change,
an API write), and one loop (`drive`) applies each job to the machine, then hands every
output, in order, to `Effects` (actions: NATS writes) or to `StreamObserver` (events:
metrics and logs) before it takes the next job. The machine is therefore only ever touched
by that loop, and an API write that `submit`s a job returns once its outputs are carried out.

- `rebuild`: replay the origins of the data stored in the read stream, then its markers,
  read the subscriptions and their positions, and `StreamMachine.restore` a follower from
  them (DESIGN §5);
- `tail`: follow the read stream's markers live from where the replay ended;
- `index`: follow the origins of its data messages live from where the replay ended, handed
  to the machine in batches (`StreamMachine.data_indexed`, DESIGN §7);
- `interval` and `refresh`, called by the region's one `IntervalLoop` every
  `snapshot.interval_ms`: tell the machine how far the tails saw the read stream go, tick
  it while it may act, and read the positions again when they may have moved.

Memory of a backlog: while `rebuild` runs, each stored data message costs 18 bytes
(`_Backlog`). Once indexed, the machine's origin index holds 24 bytes per run of
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
import itertools
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial

import structlog
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from sidecar.api.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats import signals
from sidecar.nats.cursors import cursor_commits
from sidecar.nats.marker_log import StoredMarker, replay_markers, tail_markers
from sidecar.nats.origin_log import replay_origins, tail_origins
from sidecar.protocol import (
    Action,
    MachineConfig,
    Marker,
    Output,
    Rejected,
    StreamMachine,
    SubscriptionAction,
    Update,
    check_writer,
    decode,
)
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.clock import now_ms
from sidecar.runtime.effects import Effects
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.positions import LocalSubscriptions

log = structlog.get_logger(__name__)

Input = Callable[[StreamMachine], list[Output]]
"""One input to the machine: calls one (or a few) of its input methods, returns the outputs."""

_TAIL_RETRY_S = 0.5
# Position reads in flight at once over the region's streams (`IntervalLoop`).
_READERS = 16
# `IntervalLoop` takes the streams in this many groups, spread over each interval.
_PHASES = 10
# A leader's machine quiet (no input, no output, no attempt) for this many interval ticks
# in a row is not ticked again until its next input (`StreamDriver.interval`).
_QUIET_TICKS = 2
# Tailed data origins go to the machine as one job per this many, or per this wait.
_INDEX_BATCH = 1000
_INDEX_WAIT_S = 0.1


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
        self.subscriptions = LocalSubscriptions(vs, handles.region)
        self.observer = StreamObserver(vs.name, metrics)
        self.machine: StreamMachine | None = None
        """None until `rebuild` is done; only `drive` calls its input methods after that."""
        self.changed = asyncio.Condition()
        """Notified after every job (what `watch_subscription` waits for)."""
        self._config = config
        self._metrics = metrics
        self._handles = handles
        self._effects = Effects(vs, handles, self.subscriptions)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._tail_seq = 0
        self._positions_queued = False
        self._data_seq = 0
        self._data = _Batches(self._post_data, _INDEX_BATCH, _INDEX_WAIT_S)
        self._stopping = False
        self.read_queued = False
        """Set by `IntervalLoop` while a read of this stream waits or runs."""
        self._signalled = False
        self._told_seq = 0  # the read stream's end as last told to the machine
        self._activity = 0  # inputs queued, and interval ticks that gave outputs
        self._activity_seen = -1
        self._quiet = 0
        self._steps = 0  # jobs applied
        self._observed = -1  # `_steps` when the observer last looked at the machine

    # ---- inputs ---------------------------------------------------------------------------

    def post(self, apply: Input) -> None:
        """Queue `apply` for the machine (carried out in order, after the jobs before it)."""
        self._activity += 1
        self._jobs.put_nowait(_Job(apply))

    async def submit(self, apply: Input) -> None:
        """Queue `apply` and wait until its outputs are carried out."""
        self._activity += 1
        done = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait(_Job(apply, done))
        await done

    def leadership(self, leader: bool, epoch: int) -> None:
        """The lease changed: the machine learns it in turn with everything else (a new
        leader reads the positions at once)."""
        self._signalled = True
        self.post(partial(self._become_leader, epoch) if leader else StreamMachine.became_follower)

    def _become_leader(self, epoch: int, machine: StreamMachine) -> list[Output]:
        try:
            return machine.became_leader(epoch)
        except ValueError as err:
            # The lease bucket was reset: its revisions restarted below epochs already seen.
            log.error("stale_lease_epoch", stream=self.vs.name, epoch=epoch, error=str(err))
            return []

    async def read_positions(self) -> dict[str, int]:
        """Durables and external cursors read again (see `LocalSubscriptions.read`)."""
        self._metrics.position_read(self.vs.name)
        positions = await self.subscriptions.read(self._handles.conn.nc, self._handles.cursors())
        self.observer.durables_receiving_markers(self.subscriptions.receiving_markers)
        return positions

    def positions_input(self, positions: Mapping[str, int]) -> Input:
        """The machine's input for positions just read: the subscriptions, then positions."""
        subscriptions = self.subscriptions
        infos, last_seq, read_created = (
            subscriptions.infos(),
            subscriptions.last_seq,
            subscriptions.read_created,
        )

        def apply(machine: StreamMachine) -> list[Output]:
            # A read that began before this sidecar created a subscription lacks it: the
            # machine would take it for deleted and forget what it holds for it (progress
            # received, updates sent). The next read has it.
            out = []
            if subscriptions.created == read_created:
                out = machine.subscriptions_changed(infos)
            return out + machine.positions_read(positions, last_seq)

        return apply

    # ---- the loops ------------------------------------------------------------------------

    async def rebuild(self) -> None:
        js, vs, region = self._handles.conn.js, self.vs, self._handles.region
        # Data first, from the stream's first message: markers replayed after it then find
        # the index as far as the stream went when they were read, or further.
        backlog = _Backlog()
        if self._config.progress:
            async for entry in replay_origins(js, vs, region):
                self._data_read(entry)
                backlog.add(entry)
        markers: list[tuple[int, Marker]] = []
        async for stored in replay_markers(js, vs.read_stream(region), vs.marker_filter()):
            decoded = self._decode(stored)
            if isinstance(decoded, Marker):
                markers.append((stored.seq, decoded))
            self._tail_seq = stored.seq
        positions = await self.read_positions()
        if not self._config.progress:
            # Without progress only data from now on matters (`index` follows it from here).
            self._data_seq = self.subscriptions.last_seq
        # Leadership reaches the machine through the job queue (`leadership`), never here:
        # `became_leader` twice with one epoch would reuse snapshot ids.
        self.machine = StreamMachine.restore(
            self._config,
            markers,
            self.subscriptions.infos(),
            positions,
            self.subscriptions.last_seq,
            now_ms(),
            data=backlog.entries(),
        )
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
            finally:
                if job.done is not None and not job.done.done():
                    job.done.set_result(None)
            self._steps += 1
            async with self.changed:
                self.changed.notify_all()

    async def _carry_out(
        self, machine: StreamMachine, output: Output, outputs: deque[Output]
    ) -> None:
        """One output of a job: an action to `Effects`, an event to the observer. The
        outcome of a move or creation goes back to the machine at once (before the next
        output and the next job), and whatever that input returns joins the job's outputs."""
        if not isinstance(output, Action):
            self.observer.event(output)
            return
        mark_delete = await self._effects.carry_out(machine, output)
        if isinstance(output, SubscriptionAction):
            # Failed, the machine asks for it again at the next read; done, it moved the
            # position: either way, read them at the next interval. A consumer left alone
            # (`move_forward`: delivered up to the position already, or none of its messages
            # before it) did not move: its acks signal when it does, and a read now would
            # only ask for the same move again, every interval.
            if mark_delete is None or mark_delete >= output.ack_floor:
                self._signalled = True
            if mark_delete is None:
                outputs.extend(machine.action_failed(output))
            else:
                outputs.extend(machine.action_done(output, mark_delete))

    async def tail(self) -> None:
        """Follow the read stream's markers live, from where the replay ended."""
        await self._follow("marker", self._tail_markers, lambda: self._tail_seq)

    async def _tail_markers(self) -> None:
        vs, region = self.vs, self._handles.region
        tail = tail_markers(
            self._handles.conn.js, vs.read_stream(region), vs.marker_filter(), self._tail_seq + 1
        )
        async with contextlib.aclosing(tail):
            async for stored in tail:
                self._tail_seq = stored.seq
                # The data read so far goes first: an update is applied with the index as
                # far as the data tail got (a lagging index only places it less far).
                self._data.flush()
                decoded = self._decode(stored)
                body = decoded.body if isinstance(decoded, Marker) else None
                if isinstance(body, Update) and body.progress:
                    # A vector moves a subscription (and changes its exposure) only at a
                    # positions read: ask for one.
                    self.moved()
                self.post(_marker_input(stored.seq, decoded))

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
        tail = tail_origins(
            self._handles.conn.js, self.vs, self._handles.region, self._data_seq + 1
        )
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

    def moved(self) -> None:
        """A signal that positions may have moved (an ack, a consumer advisory, a cursor
        write, a move or creation carried out here, a leadership change): read them at the
        next interval."""
        self._signalled = True

    def positions_stale(self, leader: bool, sweep: bool) -> bool:
        """Whether to read the positions at this interval.

        A leader reads them when signalled, or when the read stream grew while a position
        follows its end (`LocalSubscriptions.follows_end`); a follower (it only answers the
        API) and everyone on a sweep read them anyway. Safety does not rest on this choice:
        the machine only ever gets positions as read from the server (`positions_read`), so
        a read skipped or late only delays an update; it never hands over a position the
        subscription has not reached.
        """
        if sweep:
            return True
        if not leader:
            return False
        subscriptions = self.subscriptions
        grew = self._told_seq > subscriptions.last_seq and subscriptions.follows_end
        return self._signalled or grew

    async def refresh(self) -> None:
        """Read the positions again and queue them for the machine."""
        # While the machine has not taken the last read (its jobs are slow: moves in a
        # degraded cluster take a second each), a newer read would only queue up behind it.
        if self._positions_queued:
            self._signalled = True
            return
        self._signalled = False  # a signal arriving during the read asks for the next one
        try:
            self._post_positions(await self.read_positions())
        except (TimeoutError, NatsError, OSError) as err:
            self._signalled = True
            log.warning("positions_read_failed", stream=self.vs.name, error=repr(err))

    def interval(self, now_ms: int, leader: bool) -> None:
        """One interval: update the machine's gauges if it changed, tell the machine how far
        the tails saw the read stream go (a leader starts a snapshot on new data), and tick a
        leader's machine while it may act.

        The machine only acts on an input or with an attempt pending, so a leader's machine
        that had neither for two ticks an interval apart has nothing to do until its next
        input (by then its interval since the last start has passed too): it is not ticked.
        The tails' sequences are of messages stored in the read stream, so the machine's
        last sequence is never beyond the stream's (`read_stream_advanced`).
        """
        machine = self.machine
        if machine is not None and self._steps != self._observed:
            # The gauges follow the machine once an interval (not after every job).
            self._observed = self._steps
            self.observer.machine_stepped(machine)
        seen = max(self._tail_seq, self._data_seq)
        advanced = seen if seen > self._told_seq else 0
        self._told_seq = max(self._told_seq, seen)
        tick = False
        if leader:
            busy = machine is not None and machine.pending() is not None
            if advanced or busy or self._activity != self._activity_seen:
                self._activity_seen = self._activity
                self._quiet = 0
            else:
                self._quiet += 1
            tick = self._quiet <= _QUIET_TICKS
        if advanced or tick:
            self._jobs.put_nowait(_Job(partial(self._interval_input, advanced, now_ms, tick)))

    def _interval_input(
        self, last_seq: int, now_ms: int, tick: bool, machine: StreamMachine
    ) -> list[Output]:
        out = machine.read_stream_advanced(last_seq) if last_seq else []
        if tick:
            ticked = machine.tick(now_ms)
            if ticked:
                self._activity += 1
            out += ticked
        return out

    def _post_positions(self, positions: Mapping[str, int]) -> None:
        apply = self.positions_input(positions)

        def taken(machine: StreamMachine) -> list[Output]:
            self._positions_queued = False
            return apply(machine)

        self._positions_queued = True
        self.post(taken)

    def stop(self) -> None:
        """Let the loops end at their next turn (the root cancels them as well)."""
        self._stopping = True

    def _decode(self, stored: StoredMarker) -> Marker | Rejected:
        decoded = decode(stored.data, stream=self.vs.name, regions=self._config.regions)
        decoded = check_writer(decoded, stored.subject)
        self.observer.marker_read(stored.seq, decoded)
        return decoded


def _marker_input(seq: int, decoded: Marker | Rejected) -> Input:
    """The machine's input for one tailed marker, between two ticks with the time it was seen:
    the one before stamps what the marker completes with that time, the one after starts the
    next snapshot at once when the marker completed one later than an interval after it
    started (else the next would wait for the next interval, losing one)."""
    seen_ms = now_ms()

    def apply(machine: StreamMachine) -> list[Output]:
        out = machine.tick(seen_ms)
        if isinstance(decoded, Marker):
            out += machine.marker_seen(seq, decoded)
        else:
            out += machine.marker_rejected(seq, decoded)
        return out + machine.tick(seen_ms)

    return apply


class _Backlog:
    """The data entries replayed by `rebuild`, held until `restore` indexes them: in typed
    columns (18 bytes an entry) rather than a list of `DataEntry` (about 120 bytes each)."""

    def __init__(self) -> None:
        self._reads = array("q")
        self._origin_seqs = array("q")
        self._origins = array("H")
        self._names: list[str] = []
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, entry: DataEntry) -> None:
        origin = self._ids.get(entry.origin)
        if origin is None:
            origin = self._ids[entry.origin] = len(self._names)
            self._names.append(entry.origin)
        self._reads.append(entry.read_seq)
        self._origin_seqs.append(entry.origin_seq)
        self._origins.append(origin)

    def entries(self) -> Iterator[DataEntry]:
        names = self._names
        for read_seq, origin, origin_seq in zip(
            self._reads, self._origins, self._origin_seqs, strict=True
        ):
            yield DataEntry(read_seq, names[origin], origin_seq)


class _Batches:
    """Entries handed on together: `size` of them, or what came within `wait_s` of the
    first one, whichever is first."""

    def __init__(
        self, hand_on: Callable[[list[DataEntry]], None], size: int, wait_s: float
    ) -> None:
        self._hand_on = hand_on
        self._size = size
        self._wait_s = wait_s
        self._entries: list[DataEntry] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, entry: DataEntry) -> None:
        self._entries.append(entry)
        if len(self._entries) >= self._size:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._wait_s, self.flush)

    def flush(self) -> None:
        self.cancel()
        if self._entries:
            entries, self._entries = self._entries, []
            self._hand_on(entries)

    def cancel(self) -> None:
        """Stop the timer (what was collected stays until the next `flush`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class IntervalLoop:
    """The interval of every stream of a region, in one task, and the reads it asks for.

    Every `interval_ms`, in `_PHASES` groups spread over it, each driver's `interval`
    (cheap, no I/O), then the positions of the
    streams that may have moved (`StreamDriver.positions_stale`) are read by `_READERS`
    tasks, never two reads of one stream at once. A sweep reads every stream once per
    `sweep_intervals` intervals, spread over them (a missed signal only delays an update by
    as much). The work of an interval grows with the streams that changed, not with all
    streams; the signals come from `sidecar.nats.signals` and `cursor_commits`.
    """

    def __init__(self, handles: RegionHandles, interval_ms: int, sweep_intervals: int) -> None:
        self._drivers: list[StreamDriver] = []
        self._by_name: dict[str, StreamDriver] = {}
        self._signals: dict[str, list[Subscription]] = {}
        self._handles = handles
        self._interval_s = interval_ms / 1000
        self._sweep = sweep_intervals
        self._queue: asyncio.Queue[StreamDriver] = asyncio.Queue()

    async def add(self, driver: StreamDriver) -> None:
        """Take `driver` (rebuilt) into the intervals, its consumer signals followed (nats-py
        keeps the subscriptions across reconnects)."""
        read_stream = driver.vs.read_stream(self._handles.region)
        name = driver.vs.name
        self._signals[name] = await signals.follow_consumers(
            self._handles.conn.nc, read_stream, driver.moved
        )
        self._drivers.append(driver)
        self._by_name[name] = driver

    async def remove(self, driver: StreamDriver) -> None:
        """Stop the intervals and the signals of `driver` (a stream no longer run here)."""
        name = driver.vs.name
        if self._by_name.pop(name, None) is None:
            return
        self._drivers.remove(driver)
        for subscription in self._signals.pop(name, []):
            with contextlib.suppress(NatsError):
                await subscription.unsubscribe()

    async def run(self) -> None:
        readers = [asyncio.create_task(self._reader()) for _ in range(_READERS)]
        try:
            for step in itertools.count(_PHASES):
                await asyncio.sleep(self._interval_s / _PHASES)
                self.interval(*divmod(step, _PHASES))
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    def interval(self, count: int, phase: int) -> None:
        """Interval `count` of the streams in `phase`: one in `_PHASES` of the streams, so
        that their snapshots do not all start (and load both regions) at the same instant."""
        handles = self._handles
        connected, now = handles.conn.connected, now_ms()
        queued = 0
        for i in range(phase, len(self._drivers), _PHASES):
            driver = self._drivers[i]
            leader = handles.leads(driver.vs.name)
            driver.interval(now, leader)
            sweep = (i + count) % self._sweep == 0
            if connected and not driver.read_queued and driver.positions_stale(leader, sweep):
                driver.read_queued = True
                self._queue.put_nowait(driver)
                queued += 1
        log.debug("interval", phase=phase, reads_queued=queued, reads_waiting=self._queue.qsize())

    async def _reader(self) -> None:
        while True:
            driver = await self._queue.get()
            try:
                await driver.refresh()
            except Exception:  # one stream's trouble never stops the reads of the others
                log.exception("positions_read_crashed", stream=driver.vs.name)
            finally:
                driver.read_queued = False

    async def follow_cursors(self, bucket: str) -> None:
        """Mark a stream whenever one of its cursors is written (by any replica)."""
        by_name = self._by_name
        while True:
            try:
                async for stream in cursor_commits(self._handles.conn.js, bucket):
                    driver = by_name.get(stream)
                    if driver is not None:
                        driver.moved()
                log.warning("cursor_tail_ended", bucket=bucket)
            except (TimeoutError, NatsError, OSError) as err:
                log.warning("cursor_tail_failed", bucket=bucket, error=repr(err))
            await asyncio.sleep(_TAIL_RETRY_S)
