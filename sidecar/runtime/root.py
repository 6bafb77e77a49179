"""`Runtime`: the composition root of a sidecar's runtime (see the package docstring for the
use); `sidecar.api.service.Service` serves the API around it.

The root builds the region's handles and the stream drivers, and holds the API backend
(`backend`, a `RuntimeBackend` over the same handles and drivers) that answers the API's reads
and writes; its own part is the lifecycle: the bring-up, the streams discovery adds and
drops, the shards' leadership, the stop. For the programmatic use (tests, the demo, the
devtools) it answers the reads and writes they make by handing each to the backend, which
has the whole `SidecarBackend` (the servers are given the backend itself)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import structlog
from nats.errors import Error as NatsError

from sidecar.config.schema import Config
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection, NatsRefused
from sidecar.nats.cursors import CursorStore
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.regional_kv import open_regional_kv
from sidecar.nats.shards import Member, ShardLeases
from sidecar.nats.topology import TopologyError, apply_topology
from sidecar.protocol import MachineConfig
from sidecar.protocol.leases import LeaseState
from sidecar.protocol.shards import shard_of
from sidecar.runtime import views
from sidecar.runtime.backend import BringUpState, RuntimeBackend
from sidecar.runtime.discovery import StreamDiscovery
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.intervals import IntervalLoop

log = structlog.get_logger(__name__)

T = TypeVar("T")

_RETRY_START_S = 0.5
_RETRY_MAX_S = 10.0
_STOP_GRACE_S = 1.0
_CANCEL_ROUNDS = 5
# Streams whose topology check or rebuild is under way at once (bring-up and discovery). A
# rebuild is a chain of round trips (replays, positions read, signals); this many in flight
# keep the servers' JetStream API busy while each stream's requests still come one after
# the other, and stay far below nats-server's queue of pending API requests (it drops
# requests beyond 10,000), so a bring-up of thousands of streams never makes it shed any.
REBUILDS_IN_FLIGHT = 32
# Failures worth retrying: NATS trouble, or a topology conflict an operator has to fix.
_RETRIED = (NatsError, asyncio.TimeoutError, OSError, RuntimeError, TopologyError)


def default_holder() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def retrying(
    what: str, attempt: Callable[[], Awaitable[T]], stopping: Callable[[], bool]
) -> T:
    """Run `attempt` until it succeeds, with back-off, every failure logged; once `stopping`,
    no more (`CancelledError`)."""
    delay = _RETRY_START_S
    while not stopping():
        try:
            return await attempt()
        except _RETRIED as err:
            log.warning("retrying", what=what, error=repr(err), retry_in_s=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, _RETRY_MAX_S)
    raise asyncio.CancelledError


@dataclass
class StreamStarts:
    """How a replica starts its streams, one `start` each: the runtime's bring-up and the
    streams discovery takes up. (The simulation's shell world still wires its streams by
    itself: running it on this path moves the seeded runs, whose stories must be re-picked
    first.)"""

    handles: RegionHandles
    intervals: IntervalLoop
    spawn: Callable[[str, Coroutine[Any, Any, None], str], None]
    """Runs one of a stream's loops in a task the replica's stop ends (stream, loop, name)."""
    stopping: Callable[[], bool] = lambda: False
    """Whether the replica stops (then no more retries)."""
    rebuilds: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(REBUILDS_IN_FLIGHT)
    )
    """Held by a stream's rebuild and the subscription of its signals (and the root's
    topology checks)."""

    async def start(self, driver: StreamDriver) -> None:
        """Rebuild one stream's machine, then run its loops and subscribe its consumer
        signals (`REBUILDS_IN_FLIGHT` streams at once, each step retried until done); return
        once its tails follow the read stream: from then on it counts as rebuilt."""
        name, clock = driver.vs.name, self.handles.clock
        async with self.rebuilds:
            await retrying(f"rebuild {name}", driver.rebuild, self.stopping)
            self.spawn(name, driver.drive(), f"drive-{name}")
            self.spawn(name, driver.tails.markers(), f"tail-{name}")
            # The data tail runs with progress off too: new data is what starts a snapshot.
            self.spawn(name, driver.tails.origins(), f"index-{name}")
            subscribing = clock()
            add = partial(self.intervals.add, driver)
            await retrying(f"consumer signals {name}", add, self.stopping)
            signalled = clock()
        # Rebuilt once its tails follow the read stream (out of the rebuilds' slots: a tail
        # the server keeps refusing holds none while it keeps its stream rebuilding).
        await driver.tails.opened()
        log.info(
            "stream_running",
            stream=name,
            signals_ms=signalled - subscribing,
            tails_ms=clock() - signalled,
        )


def machine_config(config: Config, vs: VirtualStream) -> MachineConfig:
    return MachineConfig(
        region=config.region,
        stream=vs.name,
        regions=tuple(config.regions),
        interval_ms=config.snapshot.interval_ms,
        timeout_ms=round(config.snapshot.timeout_s * 1000),
        cache_size=config.snapshot.cache_size,
        progress=config.progress.enabled,
        progress_interval_ms=config.progress.interval_ms,
        hold_ms=round(config.failback.hold_s * 1000),
        lease_ttl_ms=round(config.lease.ttl_s * 1000),
    )


class Runtime:
    def __init__(
        self,
        config: Config,
        *,
        holder: str | None = None,
        apply_topology: bool = True,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.config = config
        self.region = config.region
        # This replica's name in the leases and the members (host-pid-suffix).
        self.holder = holder or default_holder()
        self.metrics = metrics or SidecarMetrics()
        conn = NatsConnection(
            config.nats,
            name=f"rsub-{config.region}-{self.holder}",
            on_change=self.metrics.set_nats_connected,
        )
        # The port follows the connection's client (it needs none before the bring-up).
        handles = RegionHandles(config.region, conn, NatsPort(conn))
        self._handles = handles
        # The streams it runs (discovery adds and drops some), shared with the backend.
        drivers = {
            vs.name: StreamDriver(vs, machine_config(config, vs), handles, self.metrics)
            for vs in config.virtual_streams
        }
        self._drivers = drivers
        self._state = BringUpState(topology_applied=not apply_topology)
        self.backend = RuntimeBackend(
            config.regions, handles, drivers, holder=self.holder, bring_up=self._state
        )
        self.metrics.track_readiness(lambda: self.backend.readiness.ready)
        self._apply_topology = apply_topology
        # The streams of each shard; per stream, (leads, epoch) as last handed to its driver.
        self._shard_streams: dict[int, list[StreamDriver]] = {}
        for driver in drivers.values():
            self._shard_of(driver).append(driver)
        self._leadership: dict[str, tuple[bool, int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Per stream, the tasks that run it (what stopping that one stream cancels).
        self._stream_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.metrics.set_streams("listed", len(drivers))
        # The interval of every stream (snapshots started, positions read when they may have
        # moved); a stream joins it once rebuilt (`_start_stream`).
        self._intervals = IntervalLoop(
            self._handles,
            config.snapshot.interval_ms,
            config.snapshot.sweep_intervals,
            tick_ms=config.progress.interval_ms,
        )
        self._discovery = (
            StreamDiscovery(
                config, handles.port, self.metrics, add=self._add_stream, drop=self._drop_stream
            )
            if config.discovery.enabled
            else None
        )
        self._starts = StreamStarts(
            handles, self._intervals, self._spawn_loop, lambda: self._stopping
        )
        self._stopping = False
        self._ready = asyncio.Event()
        self._failed = asyncio.Event()
        self.failure: NatsRefused | None = None

    # ---- the API's reads and writes: the backend's ----------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.backend.is_leader

    @property
    def readiness(self) -> views.Readiness:
        return self.backend.readiness

    def leadership(self, stream: str) -> LeaseState:
        return self.backend.leadership(stream)

    async def status(self) -> views.StatusView:
        return await self.backend.status()

    async def get_subscription(self, stream: str, subscription: str) -> views.SubscriptionView:
        return await self.backend.get_subscription(stream, subscription)

    async def list_subscriptions(self, stream: str) -> Sequence[views.SubscriptionView]:
        return await self.backend.list_subscriptions(stream)

    async def list_snapshots(self, stream: str) -> Sequence[views.SnapshotView]:
        return await self.backend.list_snapshots(stream)

    def watch_subscription(
        self, stream: str, subscription: str
    ) -> AsyncGenerator[views.SubscriptionView, None]:
        return self.backend.watch_subscription(stream, subscription)

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        return await self.backend.commit_cursor(stream, subscription, sequence)

    async def trigger_snapshot(self, stream: str) -> str:
        return await self.backend.trigger_snapshot(stream)

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> views.SubscriptionView:
        return await self.backend.set_replicated(stream, subscription, replicated)

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Bring everything up in the background."""
        self._spawn(self._bring_up(), "bring-up")
        log.info("runtime_started", region=self.region, holder=self.holder)

    async def wait_ready(self, timeout_s: float | None) -> None:
        """Wait until connected, the topology applied and every stream rebuilt and tailing
        (with discovery on: also those found by the first round, which is done by then);
        `timeout_s` None waits as long as it takes.

        Raises the `NatsRefused` error as soon as NATS refuses the first connection.
        """
        async with asyncio.timeout(timeout_s):
            ready = asyncio.create_task(self._ready.wait())
            failed = asyncio.create_task(self._failed.wait())
            try:
                await asyncio.wait({ready, failed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                failed.cancel()
        if self.failure is not None and not self._ready.is_set():
            raise self.failure

    async def wait_failed(self) -> NatsRefused:
        """Wait until the bring-up gives up for good (NATS refused the first connection)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    async def stop(self) -> None:
        """Stop the tasks, give the shards up, flush and close (idempotent)."""
        self._stopping = True
        for driver in self._drivers.values():
            driver.stop()
        await self._cancel_tasks()
        handles = self._handles
        if handles.leases is not None and handles.conn.connected:
            await handles.leases.release()
        handles.leases = None
        await handles.conn.close()
        log.info("runtime_stopped", region=self.region, holder=self.holder)

    async def _cancel_tasks(self) -> None:
        # Cancel again while tasks remain: a cancellation racing a finished inner future can
        # be swallowed on Python 3.11 (`asyncio.wait_for`), and loops also watch a stop flag.
        pending = {t for t in self._tasks if not t.done()}
        for _ in range(_CANCEL_ROUNDS):
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_STOP_GRACE_S)
        if pending:
            log.error("tasks_not_stopping", tasks=sorted(t.get_name() for t in pending))
        self._tasks.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run `coro` in a task the stop cancels; a failure is logged (`task_failed`). The
        task runs `coro` itself: a wrapper cancelled before its first step never awaited
        it ("coroutine ... was never awaited" at a stop right after a stream's start)."""

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and (error := task.exception()) is not None:
                log.error("task_failed", task=name, exc_info=error)

        task = asyncio.create_task(coro, name=f"rsub-{name}")
        task.add_done_callback(ended)
        self._tasks.append(task)
        return task

    async def _retry(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` until it succeeds or the runtime stops (`retrying`)."""
        return await retrying(what, attempt, lambda: self._stopping)

    # ---- bring-up -----------------------------------------------------------------------

    async def _bring_up(self) -> None:
        """Connect, apply the topology, open the lease bucket, rebuild and run every stream.

        Every replica rebuilds and runs every stream's machine (as a follower where it does not
        lead): any replica answers reads, and taking a stream over needs no rebuild."""
        conn = self._handles.conn
        try:
            await conn.connect()
        except NatsRefused as err:
            log.error("nats_refused", region=self.region, error=str(err))
            self.failure = err
            self._failed.set()
            return
        if self._apply_topology:
            await asyncio.gather(*(self._topology(d.vs) for d in list(self._drivers.values())))
            self._state.topology_applied = True
        bucket = f"{self.config.lease.bucket}-{self.region}"
        kv = await self._retry(
            f"kv bucket {bucket}",
            lambda: open_regional_kv(
                self._handles.port,
                bucket,
                self.config.cluster_for(self.region),
                replicas=self.config.lease.replicas,
            ),
        )
        # The same bucket keeps the leases (`leader`, `shards.<i>`), the members
        # (`members.<holder>`) and the cursors (`cursors.<V>`).
        self._handles.cursor_store = CursorStore(kv)
        lease = self.config.lease
        member = Member(kv, self._handles.port, bucket, self.holder, lease.ttl_s, lease.shards)
        leases = ShardLeases(member, on_change=self._on_shard)
        self._handles.leases = leases
        self._spawn(leases.run(), "leases")
        self._spawn(self._intervals.follow_cursors(bucket), "cursor-signals")
        # Every stream starts in a task of its own, `REBUILDS_IN_FLIGHT` rebuilding at once;
        # each serves the API as soon as it runs (`BringUpState.running`).
        started = list(self._drivers.values())
        starts = [self._spawn_start(driver) for driver in started]
        if self._discovery is not None:
            # Ready once the first round's streams are rebuilt too (docs/api.md, /readyz).
            await self._retry("stream discovery", self._discovery.round)
            found = [self._drivers[name] for name in self._discovery.running]
            started += found
            # Each stream's first task is its start (`_spawn_start`); its loops come later.
            starts += [self._stream_tasks[d.vs.name][0] for d in found]
            self._spawn(self._discovery.run(), "discovery")
        if starts:
            await asyncio.wait(starts)
        self._spawn(self._intervals.run(), "intervals")
        running, kept = self._state.running, self._drivers  # discovery may have dropped some
        failed = [d.vs.name for d in started if d.vs.name in kept and d.vs.name not in running]
        if failed:  # a start that crashed (logged `task_failed`): unready, as it stays
            log.error("streams_not_started", region=self.region, streams=failed)
            return
        self._state.streams_rebuilt = True
        self._ready.set()
        log.info("runtime_ready", region=self.region, streams=len(started))
        leases.open_claims()  # only now that its streams run does it take shards

    def _spawn_start(self, driver: StreamDriver) -> asyncio.Task[None]:
        """Start `driver` in a task of its own (stopping the stream cancels it)."""
        name = driver.vs.name
        start = self._spawn(self._start_stream(driver), f"start-{name}")
        self._stream_tasks.setdefault(name, []).append(start)
        return start

    async def _start_stream(self, driver: StreamDriver) -> None:
        """Start one stream (`StreamStarts.start`: bring-up, and each stream discovery takes
        up); once it runs, it serves the API."""
        await self._starts.start(driver)
        self._state.running.add(driver.vs.name)
        self.metrics.set_streams_rebuilt(len(self._state.running))

    def _spawn_loop(self, stream: str, loop: Coroutine[Any, Any, None], name: str) -> None:
        """Run one of `stream`'s loops in a task of its own (stopping the stream cancels it)."""
        self._stream_tasks.setdefault(stream, []).append(self._spawn(loop, name))

    def _add_stream(self, vs: VirtualStream) -> None:
        """Take up a stream discovery found: its driver joins the API and its shard (with the
        shard's leadership as it stands), and is started in a task of its own."""
        if self._stopping:
            return
        driver = StreamDriver(vs, machine_config(self.config, vs), self._handles, self.metrics)
        self._drivers[vs.name] = driver
        self._shard_of(driver).append(driver)
        leases = self._handles.leases
        if leases is not None:
            shard = shard_of(vs.name, self.config.lease.shards)
            self._hand_leadership(driver, shard, leases.lease(shard).state)
        self._spawn_start(driver)

    async def _drop_stream(self, name: str) -> None:
        """Stop a discovered stream whose read stream is gone, and forget it."""
        driver = self._drivers.pop(name)
        driver.stop()
        await self._intervals.remove(driver)
        self._shard_of(driver).remove(driver)
        self._leadership.pop(name, None)
        self._state.running.discard(name)
        self.metrics.set_streams_rebuilt(len(self._state.running))
        tasks = self._stream_tasks.pop(name, [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._tasks = [t for t in self._tasks if not t.done()]
        self.metrics.stream_dropped(name)
        async with driver.changed:  # watchers of its subscriptions end (NotFound)
            driver.changed.notify_all()

    def _shard_of(self, driver: StreamDriver) -> list[StreamDriver]:
        """The streams of `driver`'s shard (the list it is, or is to be, in)."""
        shard = shard_of(driver.vs.name, self.config.lease.shards)
        return self._shard_streams.setdefault(shard, [])

    async def _topology(self, vs: VirtualStream) -> None:
        """Apply `vs`'s topology (retried until it is), `REBUILDS_IN_FLIGHT` at once."""
        async with self._starts.rebuilds:
            await self._retry(f"topology {vs.name}", partial(self._apply_stream_topology, vs))

    async def _apply_stream_topology(self, vs: VirtualStream) -> None:
        report = await apply_topology(
            self._handles.port,
            vs,
            cluster_for_region=self.config.cluster_for,
            replicas=self.config.stream(vs.name).replicas,
        )
        # Per stream the details went out as `topology.stream_applied`; here the counts.
        actions = Counter(s.action for s in report.streams)
        log.info(
            "topology_applied",
            stream=vs.name,
            created=actions["created"],
            updated=actions["updated"],
            unchanged=actions["unchanged"],
        )

    def _on_shard(self, shard: int, state: LeaseState) -> None:
        """A shard's lease changed: each of its streams' machines learns it in turn."""
        for driver in self._shard_streams.get(shard, []):
            self._hand_leadership(driver, shard, state)

    def _hand_leadership(self, driver: StreamDriver, shard: int, state: LeaseState) -> None:
        name = driver.vs.name
        # A follower shows the leader's epoch: every replica reports the same one.
        self.metrics.set_leader(name, state.leader, state.leader_epoch)
        leadership = (state.leader, state.epoch)
        if leadership == self._leadership.get(name, (False, 0)):
            return
        self._leadership[name] = leadership
        log.info(
            "leadership_changed",
            stream=name,
            shard=shard,
            leader=state.leader,
            epoch=state.epoch,
            holder=state.holder,
        )
        driver.leadership(state.leader, state.epoch)
