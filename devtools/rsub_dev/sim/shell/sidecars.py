"""A sidecar replica of the runtime's world: the real driver, interval loop and shard leases
of one region, over a port to the simulated JetStream whose consumer moves are checked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.port import LoopClock, ProcessNet, SimPort
from rsub_dev.sim.shell.checks import Checks, Replica, checked
from rsub_dev.sim.shell.params import SHARDS, STREAM, ShellParams
from sidecar.config.nats import NatsConfig
from sidecar.config.schema import (
    Config,
    FailbackConfig,
    LeaseConfig,
    SnapshotConfig,
    StreamConfig,
)
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.nats.cursors import CursorStore
from sidecar.nats.lease import LeaseState
from sidecar.nats.port import ApiJson, Published
from sidecar.nats.shards import Member, ShardLeases, shard_of
from sidecar.protocol import MachineConfig, Marker, Snapshot, StreamMachine, Update, decode
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.intervals import IntervalLoop
from sidecar.runtime.root import machine_config

_NATS = NatsConfig(servers=("nats://sim.invalid:4222",))
"""Where the runtime would connect: nowhere, its port is simulated."""


class CheckedPort(SimPort):
    """The port a sidecar gets: the simulated one, its consumer moves checked."""

    def __init__(self, net: ProcessNet, checks: Checks, region: str) -> None:
        super().__init__(net)
        self.net = net
        self.checks = checks
        self._region = region
        self.replica: Replica | None = None
        """The running incarnation's checks (`Sidecar.start`)."""
        self.machine: Callable[[], StreamMachine | None] = lambda: None
        """The running incarnation's machine (`Sidecar.start`)."""
        self._resets_out = 0
        self._no_reset_out = asyncio.Event()
        self._no_reset_out.set()

    async def publish(self, stream: str, subject: str, data: bytes, msg_id: str) -> Published:
        """A marker, checked as it goes out (fencing) and as it lands: a completed snapshot
        (safety), an update's progress vector (claim 1)."""
        checks, js = self.checks, self._net.js
        decoded = decode(data, stream=STREAM, regions=checks.regions)
        if isinstance(decoded, Marker) and self.replica is not None:
            self.replica.fencing.publishing(decoded)

        def land() -> Published:
            if isinstance(decoded, Marker):
                body = decoded.body
                if isinstance(body, Snapshot):
                    checks.snapshot(decoded.region, body)
                elif isinstance(body, Update):
                    checks.vector(decoded.region, body)
            headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Stream": stream}
            ack = js.publish(subject, data, headers)
            return Published(ack.seq, ack.duplicate)

        return await self._net.call(land)

    def _moving(self, what: str) -> None:
        machine = self.machine()
        if self.replica is not None and machine is not None:
            self.replica.fencing.moving(machine.epoch, what)
            self.checks.note(f"{self.replica.name} {what} (sent)")

    async def consumer_reset(
        self, stream: str, name: str, seq: int, *, timeout_s: float
    ) -> ApiJson:
        self._moving(f"resets {name} to {seq}")

        def land() -> ApiJson:
            # Checked as the reset lands, against the consumer as it is then.
            self.checks.resetting(self._region, name, seq)
            return self._consumer_json(self._net.js.consumer_reset(stream, name, seq))

        self._resets_out += 1
        self._no_reset_out.clear()
        try:
            reply = await self._net.call(land)
        finally:
            self._resets_out -= 1
            if not self._resets_out:
                self._no_reset_out.set()
        self.checks.moved(self._region, name, seq, "reset")
        return reply

    async def no_reset_out(self) -> None:
        """Until no consumer reset it sent is still on its way (returns without yielding
        once none is, so its caller acts before another can go out)."""
        while self._resets_out:
            await self._no_reset_out.wait()

    async def consumer_list(self, stream: str, offset: int, *, timeout_s: float) -> ApiJson:
        """A listing of the consumers, noting how current it is as it lands (`Replica`)."""
        replica, changes = self.replica, self.checks.user_changes[self._region]
        reply = await super().consumer_list(stream, offset, timeout_s=timeout_s)
        if replica is not None:
            replica.listed = changes
        return reply

    async def consumer_create(
        self, stream: str, name: str, config: Mapping[str, Any], action: str, *, timeout_s: float
    ) -> ApiJson:
        if action != "create":
            return await super().consumer_create(stream, name, config, action, timeout_s=timeout_s)
        self._moving(f"creates {name} from {config.get('opt_start_seq', 1)}")
        start = int(config.get("opt_start_seq", 1))
        there = self.checks.consumer(self._region, name) is not None
        try:
            return await super().consumer_create(stream, name, config, action, timeout_s=timeout_s)
        finally:
            # Checked once created, its reply lost or not.
            if not there and self.checks.consumer(self._region, name) is not None:
                self.checks.moved(self._region, name, start, "create")


