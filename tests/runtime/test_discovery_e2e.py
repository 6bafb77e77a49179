"""Stream discovery on real servers: sidecars that list no stream follow the virtual streams
laid out while they run, ignore the others, drop a deleted one, and keep their streams
through a listing that fails. (Which names are taken up: test_discovery_unit.py.)"""

from __future__ import annotations

import contextlib
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import ServiceUnavailableError
from prometheus_client import CollectorRegistry

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, durable_config, sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.naming import VirtualStream
from sidecar.nats import jsapi
from sidecar.nats.topology import apply_topology
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound
from tests.support.nats_servers import LoneServer
from tests.support.scenario_kit import consume

pytestmark = pytest.mark.integration

DISCOVERY = {"enabled": True, "match": ["orders*"], "interval_s": 0.5}
DURABLE = "app"


class DiscoverySidecars(RegionSidecars):
    """`RegionSidecars` that list no stream and discover those named `orders*`."""

    def config(self, region: str) -> Config:
        settings = sidecar_settings(self.cluster, region, streams=(), interval_ms=self.interval_ms)
        settings["discovery"] = DISCOVERY
        return config_from_mapping(settings)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def round_age(registry: CollectorRegistry) -> float:
    """Seconds since the last discovery round that listed the streams (inf before one)."""
    age = registry.get_sample_value("rsub_discovery_last_round_age_seconds")
    return float("inf") if age is None else age


async def running(runtime: Runtime) -> set[str]:
    return {s.stream for s in (await runtime.status()).streams}


async def add_durable(js: JetStreamContext, vs: VirtualStream, region: str) -> None:
    async def created() -> bool:
        # A loaded machine can make the meta leader briefly unavailable (503): try again.
        with contextlib.suppress(ServiceUnavailableError, nats.errors.TimeoutError):
            await js.add_consumer(vs.read_stream(region), durable_config(vs, DURABLE))
            return True
        return False

    await wait_until(created, f"the durable in {region}")


async def ack_floor(js: JetStreamContext, vs: VirtualStream, region: str) -> int:
    info = await js.consumer_info(vs.read_stream(region), DURABLE)
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0


async def test_a_stream_laid_out_while_running_is_followed_and_dropped_when_deleted(
    cluster2: LocalSuperCluster,
) -> None:
    orders = VirtualStream("orders", tuple(cluster2.regions))
    payments = VirtualStream("payments", tuple(cluster2.regions))
    async with (
        DiscoverySidecars(cluster2, streams=(), serve=False) as sidecars,
        contextlib.AsyncExitStack() as stack,
    ):
        conns: dict[str, Client] = {}
        for region in cluster2.regions:
            conns[region] = await nats.connect(cluster2.servers(region))
            stack.push_async_callback(conns[region].close)
        west, east = conns["west"].jetstream(), conns["east"].jetstream()
        registry = {r: sidecars[r].metrics.registry for r in cluster2.regions}
        for region in cluster2.regions:  # ready with nothing to run yet
            assert sidecars[region].readiness.ready
            assert await running(sidecars[region]) == set()

        # The operator lays out two virtual streams; only `orders` matches the glob.
        await apply_topology(conns["west"], payments)
        await apply_topology(conns["west"], orders)

        async def taken_up() -> bool:
            for region in cluster2.regions:
                runtime = sidecars[region]
                if await running(runtime) != {"orders"} or not runtime.leadership("orders").leader:
                    return False
            return True

        await wait_until(taken_up, "both sidecars to lead the discovered stream")
        for region in cluster2.regions:
            (status,) = (await sidecars[region].status()).streams
            assert status.discovered and status.read_stream == orders.read_stream(region)
            assert sample(registry[region], "rsub_streams_discovered_total") == 1
            assert sample(registry[region], "rsub_streams", source="discovered") == 1
            assert sample(registry[region], "rsub_leader", stream="orders") == 1
            assert registry[region].get_sample_value("rsub_leader", {"stream": "payments"}) is None

        # A replicated durable in both regions, consumed in west: east's is moved forward,
        # snapshots complete, and consumption continues in east without a loss.
        await add_durable(west, orders, "west")
        await add_durable(east, orders, "east")
        first = [f"m{i}".encode() for i in range(3)]
        for data in first:
            await west.publish("orders.west.item", data, stream=orders.write_stream("west"))
        consumed = [d.payload for d in await consume(west, orders, "west", DURABLE, 3)]

        async def moved_in_east() -> bool:
            return await ack_floor(east, orders, "east") > 0

        await wait_until(moved_in_east, "the durable in east to be moved forward")

        async def snapshot_completed() -> bool:
            return bool(await sidecars["west"].list_snapshots("orders"))

        await wait_until(snapshot_completed, "a snapshot of the discovered stream in west")
        later = [b"m3", b"m4"]
        for data in later:
            await west.publish("orders.west.item", data, stream=orders.write_stream("west"))
        sub_east = await east.pull_subscribe_bind(DURABLE, stream=orders.read_stream("east"))
        with contextlib.suppress(TimeoutError):
            for _ in range(10):
                for msg in await sub_east.fetch(10, timeout=1):
                    await msg.ack_sync()
                    consumed.append(msg.data)
                if set(consumed) >= {*first, *later}:
                    break
        assert set(consumed) == {*first, *later}

        # West's read stream is deleted: west's sidecar drops the stream, east's keeps it.
        await west.delete_stream(orders.read_stream("west"))

        async def dropped_in_west() -> bool:
            # The API stops listing it first; the drop is counted once its tasks ended.
            gone = await running(sidecars["west"]) == set()
            return gone and sample(registry["west"], "rsub_streams_dropped_total") == 1

        await wait_until(dropped_in_west, "west's sidecar to drop the stream")
        assert sample(registry["west"], "rsub_streams_dropped_total") == 1
        assert sample(registry["west"], "rsub_streams", source="discovered") == 0
        assert registry["west"].get_sample_value("rsub_leader", {"stream": "orders"}) is None
        with pytest.raises(NotFound):
            await sidecars["west"].list_subscriptions("orders")
        assert await running(sidecars["east"]) == {"orders"}
        assert sample(registry["east"], "rsub_streams_dropped_total") == 0

        # Laid out again, it is found again and rebuilt from what its read stream holds.
        await apply_topology(conns["west"], orders)

        async def found_again() -> bool:
            return await running(sidecars["west"]) == {"orders"}

        await wait_until(found_again, "west's sidecar to take the stream up again")
        assert sample(registry["west"], "rsub_streams_discovered_total") == 2


