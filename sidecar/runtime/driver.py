"""`StreamDriver`: one virtual stream's machine in this region, fed one input at a time.

The shape of etcd raft's `node.run()`: everything that happens to the stream becomes a job
on one queue (a tailed marker, a batch of data origins, a positions read, an interval, a
lease change, an API write), and one loop (`drive`) applies each job to the machine, then
hands every output, in order, to `Effects` (actions: NATS writes), to the reader queue
(`ReadPositions`) or to `StreamObserver` (events: metrics and logs) before it takes the next
job. The machine is only ever fed by that loop, and an API write that `submit`s a job returns
once its outputs are carried out. The driver decides nothing: when to tick, when to read
positions and whether a listing is current are the machine's (`needs`, `ReadPositions`,
`generation`); it only coalesces what comes between two intervals.

- `rebuild`: replay the read stream (`StreamTails.replay`), read the subscriptions and their
  positions, and `StreamMachine.restore` a follower from them (DESIGN §5);
- `tails`: follow the read stream's markers and data origins live (`StreamTails`);
- `interval`, called by the region's `IntervalLoop` every `snapshot.interval_ms`, and
  `refresh`, a read the machine asked for.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import structlog
from nats.errors import Error as NatsError

from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.protocol import (
    Acks,
    Action,
    MachineConfig,
    Needs,
    Output,
    PositionsListing,
    ReadPositions,
    StreamMachine,
    SubscriptionAction,
)
from sidecar.runtime.effects import Effects
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.positions import LocalSubscriptions
from sidecar.runtime.tails import Input, StreamTails

log = structlog.get_logger(__name__)

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
        machine_factory: type[StreamMachine] = StreamMachine,
    ) -> None:
        self.vs = vs
        self.subscriptions = LocalSubscriptions(
            vs, handles.region, handles.clock, partial(handles.lease_epoch, vs.name)
        )
        self.observer = StreamObserver(vs.name, metrics, handles.clock)
        self.machine: StreamMachine | None = None
        """None until `rebuild` is done; only `drive` calls its input methods after that."""
        self.changed = asyncio.Condition()
        """Notified after every job (what `watch_subscription` waits for)."""
        self.read_later: Callable[[StreamDriver], None] = StreamDriver._read_unqueued
        """Queues a `refresh` of this driver (set by the `IntervalLoop` that runs it)."""
        self._config = config
        self._machine_factory = machine_factory
        """What `rebuild` restores the machine as (a broken one, in the simulation's tests)."""
        self._metrics = metrics
        self._handles = handles
        self._effects = Effects(vs, handles, self.subscriptions)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self.tails = StreamTails(vs, handles, config.progress, self.observer, self.post)
        self._stopping = False
        # Coalesced between intervals: how far the tails saw the read stream go as told to
        # the machine, and whether a signal said positions moved.
        self._told_seq = 0
        self._moved = False
        # Per consumer acked here since the last read: the sequences settled, and when the
        # last was heard (the handles' clock).
        self._acked: dict[str, list[int]] = {}
        self._acked_ms: dict[str, int] = {}
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
        self.post(partial(self._become_leader, epoch) if leader else lambda m: m.became_follower())

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

    def acked(self, consumer: str, stream_seq: int) -> None:
        """An application acked `consumer`'s message at `stream_seq` here: told to the
        machine with the next read (`PositionsListing.acked`)."""
        self._acked.setdefault(consumer, []).append(stream_seq)
        self._acked_ms[consumer] = self._handles.clock()

    async def read_positions(self) -> PositionsListing:
        """Durables and external cursors read again (see `LocalSubscriptions.read`), with
        the acks heard since the last read."""
        self._metrics.position_read(self.vs.name)
        generation = self.machine.generation if self.machine is not None else 0
        listing = await self.subscriptions.read(
            self._handles.port, self._handles.cursors(), generation
        )
        self.observer.durables_receiving_markers(self.subscriptions.receiving_markers)
        if not self._acked:
            return listing
        heard, self._acked = self._acked, {}
        acked = {name: Acks(self._acked_ms[name], tuple(seqs)) for name, seqs in heard.items()}
        self._acked_ms.clear()
        return replace(listing, acked=acked)

    # ---- the loops ------------------------------------------------------------------------

    async def rebuild(self) -> None:
        clock = self._handles.clock
        started = clock()
        backlog, markers = await self.tails.replay()
        replayed = clock()
        listing = await self.read_positions()
        read = clock()
        self.tails.data_from(listing.last_seq)
        # Leadership reaches the machine through the job queue (`leadership`), never here:
        # `became_leader` twice with one epoch would reuse snapshot ids.
        self.machine, events = self._machine_factory.restore(
            self._config,
            markers,
            listing.subscriptions,
            listing.positions,
            listing.last_seq,
            self._handles.clock(),
            data=backlog.entries(),
        )
        for event in events:
            self.observer.event(event)
        self._needs = self.machine.needs()
        log.info(
            "stream_rebuilt",
            stream=self.vs.name,
            data=len(backlog),
            markers=len(markers),
            snapshots=len(self.machine.completed_snapshots()),
            subscriptions=len(self.machine.subscriptions()),
            # How long each stage took (bench/bench_startup.py sums them).
            replay_ms=replayed - started,
            positions_ms=read - replayed,
            restore_ms=clock() - read,
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
            read_back = await self._effects.carry_out(machine, output)
            if isinstance(output, SubscriptionAction):
                if read_back is None:
                    outputs.extend(machine.action_failed(output))
                else:
                    done = machine.action_done(
                        output,
                        read_back.mark_delete,
                        self._handles.clock(),
                        first_seq=read_back.first_seq,
                        lease_epoch=self._handles.lease_epoch(self.vs.name),
                    )
                    outputs.extend(done)

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
        seen = self.tails.seen()
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
        self.tails.stop()

    def _read_unqueued(self) -> None:
        """No interval loop runs this driver (yet): the read fails, asked for again later."""
        self.post(StreamMachine.read_failed)
