"""The way back after a region loss (issue 23, item 1) on a local cluster, for the scenario
test, `make demo`'s third act and the benchmark.

`failback(cluster, FailbackRun(...))` on a fresh cluster: producers in every region, a
replicated durable consumed in `home`; all of `home` lost (its application stops, its
servers are killed, its sidecar stopped); the application continues in `away` for
`away_s`, then stops (it moves back). `home`'s servers are restarted from their store and
its sidecar restarted at the same time, and the application in `home` reconnects as soon as
`home`'s JetStream answers for the durable, racing the sidecar; the other producers go on
for `after_s`, then the run lasts until every acknowledged message was consumed somewhere.

`FailbackRun.hold_s` is the sidecar's `failback.hold_s` (None: its default, the guard on;
0: off). The outcome counts the duplicates in `home` (deliveries after the return of
messages consumed in `away` before it), what was lost, when `home` delivered again, when its
read stream heard from each other region again, and the holds its sidecar reports
(`rsub_failback_hold_seconds`, docs/protocol.md §7).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.errors import Error as NatsError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, durable_config, wait_until
from rsub_dev.sim.shell.params import MOVE_PAUSE_MS
from rsub_dev.workload import (
    Workload,
    close_quietly,
    lose_region,
    quiet_connect,
    wait_settled,
)
from sidecar.api.service import Service
from sidecar.naming import VirtualStream
from sidecar.nats import jsapi
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound

STREAM = "orders"
DURABLE = "billing"
HOLD_METRIC = "rsub_failback_hold_seconds"
OUTCOMES = ("caught_up", "expired")
_POLL_S = 0.05
_SOURCES_POLL_S = 0.25
_SETTLED_INTERVALS = 5
_STEP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FailbackRun:
    """One run of the scenario: regions, rates and durations."""

    home: str
    away: str
    rate_per_s: float
    """Messages per second published in every region."""
    warm_s: float
    away_s: float
    after_s: float
    """How long the producers left go on after `home`'s servers were restarted."""
    hold_s: float | None = None
    """`failback.hold_s` of the sidecars (None: the sidecar's default; 0: no guard)."""
    interval_ms: int = 200
    timeout_s: float = 3.0
    lease_ttl_s: float = 3.0
    drain_timeout_s: float = 120.0
    """How long, after `after_s`, the application in `home` may take to consume the rest."""
    restart_holding: bool = False
    """`home`'s sidecar is stopped once its hold is seen, and started again once `home`'s
    read stream heard from every other region: the next one finds the hold standing and
    nothing unheard (docs/protocol.md §7, "A hold left standing")."""

    @property
    def guard(self) -> bool:
        return self.hold_s != 0


@dataclass(frozen=True)
class Hold:
    """How the sidecar of `home` reports the holds it ended, by outcome."""

    count: int
    seconds: float


@dataclass(frozen=True)
class FailbackOutcome:
    run: FailbackRun
    published: int
    consumed_away: int
    """Messages the application consumed in `away` while `home` was lost."""
    duplicates: int
    """Deliveries in `home` after the return of messages consumed in `away` before it."""
    stale_duplicates: int
    """Those of `duplicates` that `home`'s read stream held before the loss: the durable
    delivers them again because the killed servers lost its latest acks."""
    leading_duplicates: int
    """Those of `duplicates` that reached `home`'s read stream after the return and were
    delivered before the first message consumed nowhere: the covered run after the durable's
    position, which the guard is to skip (docs/protocol.md §7, Claim 3)."""
    covered_after_hold: int | None
    """Those of `leading_duplicates` delivered once the guard's hold was seen (None: no hold
    seen): none, by Claim 3. The others came before the hold landed, which starts only at the
    first listing of the sidecar's new leader (a source that resumed before it)."""
    other_duplicates: int
    """Every other delivery of a message delivered before (in either region)."""
    lost: int
    """Acknowledged messages never delivered (in any region) by the end."""
    first_delivery_s: float | None
    """From the restart of `home`'s servers to the first message delivered in `home`."""
    first_new_delivery_s: float | None
    """From the restart to the first delivery in `home` of a message its read stream
    received after the return (with the guard: after the release)."""
    answered_s: float
    """From the restart of `home`'s servers to its JetStream answering for the durable."""
    sidecar_ready_s: float
    """From the restart of `home`'s servers to its sidecar ready."""
    held_s: float | None
    """From the restart of `home`'s servers to the guard's hold of the durable seen there
    (None: not seen)."""
    sources_heard_s: dict[str, float | None]
    """Per other region: from the restart to `home`'s read stream hearing from it again
    (`STREAM.INFO` `sources[].active` no longer -1; None: not by the end)."""
    holds: dict[str, Hold] = field(default_factory=dict)
    """`rsub_failback_hold_seconds` of `home`'s restarted sidecar, per outcome."""
    held_durables: float = 0.0
    """`rsub_failback_held_durables` of `home`'s sidecar at the end."""