async def test_a_failed_listing_drops_nothing(tmp_path: Path) -> None:
    server = LoneServer(tmp_path)
    server.start()
    orders = VirtualStream("orders", ("west",))
    settings = {
        "region": "west",
        "regions": ["west"],
        "nats": {"servers": [server.url]},
        "discovery": DISCOVERY,
        "snapshot": {"interval_ms": 200},
        "lease": {"ttl_s": 3.0},
        "grpc": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
    }
    runtime = Runtime(config_from_mapping(settings))
    try:
        nc = await nats.connect(server.url)
        try:

            async def laid_out() -> bool:
                # A fresh server needs a moment before JetStream creates streams.
                with contextlib.suppress(Exception):
                    await apply_topology(nc, orders, cluster_for_region=lambda r: None)
                    return True
                return False

            await wait_until(laid_out, "the topology on a fresh server")
        finally:
            await nc.close()
        await runtime.start()
        await runtime.wait_ready(60)
        # The first round was done before it became ready, and it found the stream.
        assert await running(runtime) == {"orders"}
        registry = runtime.metrics.registry

        server.stop()

        async def a_round_failed() -> bool:
            return sample(registry, "rsub_discovery_rounds_failed_total") >= 1

        await wait_until(a_round_failed, "a discovery round to fail")
        assert await running(runtime) == {"orders"}
        server.start()
        # The age only grows between rounds that list: smaller than now means one listed since.
        before = round_age(registry)

        async def listed_again() -> bool:
            return round_age(registry) < before

        await wait_until(listed_again, "a discovery round to list the streams again")
        assert await running(runtime) == {"orders"}
        assert sample(registry, "rsub_streams_dropped_total") == 0
    finally:
        await runtime.stop()
        server.stop()


async def test_the_listing_reads_every_page(nc: Client) -> None:
    js = nc.jetstream()
    for i in range(1100):
        await js.add_stream(name=f"s{i}", subjects=[f"s.{i}"], storage="memory")
    first = await jsapi.request(nc, "STREAM.NAMES", {"offset": 0}, timeout_s=5)
    assert len(first["streams"]) < first["total"]  # one page does not hold them all
    names = await jsapi.stream_names(nc, timeout_s=5)
    assert len(names) == len(set(names)) == first["total"]
    assert {f"s{i}" for i in range(1100)} <= set(names)


async def test_replicas_share_the_discovered_streams(cluster2: LocalSuperCluster) -> None:
    names = [f"orders-{i}" for i in range(4)]
    async with (
        DiscoverySidecars(cluster2, streams=(), regions=["west"], serve=False) as sidecars,
        sidecars.replica("west") as second,
    ):
        first = sidecars["west"]
        nc = await nats.connect(cluster2.servers("west"))
        try:
            for name in names:
                await apply_topology(nc, VirtualStream(name, tuple(cluster2.regions)))
        finally:
            await nc.close()

        async def shared() -> bool:
            for runtime in (first, second):
                if await running(runtime) != set(names):
                    return False
            # Each stream led by exactly one of the two (which one: the shard leases).
            leads = [[r.leadership(n).leader for r in (first, second)] for n in names]
            return all(sum(row) == 1 for row in leads)

        await wait_until(shared, "both replicas to run every stream, one leader each")
