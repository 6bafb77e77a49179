"""Traffic on a virtual stream for the demo and the scenario tests.

`Producer` publishes at a steady rate and counts only acknowledged messages as published;
`Consumer` fetches a durable, records and acks what it receives, natively or through the
exact client (`sidecar.exact.ExactConsumer`); `Workload` runs one producer per region and one
consumer per durable as tasks. `ReadStreamLedger` reads what a read stream holds through a
plain durable of its own: unlike `read_stored` (an ordered consumer), its fetches need no
JetStream meta leader, so it still reads a region left alone after the others were lost.
`wait_settled` waits until a sidecar's view of some subscriptions stops changing;
`lose_region` loses a whole region at once and `uncovered` counts deliveries no progress
vector covers. `busy_event_loop` keeps the client's own event loop busy, as an
application's CPU work between awaits does. `quiet_connect` opens a client that does not log
the troubles of a region being killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from sidecar.config.nats import NatsConfig
from sidecar.exact import ExactConsumer, covered
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.connection import connect_options
from sidecar.runtime import Runtime
from sidecar.runtime.views import SubscriptionView

FETCH_BATCH = 100
FETCH_WAIT_S = 0.25
ACK_TIMEOUT_S = 10.0
_LEDGER_BATCH = 500


@contextlib.asynccontextmanager
async def busy_event_loop(seed: int, longest_s: float) -> AsyncIterator[None]:
    """While inside: a task holding the event loop for a random time up to `longest_s`, then
    letting the others run once, again and again (seeded)."""
    rng = random.Random(seed)

    async def hold() -> None:
        while True:
            time.sleep(rng.uniform(0, longest_s))  # noqa: ASYNC251 (holding the loop is the point)
            await asyncio.sleep(0)

    task = asyncio.create_task(hold())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def quiet_connect(servers: Sequence[str]) -> Client:
    """A client whose connection troubles (expected once a region is killed) are not logged."""

    async def ignore(_error: Exception) -> None:
        return None

    options = connect_options(NatsConfig(servers=tuple(servers)))
    return await nats.connect(**options, error_cb=ignore)


async def close_quietly(nc: Client) -> None:
    """Close a client; nats-py can raise ConnectionResetError closing one that is reconnecting."""
    with contextlib.suppress(OSError):
        await nc.close()


@dataclass
class Producer:
    """Publishes `<region>-<n>` at a steady rate; only acknowledged messages count as published."""

    nc: Client
    vs: VirtualStream
    region: str
    rate_per_s: float
    confirmed: list[bytes] = field(default_factory=list)
    unconfirmed: list[bytes] = field(default_factory=list)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        js = self.nc.jetstream()
        subject = self.vs.publish_subject(self.region, "created")
        period = 1 / self.rate_per_s
        n = 0
        next_at = time.monotonic()
        # Stopped by the event: on Python 3.11 a cancel can be swallowed by nats-py's wait_for.
        while not self.stopped.is_set():
            n += 1
            payload = f"{self.region}-{n}".encode()
            try:
                await js.publish(subject, payload, timeout=2)
            except (NatsError, TimeoutError):
                self.unconfirmed.append(payload)
            except asyncio.CancelledError:
                self.unconfirmed.append(payload)
                raise
            else:
                self.confirmed.append(payload)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


@dataclass(frozen=True)
class Delivery:
    payload: bytes
    region: str
    read_seq: int
    stored_unix_ms: int
    """When the message was stored in the consumer's read stream (its arrival there)."""
    at: float
    """time.monotonic() of the delivery."""
    origin: tuple[str, int] | None
    """Origin region and sequence there (None: no usable `Nats-Stream-Source`)."""


