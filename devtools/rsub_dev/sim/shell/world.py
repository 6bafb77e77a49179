"""The sidecar's real runtime under deterministic simulation: the shell that ships.

Every sidecar replica runs the real `StreamDriver`, `IntervalLoop`, `Effects`,
`LocalSubscriptions` and `ShardLeases` with its membership (and through them the real
`sidecar.nats` code above the port), over `SimPort`
(`rsub_dev.sim.port`): a simulated JetStream on virtual time (looptime's event loop), every
request and reply delayed, sourcing between regions delayed. Applications publish in every
region and consume each replicated durable (`durables`: one to three, homes spread over the
regions) in its home region, whose users reset and delete it; sidecars crash, freeze, lag;
regions are cut off, or one is out for long (`_outage`); at `failover_ms` the first
durable's home region is lost (its sidecars stopped, its sourcing cut) and each durable
homed there continues in another live region, or one durable's application moves away and
back with every region up (`moves`). Streams have limits and are purged, producers publish twins (`limits`); the end
may be healed (`healing`). Everything comes from one seed.

Checked as the run goes (docs/simulation.md lists them): moved only over consumed data (or
excused: `limits.Excuses`), never rewound nor over markers alone, reported, snapshot safety,
claim 1, fencing, retried and applied (`checks`, each replica's `checks.Replica`), covered
means consumed and not data (`coverage`), vector liveness from an outage on
(`_vector_liveness`); no loss at the end, liveness once healed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from rsub_dev.sim.outcome import LoopWorld, SimResult, Violation
from rsub_dev.sim.port import LoopClock, ProcessNet, SimNet
from rsub_dev.sim.shell.applications import Applications
from rsub_dev.sim.shell.checks import Checks
from rsub_dev.sim.shell.durables import Durable
from rsub_dev.sim.shell.failback import Failback
from rsub_dev.sim.shell.healing import healed_end
from rsub_dev.sim.shell.limits import Excuses, stream_limits
from rsub_dev.sim.shell.moves import application_moves
from rsub_dev.sim.shell.params import DEDUP_WINDOW_MS, STREAM, ShellParams
from rsub_dev.sim.shell.sidecars import CheckedPort, Sidecar
from rsub_dev.simjs import (
    Fault,
    Op,
    SimJetStream,
    SourceConfig,
    StreamConfig,
    SubjectTransform,
)
from sidecar.naming import VirtualStream
from sidecar.protocol import Marker, StreamMachine, Update, decode
from sidecar.runtime.driver import StreamDriver

ShellResult = SimResult[ShellParams]


class ShellWorld(LoopWorld[ShellParams]):
    def __init__(
        self,
        seed: int,
        params: ShellParams,
        driver_factory: Callable[..., StreamDriver] = StreamDriver,
        machine_factory: type[StreamMachine] = StreamMachine,
        trace_len: int = 80,
        excuses: type[Excuses] = Excuses,
    ) -> None:
        super().__init__(seed, params, trace_len)
        self.excuses = excuses
        """What the checks excuse (a broken one, in the checker's own tests)."""
        self.driver_factory = driver_factory
        self.failback = Failback(self)
        self.machine_factory = self.failback.observed(machine_factory)
        self.vs = VirtualStream(STREAM, tuple(f"r{i}" for i in range(params.regions)))
        self._sidecars: list[Sidecar] = []
        self._live = set(self.vs.regions)
        self._out: set[str] = set()
        """A region in an outage: cut off, its sidecars stopped, its clients writing."""
        self._js: SimJetStream | None = None
        self._checks: Checks | None = None
        self._apps: Applications | None = None

    @property
    def js(self) -> SimJetStream:
        assert self._js is not None
        return self._js

    @property
    def apps(self) -> Applications:
        assert self._apps is not None
        return self._apps

    @property
    def checks(self) -> Checks:
        assert self._checks is not None
        return self._checks

    @property
    def durables(self) -> list[Durable]:
        """The run's replicated durables, where they are homed now."""
        return self.checks.durables

    def pick(self) -> Durable:
        """One of the durables, drawn (no draw when there is one: a run of one durable
        draws as it always did)."""
        durables = self.durables
        return durables[0] if len(durables) == 1 else self.rng.choice(durables)

    @property
    def live(self) -> set[str]:
        """The regions not lost."""
        return set(self._live)

    @property
    def sidecars(self) -> list[Sidecar]:
        return list(self._sidecars)

    async def start(self, sidecar: Sidecar) -> None:
        await self._start(sidecar)

    # ---- the regions --------------------------------------------------------------------

    def _topology(self) -> None:
        vs, js = self.vs, self.js
        for r in vs.regions:
            js.stream_create(
                StreamConfig(
                    vs.write_stream(r),
                    (vs.data_subject(r), vs.marker_subject(r)),
                    placement=r,
                    **stream_limits(self.p, read=False),
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
                    # The server refuses a window longer than the streams' max age.
                    duplicate_window_ms=min(DEDUP_WINDOW_MS, self.p.read_max_age_ms or 2**62),
                    sources=sources,
                    placement=r,
                    **stream_limits(self.p, read=True),
                )
            )
            js.kv_bucket_create(f"rsub-{r}", placement=r)
            for o in vs.regions:
                delay = self.rng.randint(1, self.p.link_delay_ms)
                js.set_delay(vs.read_stream(r), vs.write_stream(o), delay)

    # ---- chaos --------------------------------------------------------------------------

    async def _failover(self) -> list[Durable]:
        """The first durable's home region is lost: its sidecars stop, its sourcing is cut;
        each durable homed there continues in another live region (the next one when there
        is one durable, else drawn), the others stay. The durables that moved."""
        lost = self.durables[0].home
        self._live.discard(lost)
        moved = [d for d in self.durables if d.home == lost]
        for d in moved:
            d.home = (
                self.vs.regions[1]
                if len(self.durables) == 1
                else self.rng.choice(sorted(self._live))
            )
            self.note(f"{lost} lost; {d.home} takes {d.name} over")
        self.js.partition(lost)
        for sidecar in self._sidecars:
            if sidecar.region == lost:
                await sidecar.stop()
        for d in moved:
            self.apps.recreate(d, d.home)
            known = any(
                s.region == d.home
                and s.driver is not None
                and s.driver.machine is not None
                and s.driver.machine.subscription(d.name) is not None
                for s in self._sidecars
            )
            if not known:
                # No update of the durable ever reached the new home (the lost one never
                # sent one): nothing to fail over to; its user creates it there (delivering
                # all).
                self.stats["failovers_unreplicated"] += 1
                self.apps.recreate(d, d.home, deleted=False)
            self.stats["failovers"] += 1
        return moved

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
                for k, on in (
                    ("crash", p.crashes),
                    ("cut", p.partitions),
                    ("junk", p.garbage),
                    ("freeze", p.freezes),
                    ("reset", p.resets),
                    ("delete", p.deletions),
                    ("purge", p.purges),
                )
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
            elif kind == "reset":
                durable = self.pick()
                self.apps.replay(durable, durable.home)
            elif kind == "delete":
                durable = self.pick()
                await self.apps.delete(durable, rng.choice(sorted(self._live)))
            elif kind == "purge":
                self.checks.removals.purge_some(self, sorted(self._live))
            elif kind == "freeze":
                # A leader when there is one: a follower's pause changes little.
                running = [s for s in self._sidecars if s.region in self._live]
                leaders = [s for s in running if self._led(s.region, s)]
                sidecar = rng.choice(leaders or running)
                ms = rng.randint(p.lease_ttl_ms // 2, 2 * p.lease_ttl_ms)
                self.note(f"{sidecar.name} freezes for {ms} ms")
                self.stats["freezes"] += 1
                await sidecar.freeze(ms)
                self.note(f"{sidecar.name} wakes")
            elif kind == "crash":
                sidecar = rng.choice([s for s in self._sidecars if s.region in self._live])
                name = sidecar.name
                self.note(f"{name} crashes")
                self.stats["crashes"] += 1
                await sidecar.stop()
                await asyncio.sleep(rng.randint(100, 2_000) / 1000)
                # Not lost meanwhile, nor out (the outage's end starts it: a second start
                # ran two incarnations of one replica, make soak seed 352575333335).
                if sidecar.region in self._live - self._out and not sidecar.tasks:
                    self.note(f"{name} restarts")
                    await self._start(sidecar)
            else:
                homes = {d.home for d in self.durables}
                cut = rng.choice([r for r in sorted(self._live) if r not in homes] or [None])
                if cut is None:
                    continue
                self.note(f"{cut} cut off")
                self.stats["partitions"] += 1
                self.js.partition(cut)
                await asyncio.sleep(rng.randint(200, 3_000) / 1000)
                self.note(f"{cut} healed")
                self.js.partition(cut, cut=False)

    async def _outage(self) -> None:
        """From `outage_at_ms`, the last region cut off with its sidecars stopped for
        `outage_ms` (its clients still write); then healed, its sidecars started again."""
        if await self.until(self.p.outage_at_ms):
            return
        out = self.vs.regions[-1]
        self.note(f"{out} out for {self.p.outage_ms} ms")
        self.stats["outages"] += 1
        self.js.faults.clear()  # the others calm: no failing request either
        self.js.partition(out)
        stopped = [s for s in self._sidecars if s.region == out]
        for sidecar in stopped:
            await sidecar.stop()
        self._out.add(out)
        if await self.until(self.p.outage_at_ms + self.p.outage_ms):
            return
        self.note(f"{out} back")
        self.js.partition(out, cut=False)
        self._out.discard(out)
        for sidecar in stopped:
            if not sidecar.tasks:  # one crashed before the outage may have restarted since
                await self._start(sidecar)

    async def _vector_liveness(self) -> None:
        """Vector liveness, from an outage on (the rest of the run is calm), for each
        durable: when its home's copy has passed the next data message above the copy of
        another live region, that copy advances within `vector_window_ms` (during the outage
        no snapshot completes: only the home's progress vectors can move it; after it, the
        region back floods the others with what it wrote meanwhile). Time without a leader
        awake in that region or in the home (a restarted replica waiting out its old lease,
        a home out) is not counted."""
        owed: dict[tuple[str, str], tuple[int, int]] = {}
        """(durable, region) -> (where it stood, since when)."""
        window = self.p.vector_window_ms
        if await self.until(self.p.outage_at_ms):
            return
        while True:
            await asyncio.sleep(self.p.interval_ms / 1000)
            self.js.settle()
            now = self.now_ms()
            for d in self.durables:
                for region in sorted(self._live - self._out - {d.home}):
                    standing = self.checks.standing(region, d.name)
                    was = owed.get((d.name, region))
                    if was is not None and (standing is None or standing > was[0]):
                        self.stats["vector_advances"] += 1
                        del owed[(d.name, region)]
                        was = None
                    if was is None or not self._led(region) or not self._led(d.home):
                        # Time without a leader awake there or in the home (a lease waited
                        # out) is not counted.
                        behind = self.checks.behind_home(d, region)
                        if behind is not None:
                            owed[(d.name, region)] = (behind, now)
                    elif now - was[1] > window:
                        raise self.fail(
                            f"vector liveness: {d.name} in {region} stands at {was[0]} since "
                            f"{was[1]} ms, behind its home {d.home}'s progress"
                        )

    def _forgotten(self, durable: Durable) -> bool:
        """Whether `durable`, absent from its home at the end after a failover, is one no
        replica leading there can know: none was ever fed an update naming it, and no marker
        naming it is left in the home's read stream (its limits removed the updates that
        reached the region before a leader read one: the replica leading the stream was frozen
        or down all that time, while a follower read them; make soak seed 276089432657). The
        durable is then not created there, and the failover runbook (docs/operations.md,
        step 2) has its user create it from the start: a stated limit (docs/protocol.md §6,
        limits), not a loss (nothing was consumed there)."""
        home, vs, js = durable.home, self.vs, self.js
        leaders = [s for s in self._sidecars if self._led(home, s)]
        if not leaders or durable.name in js.stream(vs.read_stream(home)).consumers:
            return False
        for s in leaders:
            assert s.driver is not None and s.driver.machine is not None  # `_led`
            if s.driver.machine.subscription(durable.name) is not None:
                return False
            if s.port.replica is None or durable.name in s.port.replica.updated:
                return False
        for msg in js.stream(vs.read_stream(home)).matching(1, (vs.marker_filter(),)):
            marker = decode(msg.data, stream=STREAM, regions=vs.regions)
            body = marker.body if isinstance(marker, Marker) else None
            if isinstance(body, Update) and body.subscription == durable.name:
                return False
        self.stats["failovers_forgotten"] += 1
        self.note(f"{durable.name} unknown to {home}'s leader, its updates removed: not a loss")
        return True

    def _led(self, region: str, replica: Sidecar | None = None) -> bool:
        """Whether a replica of `region` (`replica`, if given) runs, awake, with a machine
        that leads."""
        return any(
            s.region == region
            and (replica is None or s is replica)
            and s.tasks
            and s.port.net.awake.is_set()
            and s.driver is not None
            and s.driver.machine is not None
            and s.driver.machine.is_leader
            for s in self._sidecars
        )

    async def _checking(self) -> None:
        while True:
            await asyncio.sleep(self.p.interval_ms / 1000)
            self.js.settle()
            self.checks.reported(
                (s.name, s.region, s.driver.machine, s.port.replica.stale())
                for s in self._sidecars
                if s.driver is not None
                and s.driver.machine is not None
                and s.port.replica is not None
            )
            self.failback.checking()

    async def _start(self, sidecar: Sidecar) -> None:
        # Two incarnations of one replica at once is a bug of the world (seed 352575333335).
        assert not sidecar.tasks, f"{sidecar.name} started while it runs"
        await sidecar.start(self.vs, self.p, self.driver_factory, self.machine_factory, self)

    async def _main(self) -> None:
        loop, p = asyncio.get_running_loop(), self.p
        self._js = SimJetStream(LoopClock(loop), rng=random.Random(self.seed ^ 0x5EA))
        net = SimNet(self._js, self.rng, self.p.max_delay_ms, self.p.tail_lag_ms)
        checks = self._checks = Checks(self, self.vs, self._js, self.excuses)
        apps = self._apps = Applications(self, self.vs, net, checks, self._live.__contains__)
        # An outage from the deployment: cut off before its streams exist (`outage_at_ms`).
        absent = self.vs.regions[-1] if p.outage_ms and not p.outage_at_ms else None
        if absent is not None:
            self._js.partition(absent)
        self._topology()
        self.failback.attach()
        for durable in self.durables:
            apps.create_durable(durable, durable.home)
        if len(self.durables) > 1:
            self.stats["several_durables"] += 1
        if self.p.action_failures:
            self.js.faults.fail_randomly(
                self.p.action_failures,
                [Fault.ERROR, Fault.TIMEOUT, Fault.REPLY_LOST],
                ops=[Op.CONSUMER_INFO, Op.CONSUMER_RESET, Op.CONSUMER_CREATE, Op.MSG_GET],
                targets=[self.vs.read_stream(r) for r in self.vs.regions],
            )
        tasks = [loop.create_task(net.run())]
        try:
            for name in self.vs.regions:
                for index in range(self.p.replicas):
                    port = CheckedPort(ProcessNet(net), checks, name)
                    self._sidecars.append(Sidecar(name, index, port))
                    if name != absent:  # started when it comes back (`_outage`)
                        await self._start(self._sidecars[-1])
            produce_until = self.p.produce_until_ms
            tasks += [loop.create_task(apps.produce(r, produce_until)) for r in self.vs.regions]
            tasks.append(loop.create_task(self._checking()))
            if self.p.failback_ms:
                tasks.append(loop.create_task(self.failback.run()))
            chaos_until = self.p.failover_ms or self.p.run_ms - self.p.calm_ms
            if self.p.outage_ms:
                chaos_until = self.p.outage_at_ms
                tasks.append(loop.create_task(self._outage()))
                tasks.append(loop.create_task(self._vector_liveness()))
            chaos = loop.create_task(self._chaos(chaos_until))
            tasks.append(chaos)
            if self.p.healed:
                tasks.append(loop.create_task(healed_end(self, chaos)))
            if self.p.moves:
                tasks.append(loop.create_task(application_moves(self, tasks)))
            tasks += [loop.create_task(apps.consume(d, d.home, p.run_ms)) for d in self.durables]
            if p.failover_ms:
                if await self.until(p.failover_ms):
                    return
                moved = await self._failover()
                tasks += [loop.create_task(apps.consume(d, d.home, p.run_ms)) for d in moved]
            if await self.until(p.run_ms):
                return
            for durable in self.durables:
                if not self._forgotten(durable):
                    checks.no_loss(durable)
        finally:
            for sidecar in self._sidecars:
                await sidecar.stop()
            for task in tasks:
                task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            # A task of the world's own that broke is a bug of the world, never a result.
            broken = [e for e in ended if isinstance(e, Exception) and not isinstance(e, Violation)]
            if broken:
                raise broken[0]


def run_shell(seed: int, params: ShellParams | None = None, **kwargs: Any) -> ShellResult:
    return ShellWorld(seed, params or ShellParams.drawn(seed), **kwargs).run()
