"""The sidecar's real runtime under deterministic simulation: the shell that ships.

Every sidecar replica runs the real `StreamDriver`, `IntervalLoop`, `Effects`,
`LocalSubscriptions` and `ShardLeases` with its membership (and through them the real
`sidecar.nats` code above the port), over `SimPort`
(`rsub_dev.sim.port`): a simulated JetStream on virtual time (looptime's event loop), every
request and reply delayed, sourcing between regions delayed. Applications publish in every
region and consume one replicated durable in its home region; at `failover_ms` the home
region is lost (its sidecar stopped, its sourcing cut) and the application continues in the
next region. Everything comes from one seed.

Checked as the run goes:
- moved only over consumed data: whenever a sidecar resets or creates the durable, every data
  message it moves the durable over was consumed (in any region, by its origin);
- reported: what a machine reports for the durable (`mark_delete`, the API's answer) is never
  beyond where the durable stands (its ack floor, extended over what it never delivers);
- no loss: at the end, every data message the durable passed in its home (the region failed
  over to) was consumed.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import NotFoundError

from rsub_dev.sim.outcome import LoopWorld, SimResult
from rsub_dev.sim.port import LoopClock, SimNet, SimPort
from rsub_dev.simjs import (
    ConsumerConfig,
    ConsumerInfo,
    Fault,
    Op,
    SimJetStream,
    SourceConfig,
    StreamConfig,
    SubjectTransform,
)
from sidecar.api.metrics import SidecarMetrics
from sidecar.config import NatsConfig
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.nats.consumers import REPLICATE_KEY
from sidecar.nats.cursors import CursorStore
from sidecar.nats.lease import LeaseState
from sidecar.nats.origin_log import data_entry
from sidecar.nats.port import ApiJson
from sidecar.nats.shards import Member, ShardLeases, shard_of
from sidecar.protocol import MachineConfig
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.intervals import IntervalLoop

STREAM = "orders"
_SHARDS = 4
DURABLE = "app"
_DEDUP_WINDOW_MS = 120_000


@dataclass(frozen=True, slots=True)
class ShellParams:
    regions: int = 2
    interval_ms: int = 200
    max_delay_ms: int = 5
    link_delay_ms: int = 30
    produce_gap_ms: int = 50
    consume_gap_ms: int = 40
    consume_batch: int = 5
    failover_ms: int = 6_000
    run_ms: int = 14_000
    lease_ttl_ms: int = 3_000
    replicas: int = 1
    """Sidecar replicas per region, sharing the streams' leadership (`ShardLeases`)."""
    crashes: bool = False
    """Sidecars crash and restart (rebuilt from their read stream, a new lease holder)
    before the failover."""
    partitions: bool = False
    """Regions other than the home are cut from the others for a while, then healed."""
    garbage: bool = False
    """Junk is published on the marker subjects: every sidecar reads it, rejects it (counted
    and logged) and goes on."""
    action_failures: float = 0.0
    """Of the requests that read, move or create a consumer: fail (an error, no reply, or
    done with the reply lost) while the home region is up."""

    @classmethod
    def draw(cls, rng: random.Random) -> ShellParams:
        return cls(
            regions=rng.randint(2, 3),
            interval_ms=rng.choice([100, 200, 500]),
            max_delay_ms=rng.choice([0, 2, 10, 40]),
            link_delay_ms=rng.choice([5, 30, 150]),
            produce_gap_ms=rng.choice([20, 50, 120]),
            consume_gap_ms=rng.choice([10, 40, 100]),
            consume_batch=rng.choice([1, 5, 20]),
            failover_ms=rng.choice([0, 3_000, 6_000]),
            action_failures=rng.choice([0.0, 0.0, 0.1, 0.3]),
            crashes=rng.random() < 0.5,
            partitions=rng.random() < 0.5,
            garbage=rng.random() < 0.3,
            replicas=rng.choice([1, 1, 2, 3]),
        )


ShellResult = SimResult[ShellParams]