@dataclass
class SimSidecar:
    """One sidecar replica of a region (the n-th; `starts` counts its restarts) running the
    runtime's parts over the simulated port (`run`)."""

    region: str
    index: int
    port: SimPort
    drivers: dict[str, StreamDriver] = field(default_factory=dict)
    """The running incarnation's streams (`run`), by name."""
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    starts: int = 0
    intervals: IntervalLoop | None = None
    """The running incarnation's interval loop (`run`)."""

    @property
    def name(self) -> str:
        return f"{self.region}-{self.index}"

    @property
    def holder(self) -> str:
        """The running incarnation's name in the leases and the members."""
        return f"{self.name}-{self.starts}"

    async def run(
        self,
        streams: Sequence[VirtualStream],
        config: Config,
        make: Callable[[VirtualStream, MachineConfig, RegionHandles], StreamDriver],
        note: Callable[[str], None],
    ) -> None:
        """A new incarnation running `streams` with the runtime's parts, wired as the
        runtime's root wires them: a driver per stream (`make`, with its `MachineConfig` from
        `machine_config`), each rebuilt; one `IntervalLoop` for all, one `ShardLeases` with
        the region's membership handing each shard's leadership to its streams (each change
        `note`d); the drivers' loops and tails. `config` gives the settings (`settings`)."""
        loop = asyncio.get_running_loop()
        region = self.region
        self.starts += 1
        holder = self.holder
        handles = _handles(region, self.port, LoopClock(loop).now_ms)
        bucket_name = f"{config.lease.bucket}-{region}"
        bucket = await self.port.key_value(bucket_name)
        handles.cursor_store = CursorStore(bucket)
        shards = config.lease.shards
        by_shard: dict[int, list[StreamDriver]] = {}
        self.drivers = {}
        for vs in streams:
            driver = make(vs, machine_config(config, vs), handles)
            self.drivers[vs.name] = driver
            by_shard.setdefault(shard_of(vs.name, shards), []).append(driver)
            await driver.rebuild()
        snapshot = config.snapshot
        intervals = self.intervals = IntervalLoop(
            handles,
            snapshot.interval_ms,
            snapshot.sweep_intervals,
            tick_ms=config.progress.interval_ms,
        )
        member = Member(
            bucket, self.port, bucket_name, holder, config.lease.ttl_s, shards, loop.time
        )

        def changed(shard: int, state: LeaseState) -> None:
            drivers = by_shard.get(shard, [])
            if drivers:
                note(f"{holder} leader={state.leader} epoch={state.epoch}")
            for driver in drivers:
                driver.leadership(state.leader, state.epoch)

        handles.leases = ShardLeases(member, on_change=changed)
        handles.leases.open_claims()  # every stream is rebuilt (above), as the root does
        for driver in self.drivers.values():
            self.tasks += [
                loop.create_task(driver.drive()),
                loop.create_task(driver.tails.markers()),
                loop.create_task(driver.tails.origins()),
            ]
        self.tasks += [
            loop.create_task(intervals.run()),
            loop.create_task(intervals.follow_cursors(bucket_name)),
            loop.create_task(handles.leases.run()),
        ]
        for driver in self.drivers.values():
            await intervals.add(driver)

    async def stop(self) -> None:
        """A crash: its tasks end where they are (its leases expire on their own)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


@dataclass
class Sidecar(SimSidecar):
    """A sidecar replica of the runtime's world: its one stream (`start`), its consumer
    moves checked (`CheckedPort`), its process frozen at times (`freeze`)."""

    port: CheckedPort

    @property
    def driver(self) -> StreamDriver | None:
        """The driver of the runtime's world's one stream (`STREAM`)."""
        return self.drivers.get(STREAM)

    async def start(
        self,
        vs: VirtualStream,
        p: ShellParams,
        driver_factory: Callable[..., StreamDriver],
        machine_factory: type[StreamMachine],
        world: LoopWorld[ShellParams],
    ) -> None:
        """The runtime's world's one stream (`run`), its consumer moves checked by this
        incarnation's `Replica` and its machine checked as it goes (`checked`)."""
        port = self.port

        def make(vs: VirtualStream, config: MachineConfig, handles: RegionHandles) -> StreamDriver:
            port.replica = replica = Replica(world, port.checks, self.holder, self.region)
            driver = driver_factory(vs, config, handles, metrics, checked(machine_factory, replica))
            port.machine = lambda: driver.machine
            return driver

        metrics = SidecarMetrics()
        await self.run([vs], settings(p, self.region, vs.regions), make, world.note)

    async def stop(self) -> None:
        await super().stop()
        self.port.net.awake.set()  # it starts again awake

    async def freeze(self, ms: int) -> None:
        """A pause of the whole process (`ProcessNet`) for `ms`: it keeps its state and wakes
        with it, its lease possibly lost and taken over meanwhile (a zombie until it learns)."""
        self.port.net.awake.clear()
        try:
            await asyncio.sleep(ms / 1000)
        finally:
            # Also when the freeze is cut short (the healed end cancels the chaos): left
            # frozen, its stop would wait for its requests forever (soak seed 108632163667).
            self.port.net.awake.set()


def settings(p: ShellParams, region: str, regions: tuple[str, ...]) -> Config:
    """The sidecar's settings in a run with parameters `p` (what `machine_config` and the
    wiring read; the streams are given to `Sidecar.run`): the runtime's world's shards
    (`SHARDS`), its lease bucket `rsub-<region>`, the sweep every 30 snapshot intervals."""
    return Config(
        region=region,
        regions=regions,
        nats=_NATS,
        streams=(StreamConfig(STREAM),),
        snapshot=SnapshotConfig(
            interval_ms=p.interval_ms, timeout_s=p.timeout_ms / 1000, sweep_intervals=30
        ),
        failback=FailbackConfig(hold_s=p.hold_ms / 1000),
        lease=LeaseConfig(bucket="rsub", ttl_s=p.lease_ttl_ms / 1000, shards=SHARDS),
    )


def _handles(region: str, port: SimPort, clock: Callable[[], int]) -> RegionHandles:
    """The region's handles over the simulated port (the runtime's root builds them over
    the connection): connected, as far as the runtime asks."""
    connection = NatsConnection(_NATS, name=region)
    connection.connected = True
    return RegionHandles(region, connection, port, clock=clock)