@dataclass
class Consumer:
    """The application on one durable: fetches, processes (records), acks each message."""

    durable: str
    deliveries: list[Delivery] = field(default_factory=list)
    region: str | None = None
    exact: ExactConsumer | None = None
    """The exact client of the last `run` given a progress vector."""

    async def run(
        self,
        nc: Client,
        vs: VirtualStream,
        region: str,
        progress: Mapping[str, int] | None = None,
    ) -> None:
        """Consume in `region` until `region` is changed (`stop`, or another `run`); with
        `progress`, through an `ExactConsumer` skipping what it covers."""
        self.region = region
        sub = await nc.jetstream().pull_subscribe_bind(self.durable, stream=vs.read_stream(region))
        source: JetStreamContext.PullSubscription | ExactConsumer = sub
        if progress is not None:
            source = self.exact = ExactConsumer(sub, progress, vs)
        while self.region == region:
            try:
                msgs = await source.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
            except TimeoutError:  # nats-py's too
                continue
            for msg in msgs:
                meta = msg.metadata
                header = (msg.headers or {}).get(SOURCE_HEADER)
                self.deliveries.append(
                    Delivery(
                        msg.data,
                        region,
                        meta.sequence.stream,
                        int(meta.timestamp.timestamp() * 1000),
                        time.monotonic(),
                        vs.origin_of(header) if header else None,
                    )
                )
                # An ack unconfirmed in time (a saturated machine) ends nothing: the server
                # redelivers the message if the ack was lost, as to any application, and the
                # counts show it as a duplicate.
                with contextlib.suppress(TimeoutError):
                    await msg.ack_sync(timeout=ACK_TIMEOUT_S)

    def stop(self) -> None:
        """End the fetch loop after the current batch."""
        self.region = None

    def in_region(self, region: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.region == region]

    def uncovered(self, region: str, progress: Mapping[str, int]) -> int:
        """Deliveries in `region` that `progress` does not cover: what an exact client
        elsewhere would receive again after the loss of `region` (docs/protocol.md §6)."""
        return sum(1 for d in self.in_region(region) if not covered(d.origin, progress))

    def duplicates(self) -> int:
        """Deliveries of a message received before."""
        return sum(n - 1 for n in Counter(d.payload for d in self.deliveries).values())

    def missing(self, expected: Collection[bytes]) -> list[bytes]:
        """The payloads of `expected` never delivered, sorted."""
        return sorted(set(expected) - {d.payload for d in self.deliveries})


class Workload:
    """A producer in every region and a consumer per durable, as tasks stopped at exit."""

    def __init__(
        self,
        ncs: Mapping[str, Client],
        vs: VirtualStream,
        rate_per_s: float,
        durables: Sequence[str],
    ) -> None:
        self.producers = {r: Producer(ncs[r], vs, r, rate_per_s) for r in vs.regions}
        self.consumers = {d: Consumer(d) for d in durables}
        self._vs = vs
        self._producing: list[asyncio.Task[None]] = []
        self._consuming: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Workload:
        self._producing += [asyncio.create_task(p.run()) for p in self.producers.values()]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for producer in self.producers.values():
            producer.stopped.set()
        for consumer in self.consumers.values():
            consumer.stop()
        tasks = self._producing + self._consuming
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def consume_in(
        self, nc: Client, region: str, exact: Mapping[str, Mapping[str, int]] | None = None
    ) -> None:
        """Move every consumer to `region` (a fetch loop elsewhere ends); the durables named
        in `exact` go through the exact client with the progress vector given."""
        exact = exact or {}
        self._consuming += [
            asyncio.create_task(c.run(nc, self._vs, region, exact.get(d)))
            for d, c in self.consumers.items()
        ]

    async def stop_consuming(self) -> None:
        """Stop every consumer cleanly: each acks what it received, then its loop ends."""
        for consumer in self.consumers.values():
            consumer.stop()
        tasks, self._consuming = self._consuming, []
        await asyncio.gather(*tasks)

    def stop_producer(self, region: str) -> None:
        self.producers[region].stopped.set()

    def status(self, phase: str) -> str:
        sent = " ".join(f"{r} {len(p.confirmed)}" for r, p in self.producers.items())
        got = " | ".join(
            f"{d} "
            + " ".join(f"{r} {n}" for r, n in Counter(x.region for x in c.deliveries).items())
            for d, c in self.consumers.items()
        )
        return f"{phase}: published {sent} | consumed {got}"