@dataclass
class _Sidecar:
    """One sidecar replica of a region (the n-th; `starts` counts its restarts)."""

    region: str
    index: int
    port: CheckedPort
    driver: StreamDriver | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    starts: int = 0


class CheckedPort(SimPort):
    """The port a sidecar gets: the simulated one, its consumer moves checked."""

    def __init__(self, net: SimNet, world: ShellWorld, region: str) -> None:
        super().__init__(net)
        self._world = world
        self._region = region

    async def consumer_reset(
        self, stream: str, name: str, seq: int, *, timeout_s: float
    ) -> ApiJson:
        def land() -> ApiJson:
            # Checked as the reset lands, against the consumer as it is then.
            self._world.resetting(self._region, name, seq)
            return self._consumer_json(self._net.js.consumer_reset(stream, name, seq))

        reply = await self._net.call(land)
        self._world.moved(self._region, name, seq, "reset")
        return reply

    async def consumer_create(
        self, stream: str, name: str, config: Mapping[str, Any], action: str, *, timeout_s: float
    ) -> ApiJson:
        reply = await super().consumer_create(stream, name, config, action, timeout_s=timeout_s)
        if action == "create":
            self._world.moved(self._region, name, int(config.get("opt_start_seq", 1)), "create")
        return reply


class ShellWorld(LoopWorld[ShellParams]):
    def __init__(
        self,
        seed: int,
        params: ShellParams,
        driver_factory: Callable[..., StreamDriver] = StreamDriver,
        trace_len: int = 80,
    ) -> None:
        super().__init__(seed, params, trace_len)
        self.driver_factory = driver_factory
        self.vs = VirtualStream(STREAM, tuple(f"r{i}" for i in range(params.regions)))
        self.consumed: Counter[tuple[str, int]] = Counter()
        self._sidecars: list[_Sidecar] = []
        self._home = self.vs.regions[0]
        self._js: SimJetStream | None = None
        self._net: SimNet | None = None

    @property
    def js(self) -> SimJetStream:
        assert self._js is not None
        return self._js

    # ---- the checks ---------------------------------------------------------------------

    def moved(self, region: str, durable: str, start: int, how: str) -> None:
        """A sidecar moved or created `durable` in `region` to deliver from `start`: every
        data message below it, above where the durable had got, must have been consumed."""
        self.stats[f"{how}s"] += 1
        self.note(f"{region} {how} {durable} from {start}")
        read = self.vs.read_stream(region)
        stream = self.js.stream(read)
        reached = self._reached.get(region, 0)
        for msg in stream.matching(reached + 1, (self.vs.data_filter(),), start - 1):
            entry = data_entry(self.vs, msg.seq, msg.headers)
            if self.consumed[(entry.origin, entry.origin_seq)] == 0:
                raise self.fail(
                    f"moved over unconsumed data: {region} {how} {durable} from {start}, "
                    f"over {entry} never consumed"
                )
        self._reached[region] = max(reached, start - 1)

    def resetting(self, region: str, durable: str, start: int) -> None:
        """A reset of `durable` in `region` to deliver from `start` lands: it must not rewind
        what the consumer delivered (a client fetching meanwhile would be delivered it
        again, its acks unanswered), and must pass over at least one message it delivers
        (a reset over markers alone gains nothing and disturbs a consumer in use)."""
        read = self.vs.read_stream(region)
        info = self._consumer(region, durable)
        assert info is not None, "a reset of a durable that is not there cannot land"
        reached = max(info.delivered.stream_seq, info.ack_floor.stream_seq)
        if reached > start - 1:
            raise self.fail(
                f"rewound: {region} reset {durable} to {start}, it had delivered to {reached}"
            )
        over = self.js.stream(read).matching(reached + 1, (self.vs.data_filter(),), start - 1)
        if next(over, None) is None:
            raise self.fail(
                f"over markers alone: {region} reset {durable} from {reached} to {start}"
            )

    def _consumer(self, region: str, durable: str) -> ConsumerInfo | None:
        """The durable as the model holds it (no request: no fault, no delay)."""
        consumer = self.js.stream(self.vs.read_stream(region)).consumers.get(durable)
        return consumer.info(self.js.now_ms) if consumer is not None else None

    def _standing(self, region: str) -> int | None:
        """Where the durable stands in `region`: its ack floor extended over what it never
        delivers (markers), or the stream's end with nothing pending (None: absent)."""
        info = self._consumer(region, DURABLE)
        if info is None:
            return None
        stream = self.js.stream(self.vs.read_stream(region))
        floor = info.ack_floor.stream_seq
        after = next(stream.matching(floor + 1, (self.vs.data_filter(),)), None)
        return stream.last_seq if after is None else after.seq - 1

    def check_reported(self) -> None:
        """Every replica, leader or follower (the API answers from each)."""
        for sidecar in self._sidecars:
            machine = sidecar.driver.machine if sidecar.driver is not None else None
            view = machine.subscription(DURABLE) if machine is not None else None
            if view is None or not view.exists or view.mark_delete is None:
                continue
            standing = self._standing(sidecar.region)
            if standing is None or view.mark_delete > standing:
                raise self.fail(
                    f"reported: {sidecar.region}-{sidecar.index} reports {DURABLE} at "
                    f"{view.mark_delete}, it stands at {standing}"
                )

    # ---- the regions --------------------------------------------------------------------

    def _topology(self) -> None:
        vs, js = self.vs, self.js
        for r in vs.regions:
            js.stream_create(
                StreamConfig(
                    vs.write_stream(r), (vs.data_subject(r), vs.marker_subject(r)), placement=r
                )
            )
        for r in vs.regions:
            sources = tuple(
                SourceConfig(
                    vs.write_stream(o),
                    subject_transforms=(
                        SubjectTransform(vs.data_subject(o), vs.data_filter()),
                        SubjectTransform(vs.marker_subject(o), vs.marker_subject(o)),
                    ),
                )
                for o in vs.regions
            )
            js.stream_create(
                StreamConfig(
                    vs.read_stream(r),
                    (vs.snapshot_subject(r),),
                    duplicate_window_ms=_DEDUP_WINDOW_MS,
                    sources=sources,
                    placement=r,
                )
            )
            js.kv_bucket_create(f"rsub-{r}", placement=r)
            for o in vs.regions:
                delay = self.rng.randint(1, self.p.link_delay_ms)
                js.set_delay(vs.read_stream(r), vs.write_stream(o), delay)

    async def _start_sidecar(self, sidecar: _Sidecar) -> None:
        """One sidecar replica: the real driver, interval loop and shard leases (with the
        region's membership), wired as the runtime's root wires them for one stream."""
        loop = asyncio.get_running_loop()
        region = sidecar.region
        sidecar.starts += 1
        holder = f"{region}-{sidecar.index}-{sidecar.starts}"
        handles = _handles(region, sidecar.port, LoopClock(loop).now_ms)
        config = MachineConfig(region, STREAM, self.vs.regions, interval_ms=self.p.interval_ms)
        bucket_name = f"rsub-{region}"
        bucket = await sidecar.port.key_value(bucket_name)
        handles.cursor_store = CursorStore(bucket)
        driver = self.driver_factory(self.vs, config, handles, SidecarMetrics())
        sidecar.driver = driver
        await driver.rebuild()
        intervals = IntervalLoop(handles, self.p.interval_ms, sweep_intervals=30)
        ttl_s = self.p.lease_ttl_ms / 1000
        member = Member(bucket, sidecar.port, bucket_name, holder, ttl_s, _SHARDS, loop.time)
        stream_shard = shard_of(STREAM, _SHARDS)

        def changed(shard: int, state: LeaseState) -> None:
            if shard == stream_shard:
                self.note(f"{holder} leader={state.leader} epoch={state.epoch}")
                driver.leadership(state.leader, state.epoch)

        handles.leases = ShardLeases(member, on_change=changed)
        sidecar.tasks += [
            loop.create_task(driver.drive()),
            loop.create_task(driver.tails.markers()),
            loop.create_task(driver.tails.origins()),
            loop.create_task(intervals.run()),
            loop.create_task(intervals.follow_cursors(bucket_name)),
            loop.create_task(handles.leases.run()),
        ]
        await intervals.add(driver)

    async def _stop_sidecar(self, sidecar: _Sidecar) -> None:
        """A crash: its tasks end where they are (its leases expire on their own)."""
        for task in sidecar.tasks:
            task.cancel()
        await asyncio.gather(*sidecar.tasks, return_exceptions=True)
        sidecar.tasks.clear()

    # ---- applications -------------------------------------------------------------------

    async def _produce(self, region: str, until_ms: int) -> None:
        n = 0
        while self.now_ms() < until_ms:
            await asyncio.sleep(self.rng.randint(1, 2 * self.p.produce_gap_ms) / 1000)
            if region not in self._live:
                return
            n += 1
            subject = self.vs.publish_subject(region, "x")
            self.js.publish(subject, f"{region}-{n}".encode(), {"Nats-Msg-Id": f"{region}-{n}"})
            self.stats["published"] += 1

    def _create_durable(self, region: str) -> None:
        read = self.vs.read_stream(region)
        config = ConsumerConfig(DURABLE, (self.vs.data_filter(),), metadata={REPLICATE_KEY: "true"})
        self.js.consumer_create(read, config)
        assert self._net is not None
        self._net.signal(f"$JS.EVENT.ADVISORY.CONSUMER.CREATED.{read}.{DURABLE}")

    async def _consume(self, region: str, until_ms: int) -> None:
        """The application, consuming the durable in `region` while it is its home."""
        read = self.vs.read_stream(region)
        assert self._net is not None
        while self.now_ms() < until_ms and self._home == region:
            await asyncio.sleep(self.rng.randint(1, 2 * self.p.consume_gap_ms) / 1000)
            self.js.settle()
            try:
                deliveries = self.js.fetch(read, DURABLE, self.p.consume_batch)
            except NotFoundError:
                continue  # not created here yet
            for d in deliveries:
                entry = data_entry(self.vs, d.stream_seq, d.headers)
                key = (entry.origin, entry.origin_seq)
                if self.consumed[key]:
                    self.stats["duplicates"] += 1
                self.consumed[key] += 1
                self.js.ack(read, DURABLE, d.stream_seq)
                self._net.signal(f"$JS.ACK.{read}.{DURABLE}.1.{d.stream_seq}.{d.consumer_seq}")
            self.stats["consumed"] += len(deliveries)
            if deliveries:
                self.note(f"{region} consumed {len(deliveries)} to {deliveries[-1].stream_seq}")

    async def _failover(self) -> None:
        """The home region is lost: its sidecar stops, its sourcing is cut; the application
        continues in the next region."""
        lost, self._home = self._home, self.vs.regions[1]
        self.note(f"{lost} lost; {self._home} takes over")
        self._live.discard(lost)
        self.js.partition(lost)
        for sidecar in self._sidecars:
            if sidecar.region == lost:
                await self._stop_sidecar(sidecar)
        self.stats["failovers"] += 1

    async def _chaos(self, until_ms: int) -> None:
        """Until `until_ms`: sidecars crash and come back (rebuilt from their read stream,
        under a new lease holder), and regions other than the home are cut off and healed."""
        rng, p = self.rng, self.p
        while True:
            await asyncio.sleep(rng.randint(500, 3_000) / 1000)
            if self.now_ms() >= until_ms:
                return
            kinds = [
                k
                for k, on in (("crash", p.crashes), ("cut", p.partitions), ("junk", p.garbage))
                if on
            ]
            if not kinds:
                return
            kind = rng.choice(kinds)
            if kind == "junk":
                region = rng.choice(sorted(self._live))
                self.note(f"junk on {region}'s marker subject")
                self.stats["junk"] += 1
                self.js.publish(self.vs.marker_subject(region), rng.randbytes(rng.randint(0, 40)))
            elif kind == "crash":
                sidecar = rng.choice([s for s in self._sidecars if s.region in self._live])
                name = f"{sidecar.region}-{sidecar.index}"
                self.note(f"{name} crashes")
                self.stats["crashes"] += 1
                await self._stop_sidecar(sidecar)
                await asyncio.sleep(rng.randint(100, 2_000) / 1000)
                if sidecar.region in self._live:  # not lost meanwhile
                    self.note(f"{name} restarts")
                    await self._start_sidecar(sidecar)
            else:
                cut = rng.choice([r for r in sorted(self._live) if r != self._home] or [None])
                if cut is None:
                    continue
                self.note(f"{cut} cut off")
                self.stats["partitions"] += 1
                self.js.partition(cut)
                await asyncio.sleep(rng.randint(200, 3_000) / 1000)
                self.note(f"{cut} healed")
                self.js.partition(cut, cut=False)

    async def _checks(self) -> None:
        while True:
            await asyncio.sleep(self.p.interval_ms / 1000)
            self.js.settle()
            self.check_reported()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._js = SimJetStream(LoopClock(loop), rng=random.Random(self.seed ^ 0x5EA))
        self._net = SimNet(self._js, self.rng, self.p.max_delay_ms)
        self._reached: dict[str, int] = {}
        self._live = set(self.vs.regions)
        self._topology()
        self._create_durable(self._home)
        if self.p.action_failures:
            self.js.faults.fail_randomly(
                self.p.action_failures,
                [Fault.ERROR, Fault.TIMEOUT, Fault.REPLY_LOST],
                ops=[Op.CONSUMER_INFO, Op.CONSUMER_RESET, Op.CONSUMER_CREATE, Op.MSG_GET],
                targets=[self.vs.read_stream(r) for r in self.vs.regions],
            )
        tasks = [loop.create_task(self._net.run())]
        try:
            for name in self.vs.regions:
                for index in range(self.p.replicas):
                    port = CheckedPort(self._net, self, name)
                    self._sidecars.append(_Sidecar(name, index, port))
                    await self._start_sidecar(self._sidecars[-1])
            produce_until = self.p.run_ms - 4_000
            tasks += [loop.create_task(self._produce(r, produce_until)) for r in self.vs.regions]
            tasks.append(loop.create_task(self._checks()))
            chaos_until = self.p.failover_ms or self.p.run_ms - 5_000
            tasks.append(loop.create_task(self._chaos(chaos_until)))
            tasks.append(loop.create_task(self._consume(self._home, self.p.run_ms)))
            if self.p.failover_ms:
                if await self.until(self.p.failover_ms):
                    return
                await self._failover()
                tasks.append(loop.create_task(self._consume(self._home, self.p.run_ms)))
            if await self.until(self.p.run_ms):
                return
            self._check_no_loss()
        finally:
            for sidecar in self._sidecars:
                await self._stop_sidecar(sidecar)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _check_no_loss(self) -> None:
        """Every data message the durable has passed where it is consumed now was consumed
        (what lies after it, it delivers next)."""
        self.js.settle()
        info = self._consumer(self._home, DURABLE)
        if info is None:
            raise self.fail(f"loss: {DURABLE} is not there in {self._home}, its home now")
        read = self.vs.read_stream(self._home)
        passed = info.ack_floor.stream_seq
        for msg in self.js.stream(read).matching(1, (self.vs.data_filter(),), passed):
            entry = data_entry(self.vs, msg.seq, msg.headers)
            if not self.consumed[(entry.origin, entry.origin_seq)]:
                raise self.fail(f"loss: {entry} in {self._home} never consumed")


def _handles(region: str, port: SimPort, clock: Callable[[], int]) -> RegionHandles:
    """The region's handles over the simulated port (the runtime's root builds them over
    the connection): connected, as far as the runtime asks."""
    connection = NatsConnection(NatsConfig(servers=("nats://sim.invalid:4222",)), name=region)
    connection.connected = True
    return RegionHandles(region, connection, port, clock=clock)


def run_shell(seed: int, params: ShellParams | None = None, **kwargs: Any) -> ShellResult:
    if params is None:
        params = ShellParams.draw(random.Random(seed ^ 0x5E11))
    return ShellWorld(seed, params, **kwargs).run()