def _hold(runtime: Runtime, outcome: str) -> Hold:
    labels = {"stream": STREAM, "outcome": outcome}
    registry = runtime.metrics.registry
    count = registry.get_sample_value(f"{HOLD_METRIC}_count", labels) or 0.0
    seconds = registry.get_sample_value(f"{HOLD_METRIC}_sum", labels) or 0.0
    return Hold(int(count), seconds)


async def _connect_when_up(servers: list[str], timeout_s: float) -> Client:
    """A client of servers that are starting: tried again until they accept it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await quiet_connect(servers)
        except (NatsError, OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(_POLL_S)


class _SourcesWatch:
    """When a read stream hears from each of its sources again (`active` >= 0)."""

    def __init__(self, nc: Client, vs: VirtualStream, region: str, since: float) -> None:
        self.heard: dict[str, float | None] = {r: None for r in vs.regions if r != region}
        self._nc, self._vs, self._region, self._since = nc, vs, region, since

    async def run(self) -> None:
        js = self._nc.jetstream()
        while None in self.heard.values():
            with contextlib.suppress(NatsError, TimeoutError):
                info = await js.stream_info(self._vs.read_stream(self._region))
                for source in info.sources or []:
                    origin = self._vs.region_of_write_stream(source.name)
                    active = source.active if source.active is not None else -1
                    if origin in self.heard and self.heard[origin] is None and active >= 0:
                        self.heard[origin] = time.monotonic() - self._since
            await asyncio.sleep(_SOURCES_POLL_S)


class _HoldWatch:
    """When the guard's hold of the durable in `region` is first seen: `CONSUMER.INFO` says
    paused, with more remaining than the pause a move takes (`consumers.move_forward`)."""

    def __init__(self, nc: Client, vs: VirtualStream, region: str, since: float) -> None:
        self.held_s: float | None = None
        self._nc, self._op, self._since = (
            nc,
            f"CONSUMER.INFO.{vs.read_stream(region)}.{DURABLE}",
            since,
        )

    async def run(self) -> None:
        while self.held_s is None:
            with contextlib.suppress(NatsError, TimeoutError):
                info = await jsapi.request(self._nc, self._op, timeout_s=_STEP_TIMEOUT_S)
                remaining_ms = int(info.get("pause_remaining") or 0) // 1_000_000
                if info.get("paused") and remaining_ms > MOVE_PAUSE_MS:
                    self.held_s = time.monotonic() - self._since
            await asyncio.sleep(_POLL_S)


async def _restart_holding(
    sidecars: RegionSidecars, home: str, hold: _HoldWatch, watch: _SourcesWatch
) -> Service:
    """`FailbackRun.restart_holding`: the sidecar that holds stopped, started again once
    every source was heard; the one started."""

    async def held() -> bool:
        return hold.held_s is not None

    async def heard() -> bool:
        return None not in watch.heard.values()

    await wait_until(held, f"the hold of {DURABLE} in {home}", _STEP_TIMEOUT_S)
    await sidecars.stop(home)
    await wait_until(heard, f"{home}'s read stream hearing every region", _STEP_TIMEOUT_S)
    return await sidecars.start(home)


async def failback(
    cluster: LocalSuperCluster,
    run: FailbackRun,
    show: Callable[[str], None] = lambda _: None,
) -> FailbackOutcome:
    """Run the scenario on `cluster` (fresh: the durable and the stream are created here);
    `show` receives a status line now and then."""
    vs = VirtualStream(STREAM, tuple(cluster.regions))
    home, away = run.home, run.away
    ncs = {r: await quiet_connect(cluster.servers(r)) for r in vs.regions}
    try:
        async with (
            RegionSidecars(
                cluster,
                streams=[STREAM],
                interval_ms=run.interval_ms,
                timeout_s=run.timeout_s,
                lease_ttl_s=run.lease_ttl_s,
                failback_hold_s=run.hold_s,
            ) as sidecars,
            Workload(ncs, vs, run.rate_per_s, (DURABLE,)) as work,
        ):
            js = ncs[home].jetstream()
            await js.add_consumer(vs.read_stream(home), durable_config(vs, DURABLE))
            consumer = work.consumers[DURABLE]
            work.consume_in(ncs[home], home)
            started = time.monotonic()

            async def warm() -> bool:
                show(work.status(f"consuming in {home}"))
                if time.monotonic() - started < run.warm_s:
                    return False
                try:
                    view = await sidecars[away].get_subscription(STREAM, DURABLE)
                except NotFound:
                    return False
                return bool(view.progress)

            await wait_until(warm, f"{DURABLE}'s progress in {away}", _STEP_TIMEOUT_S)

            # All of `home` at once: its application, servers, producer and sidecar.
            await work.stop_consuming()
            await lose_region(cluster, sidecars, work, ncs, home)
            settled_s = _SETTLED_INTERVALS * run.interval_ms / 1000
            await wait_settled(sidecars[away], STREAM, (DURABLE,), settled_s)
            work.consume_in(ncs[away], away)
            away_until = time.monotonic() + run.away_s
            while time.monotonic() < away_until:
                show(work.status(f"{home} lost, consuming in {away}"))
                await asyncio.sleep(0.5)
            await work.stop_consuming()
            consumed_away = {d.payload for d in consumer.in_region(away)}

            # The return: servers from their store, the sidecar, and the application at once.
            restarted, restarted_unix_ms = time.monotonic(), time.time() * 1000
            await cluster.start_region(home)
            sidecar = asyncio.create_task(sidecars.start(home))
            nc = ncs[home] = await _connect_when_up(cluster.servers(home), _STEP_TIMEOUT_S)

            async def answers() -> bool:
                with contextlib.suppress(NatsError):
                    await nc.jetstream().consumer_info(vs.read_stream(home), DURABLE)
                    return True
                return False

            await wait_until(answers, f"{home}'s JetStream", _STEP_TIMEOUT_S, poll_s=_POLL_S)
            answered_s = time.monotonic() - restarted
            hold = _HoldWatch(nc, vs, home, restarted)
            holding = asyncio.create_task(hold.run())
            work.consume_in(nc, home)
            watch = _SourcesWatch(nc, vs, home, restarted)
            watching = asyncio.create_task(watch.run())
            try:
                runtime = await sidecar
                sidecar_ready_s = time.monotonic() - restarted
                if run.restart_holding:
                    runtime = await _restart_holding(sidecars, home, hold, watch)
                while time.monotonic() - restarted < run.after_s:
                    show(work.status(f"{home} back, consuming in {home}"))
                    await asyncio.sleep(0.5)
                for producer in work.producers.values():
                    producer.stopped.set()
                expected = {p for x in work.producers.values() for p in x.confirmed}

                async def drained() -> bool:
                    show(work.status(f"{home} back, consuming the rest in {home}"))
                    return not consumer.missing(expected)

                with contextlib.suppress(TimeoutError):
                    await wait_until(drained, "every message consumed", run.drain_timeout_s)
                await work.stop_consuming()
            finally:
                for task in (watching, holding):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            holds = {o: _hold(runtime, o) for o in OUTCOMES}
            held = runtime.metrics.registry.get_sample_value(
                "rsub_failback_held_durables", {"stream": STREAM}
            )
    finally:
        for client in ncs.values():
            await close_quietly(client)

    returned = [d for d in consumer.in_region(home) if d.at >= restarted]
    new = [d for d in returned if d.stored_unix_ms >= restarted_unix_ms]
    first_new = next((i for i, d in enumerate(new) if d.payload not in consumed_away), len(new))
    duplicates = sum(1 for d in returned if d.payload in consumed_away)
    held_s = hold.held_s
    after_hold = (
        None if held_s is None else sum(1 for d in new[:first_new] if d.at - restarted >= held_s)
    )
    return FailbackOutcome(
        run=run,
        published=len(expected),
        consumed_away=len(consumed_away),
        duplicates=duplicates,
        stale_duplicates=duplicates - sum(1 for d in new if d.payload in consumed_away),
        leading_duplicates=first_new,
        covered_after_hold=after_hold,
        other_duplicates=consumer.duplicates() - duplicates,
        lost=len(consumer.missing(expected)),
        first_delivery_s=returned[0].at - restarted if returned else None,
        first_new_delivery_s=new[0].at - restarted if new else None,
        answered_s=answered_s,
        sidecar_ready_s=sidecar_ready_s,
        held_s=held_s,
        sources_heard_s=dict(watch.heard),
        holds=holds,
        held_durables=held or 0.0,
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table(outcomes: Sequence[FailbackOutcome]) -> list[str]:
    """The outcomes side by side (one column each), as lines of text."""
    rows: list[tuple[str, Callable[[FailbackOutcome], str]]] = [
        ("guard", lambda o: f"on (hold_s {o.run.hold_s or 'default'})" if o.run.guard else "off"),
        ("away", lambda o: f"{o.run.away_s:g} s at {o.run.rate_per_s:g} msg/s per region"),
        ("published (acknowledged)", lambda o: str(o.published)),
        (f"consumed in {outcomes[0].run.away} while away", lambda o: str(o.consumed_away)),
        ("duplicates in home after the return", lambda o: str(o.duplicates)),
        ("  stored before the loss (acks lost)", lambda o: str(o.stale_duplicates)),
        ("  covered run after the position", lambda o: str(o.leading_duplicates)),
        ("other duplicates", lambda o: str(o.other_duplicates)),
        ("lost", lambda o: str(o.lost)),
        ("restart -> home's JetStream answers", lambda o: _seconds(o.answered_s)),
        ("restart -> home's sidecar ready", lambda o: _seconds(o.sidecar_ready_s)),
        (
            "restart -> read stream hears the others",
            lambda o: ", ".join(f"{r} {_seconds(s)}" for r, s in o.sources_heard_s.items()),
        ),
        ("restart -> first delivery in home", lambda o: _seconds(o.first_delivery_s)),
        ("restart -> first delivery of new data", lambda o: _seconds(o.first_new_delivery_s)),
        (
            "hold reported (caught_up / expired)",
            lambda o: " / ".join(
                f"{h.count}x {h.seconds:.1f} s" for h in (o.holds[k] for k in OUTCOMES)
            ),
        ),
    ]
    cells = [[name, *(cell(o) for o in outcomes)] for name, cell in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