async def lose_region(
    cluster: LocalSuperCluster,
    sidecars: RegionSidecars,
    work: Workload,
    ncs: dict[str, Client],
    region: str,
) -> None:
    """All of `region` at once: servers killed, its producer and sidecar stopped, its client
    closed and removed from `ncs`."""
    await cluster.stop_region(region)
    work.stop_producer(region)
    await sidecars.stop(region)
    await close_quietly(ncs.pop(region))


@dataclass(frozen=True)
class Held:
    """A data message a read stream holds: its sequence there, origin (None: unknown) and
    payload."""

    seq: int
    origin: tuple[str, int] | None
    payload: bytes


class ReadStreamLedger:
    """Every data message of `region`'s read stream so far, in order, read through a plain
    durable `name` (no acks, not replicated) created by `open`."""

    def __init__(self, sub: JetStreamContext.PullSubscription, vs: VirtualStream) -> None:
        self._sub = sub
        self._vs = vs
        self.held: list[Held] = []

    @classmethod
    async def open(
        cls, nc: Client, vs: VirtualStream, region: str, name: str = "ledger"
    ) -> ReadStreamLedger:
        """Create the durable (while the JetStream meta leader is there) and bind to it."""
        js = nc.jetstream()
        config = ConsumerConfig(
            durable_name=name,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=vs.data_filter(),
            ack_policy=AckPolicy.NONE,
        )
        await js.add_consumer(vs.read_stream(region), config)
        return cls(await js.pull_subscribe_bind(name, stream=vs.read_stream(region)), vs)

    async def catch_up(self) -> list[Held]:
        """Read until a fetch finds less than a full batch; returns everything held so far."""
        while True:
            try:
                msgs = await self._sub.fetch(_LEDGER_BATCH, timeout=FETCH_WAIT_S)
            except TimeoutError:  # nats-py's too
                break
            for msg in msgs:
                source = (msg.headers or {}).get(SOURCE_HEADER)
                origin = self._vs.origin_of(source) if source else None
                self.held.append(Held(msg.metadata.sequence.stream, origin, msg.data))
            if len(msgs) < _LEDGER_BATCH:
                break
        return self.held

    def payloads(self) -> set[bytes]:
        return {h.payload for h in self.held}

    async def holding(self, wanted: Collection[bytes], what: str, timeout_s: float) -> set[bytes]:
        """Wait until the read stream holds `wanted`; every payload it holds then."""

        async def holds() -> bool:
            await self.catch_up()
            return set(wanted) <= self.payloads()

        await wait_until(holds, what, timeout_s)
        return self.payloads()


async def wait_settled(
    runtime: Runtime,
    stream: str,
    subscriptions: Sequence[str],
    quiet_s: float,
    timeout_s: float = 60.0,
) -> dict[str, SubscriptionView]:
    """The views of `subscriptions` in `runtime` once their position, progress and exposure
    have not changed for `quiet_s` (every update received was applied, and the exposure
    computed with it)."""
    views: dict[str, SubscriptionView] = {}
    last: object = None
    since = time.monotonic()

    async def quiet() -> bool:
        nonlocal last, since
        for name in subscriptions:
            views[name] = await runtime.get_subscription(stream, name)
        state = [
            (v.mark_delete, sorted(v.progress.items()), v.failover_exposure) for v in views.values()
        ]
        if state != last:
            last, since = state, time.monotonic()
        return time.monotonic() - since >= quiet_s

    await wait_until(quiet, f"{subscriptions} settled in {runtime.region}", timeout_s)
    return views
