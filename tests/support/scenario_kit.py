"""What the scenario tests share: clients, durables, paced publishing, consumption, metrics.

Imported as `tests.support.scenario_kit` by the scenario modules and their conftest. Never
import from a `conftest` itself: pytest loads those, and other test directories have one too.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ServiceUnavailableError
from prometheus_client.parser import text_string_to_metric_families

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, Stored, durable_config, read_stored, wait_until
from sidecar.api.service import Service
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound
from sidecar.runtime.views import SnapshotView

# Short enough that scenarios finish quickly, long enough for a loaded 2-core machine.
INTERVAL_MS = 200
TIMEOUT_S = 3.0
LEASE_TTL_S = 3.0

# Streams of the shared two-region world, one per scenario.
TWO_REGION_STREAMS = ("six", "standby", "idle", "toggle", "api", "junk", "parallel")
THREE_REGION_STREAMS = ("rounds",)


@dataclass
class World:
    """A cluster with one sidecar per region and a client per region (see conftest)."""

    cluster: LocalSuperCluster
    sidecars: RegionSidecars
    conns: dict[str, Client]

    def js(self, region: str) -> JetStreamContext:
        return self.conns[region].jetstream()

    def stream(self, name: str) -> VirtualStream:
        return VirtualStream(name, tuple(self.cluster.regions))


# Long enough for a busy 2-core machine; every wait polls a condition until this deadline.
DEADLINE_S = 45.0
ACK_TIMEOUT_S = 10.0
# A fetch that got nothing: none pending, or (503) a consumer just created is not serving yet.
NOTHING_YET = (TimeoutError, ServiceUnavailableError)  # TimeoutError covers nats-py's


@dataclass(frozen=True)
class Delivered:
    payload: bytes
    region: str
    read_seq: int
    stored_unix_ms: float


@contextlib.asynccontextmanager
async def clients(cluster: LocalSuperCluster) -> AsyncIterator[dict[str, Client]]:
    conns: dict[str, Client] = {}
    try:
        for region in cluster.regions:
            conns[region] = await nats.connect(cluster.servers(region))
        yield conns
    finally:
        for nc in conns.values():
            with contextlib.suppress(OSError):
                await nc.close()


async def create_durable(
    js: JetStreamContext, vs: VirtualStream, region: str, name: str, *, replicated: bool = True
) -> None:
    await js.add_consumer(
        vs.read_stream(region),
        durable_config(vs, name, replicated=replicated),
    )


async def publish(
    js: JetStreamContext, vs: VirtualStream, region: str, payloads: Sequence[bytes]
) -> int:
    """Publish in `region`; returns the write-stream sequence of the last one."""
    seq = 0
    for data in payloads:
        ack = await js.publish(vs.publish_subject(region, "item"), data)
        seq = ack.seq
    return seq


async def last_seq(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq)


async def last_data_sourced(nc: Client, vs: VirtualStream, region: str) -> int:
    """The sequence of the last data message in `region`'s read stream, once it holds the last
    one `region`'s write stream holds now (0 if none). Sourcing takes a moment: read at once
    after a publish, the read stream may not hold it yet, and a wait for a snapshot past its
    last data would take an older snapshot for the one wanted (seen under load in CI)."""
    written = await read_stored(nc, vs.write_stream(region), vs.data_filter())
    wanted = written[-1].seq if written else 0
    stored: list[Stored] = []

    def origin_seq(message: Stored) -> int:
        origin = vs.origin_of(message.headers.get(SOURCE_HEADER, ""))
        return origin[1] if origin is not None and origin[0] == region else 0

    async def sourced() -> bool:
        stored[:] = await read_stored(nc, vs.read_stream(region), vs.data_filter())
        return wanted == 0 or any(origin_seq(m) >= wanted for m in reversed(stored))

    await wait_until(sourced, f"{region}'s read stream to source its data to {wanted}", DEADLINE_S)
    return stored[-1].seq if stored else 0


async def snapshot_past_data(nc: Client, runtime: Runtime, vs: VirtualStream) -> SnapshotView:
    """Wait until `runtime` completed a snapshot past the last data message in its read stream
    once it holds what its region's write stream holds now (past the last *data*: without new
    data no snapshot starts)."""
    seq = await last_data_sourced(nc, vs, runtime.region)
    found: list[SnapshotView] = []

    async def done() -> bool:
        found[:] = [s for s in await runtime.list_snapshots(vs.name) if s.local_position > seq]
        return bool(found)

    await wait_until(done, f"a snapshot of {vs.name} past {seq} in {runtime.region}", DEADLINE_S)
    return found[-1]


async def publish_paced(
    nc: Client,
    runtime: Runtime,
    vs: VirtualStream,
    payloads: Sequence[bytes],
    batch: int,
) -> None:
    """Publish in `runtime`'s region in batches, each followed by a snapshot covering it, as a
    steady producer would see them (a snapshot only helps data published after it)."""
    for start in range(0, len(payloads), batch):
        await publish(nc.jetstream(), vs, runtime.region, payloads[start : start + batch])
        await snapshot_past_data(nc, runtime, vs)


async def consume(
    js: JetStreamContext, vs: VirtualStream, region: str, durable: str, count: int
) -> list[Delivered]:
    """Fetch and ack exactly `count` messages (fails after the deadline)."""
    sub = await js.pull_subscribe_bind(durable, stream=vs.read_stream(region))
    got: list[Delivered] = []

    async def enough() -> bool:
        with contextlib.suppress(*NOTHING_YET):
            for msg in await sub.fetch(count - len(got), timeout=0.5):
                got.append(delivered(msg, region))
                await msg.ack_sync(timeout=ACK_TIMEOUT_S)
        return len(got) >= count

    await wait_until(enough, f"{count} messages of {durable} in {region}", DEADLINE_S)
    return got


async def consume_all(
    js: JetStreamContext, vs: VirtualStream, region: str, durable: str, wanted: set[bytes]
) -> list[Delivered]:
    """Fetch and ack until every payload of `wanted` came and nothing more is pending."""
    sub = await js.pull_subscribe_bind(durable, stream=vs.read_stream(region))
    got: list[Delivered] = []

    async def drained() -> bool:
        try:
            msgs = await sub.fetch(100, timeout=0.5)
        except TimeoutError:  # also nats-py's own, raised when the server sends nothing at all
            return wanted <= {d.payload for d in got}
        except ServiceUnavailableError:
            return False
        for msg in msgs:
            got.append(delivered(msg, region))
            await msg.ack_sync(timeout=ACK_TIMEOUT_S)
        return False

    await wait_until(drained, f"{durable} in {region} to receive {len(wanted)}", DEADLINE_S)
    return got


def delivered(msg: Msg, region: str) -> Delivered:
    meta = msg.metadata
    return Delivered(msg.data, region, meta.sequence.stream, meta.timestamp.timestamp() * 1000)


def duplicates(deliveries: Sequence[Delivered]) -> int:
    return sum(n - 1 for n in Counter(d.payload for d in deliveries).values())


def duplicate_bound(consumed_before: Sequence[Delivered], snapshot: SnapshotView | None) -> int:
    """What may be delivered again after a failover that used `snapshot`: the messages
    consumed in the old region that reached its read stream after that snapshot started
    (everything, when no snapshot was used)."""
    if snapshot is None:
        return len(consumed_before)
    started = snapshot.completed_unix_ms - snapshot.duration_ms
    return sum(1 for d in consumed_before if d.stored_unix_ms >= started)


async def applied_from(runtime: Runtime, vs: VirtualStream, durable: str, origin: str) -> int:
    """The position of the last update from `origin` applied for `durable` here, or -1."""
    try:
        view = await runtime.get_subscription(vs.name, durable)
    except NotFound:
        return -1
    return max((a.position for a in view.applied if a.from_region == origin), default=-1)


async def snapshot_used(
    receiver: Runtime, sender: Runtime, vs: VirtualStream, durable: str
) -> SnapshotView | None:
    """The sender's snapshot of the last update the receiver applied for `durable`."""
    view = await receiver.get_subscription(vs.name, durable)
    ids = [a.snapshot_id for a in view.applied if a.from_region == sender.region]
    if not ids:
        return None
    return next((s for s in await sender.list_snapshots(vs.name) if s.id == ids[-1]), None)


async def ack_floor(js: JetStreamContext, vs: VirtualStream, region: str, durable: str) -> int:
    """The durable's ack floor in `region`, or -1 when it does not exist there."""
    try:
        info = await js.consumer_info(vs.read_stream(region), durable)
    except NotFoundError:
        return -1
    return int(info.ack_floor.stream_seq) if info.ack_floor is not None else 0


async def metrics(runtime: Service) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The runtime's /metrics, scraped over HTTP: (sample name, labels) -> value."""
    url = f"http://127.0.0.1:{runtime.http_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def metric(runtime: Service, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in (await metrics(runtime)).items() if n == name and wanted <= ls)
