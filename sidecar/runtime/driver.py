"""`StreamDriver`: one virtual stream's machine in this region, fed one input at a time.

The shape of etcd raft's `node.run()`: everything that happens to the stream becomes a job
on one queue (a tailed marker, the positions read every interval, a tick, a lease change,
an API write), and one loop (`drive`) applies each job to the machine, then hands every
output, in order, to `Effects` (actions: NATS writes) or to `StreamObserver` (events:
metrics and logs) before it takes the next job. The machine is therefore only ever touched
by that loop, and an API write that `submit`s a job returns once its outputs are carried out.

- `rebuild`: replay the markers stored in the read stream, read the subscriptions and their
  positions, and `StreamMachine.restore` a follower from them (DESIGN §5);
- `tail`: follow the read stream's markers live from where the replay ended;
- `tick`: every `snapshot.interval_ms`, read the positions again and tick the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import structlog
from nats.errors import Error as NatsError

from sidecar.api.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.marker_log import StoredMarker, replay_markers, tail_markers
from sidecar.protocol import (
    Action,
    MachineConfig,
    Marker,
    Output,
    Rejected,
    StreamMachine,
    check_writer,
    decode,
)
from sidecar.runtime.clock import now_ms
from sidecar.runtime.effects import Effects
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.positions import LocalSubscriptions

log = structlog.get_logger(__name__)

Input = Callable[[StreamMachine], list[Output]]
"""One input to the machine: calls one (or a few) of its input methods, returns the outputs."""

_TAIL_RETRY_S = 0.5


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
        self._handles = handles
        self._effects = Effects(vs, handles, self.subscriptions)
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._tail_seq = 0
        self._stopping = False

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

    async def read_positions(self) -> dict[str, int]:
        """Durables and external cursors read again (see `LocalSubscriptions.read`)."""
        return await self.subscriptions.read(self._handles.conn.nc, self._handles.cursors())

    def positions_input(self, positions: Mapping[str, int]) -> Input:
        """The machine's input for positions just read: the subscriptions, then positions."""
        infos, last_seq = self.subscriptions.infos(), self.subscriptions.last_seq

        def apply(machine: StreamMachine) -> list[Output]:
            return machine.subscriptions_changed(infos) + machine.positions_read(
                positions, last_seq
            )

        return apply

    # ---- the loops ------------------------------------------------------------------------

    async def rebuild(self) -> None:
        js, vs, region = self._handles.conn.js, self.vs, self._handles.region
        markers: list[tuple[int, Marker]] = []
        async for stored in replay_markers(js, vs.read_stream(region), vs.marker_filter()):
            decoded = self._decode(stored)
            if isinstance(decoded, Marker):
                markers.append((stored.seq, decoded))
            self._tail_seq = stored.seq
        positions = await self.read_positions()
        # Leadership reaches the machine through the job queue (`leadership`), never here:
        # `became_leader` twice with one epoch would reuse snapshot ids.
        self.machine = StreamMachine.restore(
            self._config,
            markers,
            self.subscriptions.infos(),
            positions,
            self.subscriptions.last_seq,
            now_ms(),
        )
        log.info(
            "stream_rebuilt",
            stream=vs.name,
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
            try:
                for output in job.apply(machine):
                    if isinstance(output, Action):
                        await self._effects.carry_out(machine, output)
                    else:
                        self.observer.event(output)
            except Exception:
                log.exception("stream_job_failed", stream=self.vs.name)
            finally:
                if job.done is not None and not job.done.done():
                    job.done.set_result(None)
            self.observer.machine_stepped(machine)
            async with self.changed:
                self.changed.notify_all()

    async def tail(self) -> None:
        vs, region = self.vs, self._handles.region
        while not self._stopping:
            try:
                tail = tail_markers(
                    self._handles.conn.js,
                    vs.read_stream(region),
                    vs.marker_filter(),
                    self._tail_seq + 1,
                )
                async with contextlib.aclosing(tail):
                    async for stored in tail:
                        self._tail_seq = stored.seq
                        self.post(_marker_input(stored.seq, self._decode(stored)))
                log.warning("marker_tail_ended", stream=vs.name, last_seq=self._tail_seq)
            except (TimeoutError, NatsError, OSError) as err:
                log.warning("marker_tail_failed", stream=vs.name, error=repr(err))
            await asyncio.sleep(_TAIL_RETRY_S)

    async def tick(self) -> None:
        interval_s = self._config.interval_ms / 1000
        while not self._stopping:
            await asyncio.sleep(interval_s)
            if self._handles.conn.connected:
                try:
                    self.post(self.positions_input(await self.read_positions()))
                except (TimeoutError, NatsError, OSError) as err:
                    log.warning("positions_read_failed", stream=self.vs.name, error=repr(err))
            self.post(partial(StreamMachine.tick, now_ms=now_ms()))

    def stop(self) -> None:
        """Let the loops end at their next turn (the root cancels them as well)."""
        self._stopping = True

    def _decode(self, stored: StoredMarker) -> Marker | Rejected:
        decoded = decode(stored.data, stream=self.vs.name, regions=self._config.regions)
        decoded = check_writer(decoded, stored.subject)
        self.observer.marker_read(stored.seq, decoded)
        return decoded


def _marker_input(seq: int, decoded: Marker | Rejected) -> Input:
    """The machine's input for one tailed marker, preceded by a tick with the time it was seen
    (the machine records the last tick's time: completions are stamped when they happen)."""
    seen_ms = now_ms()

    def apply(machine: StreamMachine) -> list[Output]:
        out = machine.tick(seen_ms)
        if isinstance(decoded, Marker):
            return out + machine.marker_seen(seq, decoded)
        return out + machine.marker_rejected(seq, decoded)

    return apply
