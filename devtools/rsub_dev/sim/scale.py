"""Many streams under simulation: the sidecar's real runtime (`shell.sidecars.Sidecar.run`,
wired as the runtime's root wires it) running thousands of virtual streams over the
simulated JetStream, on virtual time, for what its cost per stream is
(`bench/bench_sim_streams.py`).

Each virtual stream has its write and read streams in every region, made by the product's
own `apply_topology` over the port, and `durables` replicated durables in the first region,
never consumed (as `bench/bench_sidecar_footprint.py` has them on real servers). Every
region runs `replicas` sidecar replicas with the sidecar's default settings (1 s interval,
32 shards, 10 s leases). `publish` is the bench's producer. Nothing is checked: the shell's
world (`shell.world`) does that for one stream.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import looptime

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.port import LoopClock, SimNet, SimPort
from rsub_dev.sim.shell.sidecars import SimSidecar
from rsub_dev.simjs import ConsumerConfig, SimJetStream
from sidecar.config.nats import NatsConfig
from sidecar.config.schema import Config, StreamConfig
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.consumers import REPLICATE_KEY
from sidecar.nats.topology import apply_topology
from sidecar.protocol import MachineConfig
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles


@dataclass(frozen=True, slots=True)
class ScaleParams:
    streams: int
    regions: int = 2
    replicas: int = 1
    """Sidecar replicas per region."""
    durables: int = 10
    """Replicated durables per stream, in the first region."""
    max_delay_ms: int = 2
    """Each request's and reply's delay, drawn up to this."""
    link_delay_ms: int = 10
    """Sourcing's delay on every link."""


class StreamNet(SimNet):
    """The shared `SimNet` whose live reads wake only when their own stream stored a message
    (`SimNet`'s wake on any change: every tail of every stream at every request)."""

    def __init__(self, js: SimJetStream, rng: random.Random, max_delay_ms: int) -> None:
        super().__init__(js, rng, max_delay_ms)
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        js.on_stored = self._woken

    def _woken(self, stream: str) -> None:
        for waiter in self._waiting.pop(stream, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def stored(self, stream: str) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(stream, []).append(waiter)
        await waiter


class ScaleWorld(LoopWorld[ScaleParams]):
    """`params.streams` virtual streams, their sidecars brought up (each stream rebuilt),
    then `phases` (the bench's windows) run on the same virtual time."""

    def __init__(
        self,
        seed: int,
        params: ScaleParams,
        phases: Callable[[ScaleWorld], Awaitable[None]],
    ) -> None:
        super().__init__(seed, params, trace_len=100)
        self.phases = phases
        regions = tuple(f"r{i}" for i in range(params.regions))
        self.streams = [VirtualStream(f"s{i}", regions) for i in range(params.streams)]
        self.sidecars: list[SimSidecar] = []
        self.metrics: dict[str, SidecarMetrics] = {}
        """Each sidecar's, by its name."""
        self._js: SimJetStream | None = None

    @property
    def js(self) -> SimJetStream:
        assert self._js is not None
        return self._js

    def config(self, region: str) -> Config:
        """A sidecar's settings: the defaults, with every stream of the run."""
        return Config(
            region=region,
            regions=self.streams[0].regions,
            nats=NatsConfig(servers=("nats://sim.invalid:4222",)),
            streams=tuple(StreamConfig(vs.name) for vs in self.streams),
        )

    def publish(self, region: str, streams: list[VirtualStream]) -> None:
        """One data message in each of `streams`, published in `region` (the bench's
        producer: a client of the servers, not of a sidecar)."""
        for vs in streams:
            self.js.publish(vs.publish_subject(region, "x"), b"x" * 16)

    def snapshots_completed(self) -> int:
        """Snapshots completed so far, every sidecar's (`rsub_snapshots_completed_total`)."""
        return round(
            sum(
                sample.value
                for metrics in self.metrics.values()
                for metric in metrics.registry.collect()
                if metric.name == "rsub_snapshots_completed"
                for sample in metric.samples
                if sample.name == "rsub_snapshots_completed_total"
            )
        )

    def run_quiet(self) -> None:
        """`run`, without capturing the logs: the product logs as configured
        (`sidecar.logs.configure_logging`), so that its cost is the cost of its logs too."""
        loop = looptime.new_event_loop(start=0)
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        loop, p = asyncio.get_running_loop(), self.p
        self._js = js = SimJetStream(LoopClock(loop))
        net = StreamNet(js, self.rng, p.max_delay_ms)
        tasks = [loop.create_task(net.run())]
        port = SimPort(net)
        regions = self.streams[0].regions
        for vs in self.streams:
            await apply_topology(port, vs, replicas=1)
            for target in regions:
                for origin in regions:
                    js.set_delay(vs.read_stream(target), vs.write_stream(origin), p.link_delay_ms)
            read = vs.read_stream(regions[0])
            for i in range(p.durables):
                js.consumer_create(
                    read,
                    ConsumerConfig(f"d{i}", (vs.data_filter(),), metadata={REPLICATE_KEY: "true"}),
                )
        for region in regions:
            config = self.config(region)
            js.kv_bucket_create(f"{config.lease.bucket}-{region}", placement=region)
            for index in range(p.replicas):
                sidecar = SimSidecar(region, index, SimPort(net))
                metrics = self.metrics[sidecar.name] = SidecarMetrics()

                def make(
                    vs: VirtualStream,
                    machine: MachineConfig,
                    handles: RegionHandles,
                    metrics: SidecarMetrics = metrics,
                ) -> StreamDriver:
                    return StreamDriver(vs, machine, handles, metrics)

                self.sidecars.append(sidecar)
                await sidecar.run(self.streams, config, make, self.note)
        try:
            await self.phases(self)
        finally:
            for sidecar in self.sidecars:
                await sidecar.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
