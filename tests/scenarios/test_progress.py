"""Per-origin progress on real servers (DESIGN §7): the vectors a consuming region sends move
and create the durable elsewhere with no snapshot at all, and the exposure a region reports
is what a consumer there receives twice. Each test has a cluster of its own."""

from __future__ import annotations

import contextlib
from functools import partial

import grpc
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, read_stored, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.naming import VirtualStream
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    LEASE_TTL_S,
    NOTHING_YET,
    TIMEOUT_S,
    ack_floor,
    clients,
    consume,
    consume_all,
    create_durable,
    metric,
    publish,
)

pytestmark = pytest.mark.integration

STREAM = "orders"
DURABLE = "app"


def sidecars(cluster: LocalSuperCluster) -> RegionSidecars:
    return RegionSidecars(
        cluster,
        streams=[STREAM],
        interval_ms=INTERVAL_MS,
        timeout_s=TIMEOUT_S,
        lease_ttl_s=LEASE_TTL_S,
    )


async def state_in(runtime: Service) -> api_pb2.GetSubscriptionResponse:
    """The durable's `GetSubscription` answer from `runtime`'s gRPC server."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
        state: api_pb2.GetSubscriptionResponse = await api_pb2_grpc.CursorServiceStub(
            channel
        ).GetSubscription(api_pb2.GetSubscriptionRequest(stream=STREAM, subscription=DURABLE))
        return state


async def progress_in(runtime: Service, progress: dict[str, int]) -> bool:
    """Whether the durable's state in `runtime` has `progress` and an exposure (the exposure is
    read with the positions, after the vector came)."""
    state = await state_in(runtime)
    return dict(state.progress) == progress and state.failover_exposure >= 0


async def heard_from_every_region(js: JetStreamContext, vs: VirtualStream, region: str) -> None:
    """Wait until `region`'s read stream has heard from every source (`active` not -1)."""

    async def heard() -> bool:
        sources = (await js.stream_info(vs.read_stream(region))).sources or []
        return len(sources) == len(vs.regions) and all(
            s.active is not None and s.active >= 0 for s in sources
        )

    await wait_until(heard, f"{region}'s read stream to hear from every region", DEADLINE_S)


async def floor_reaches_the_data_end(nc: Client, vs: VirtualStream, region: str) -> None:
    """Wait until the durable in `region` (`nc`'s) stands at or past the last data message."""

    async def at_the_end() -> bool:
        # Reading needs a consumer, and a cut region's meta leader is elected again.
        with contextlib.suppress(TimeoutError):  # nats-py's too
            data = await read_stored(nc, vs.read_stream(region), vs.data_filter())
            return await ack_floor(nc.jetstream(), vs, region, DURABLE) >= data[-1].seq
        return False

    await wait_until(at_the_end, f"the durable in {region} at the data's end", DEADLINE_S)


async def test_progress_moves_the_durable_while_no_snapshot_can_complete(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west", "central", "east"])
    vs = VirtualStream(STREAM, tuple(cluster.regions))
    async with sidecars(cluster) as running, clients(cluster) as nc:
        js = {r: c.jetstream() for r, c in nc.items()}
        west, east = running["west"], running["east"]
        await create_durable(js["west"], vs, "west", DURABLE)
        # Every read stream hears from every region first: a read stream that never heard
        # from one (cut before its first contact) looks like a region back from a loss, and
        # its durables would be held (the failback guard, docs/protocol.md §7; this test
        # failed so once in CI, the cut landing before the sources' first heartbeat).
        for region in ("west", "east"):
            await heard_from_every_region(js[region], vs, region)
        # Central is cut off before any data: no snapshot of west can ever complete.
        for other in ("west", "east"):
            await cluster.cut_link("central", other)

        # The vector creates the durable in east at the end of what west consumed...
        # (Origin sequences are write-stream sequences: markers of the region count too.)
        consumed = {
            "west": await publish(js["west"], vs, "west", [b"w-0", b"w-1"]),
            "east": await publish(js["east"], vs, "east", [b"e-0"]),
        }
        await consume(js["west"], vs, "west", DURABLE, 3)
        await floor_reaches_the_data_end(nc["east"], vs, "east")
        await wait_until(partial(progress_in, east, consumed), "west's vector in east", DEADLINE_S)

        # ... and moves it forward as west goes on.
        consumed = {
            "west": await publish(js["west"], vs, "west", [b"w-2"]),
            "east": await publish(js["east"], vs, "east", [b"e-1"]),
        }
        await consume(js["west"], vs, "west", DURABLE, 2)
        await floor_reaches_the_data_end(nc["east"], vs, "east")

        await wait_until(partial(progress_in, east, consumed), "the later vector", DEADLINE_S)
        state = await state_in(east)
        assert dict((await state_in(west)).progress_sent) == consumed
        # No snapshot took part: none completed, none was applied.
        assert await west.list_snapshots(STREAM) == []
        assert not state.applied and not state.last_snapshot_id
        # A consumer continuing in east receives nothing twice.
        sub = await js["east"].pull_subscribe_bind(DURABLE, stream=vs.read_stream("east"))
        with pytest.raises(NOTHING_YET):
            await sub.fetch(10, timeout=1)


async def test_exposure_is_what_a_consumer_there_receives_again(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream(STREAM, tuple(cluster.regions))
    async with sidecars(cluster) as running, clients(cluster) as nc:
        js = {r: c.jetstream() for r, c in nc.items()}
        await create_durable(js["west"], vs, "west", DURABLE)
        # Slow links: e-0 lies before w-0 and w-1 in east, after them in west.
        await cluster.set_link_delay("west", "east", 1.0)
        await publish(js["east"], vs, "east", [b"e-0"])
        last_of_west = await publish(js["west"], vs, "west", [b"w-0", b"w-1"])
        consumed = await consume(js["west"], vs, "west", DURABLE, 2)
        assert [d.payload for d in consumed] == [b"w-0", b"w-1"]

        # East has not consumed e-0: the durable there stops before it, and the two messages
        # of west behind it are covered by west's vector but not yet passed.
        async def exposed() -> bool:
            with contextlib.suppress(grpc.aio.AioRpcError):  # not created in east yet
                state = await state_in(running["east"])
                progress = dict(state.progress)
                return progress == {"west": last_of_west} and state.failover_exposure == 2
            return False

        await wait_until(exposed, "an exposure of 2 in east", DEADLINE_S)

        async def gauge_shows_it() -> bool:  # the gauges follow the machine each interval
            return await metric(running["east"], "rsub_failover_exposure_messages") == 2

        await wait_until(gauge_shows_it, "the exposure gauge at 2 in east", DEADLINE_S)
        # West is lost now: a consumer continuing in east receives exactly those two again.
        await cluster.set_link_delay("west", "east", 0)
        await cluster.cut_link("west", "east")
        again = await consume_all(js["east"], vs, "east", DURABLE, {b"e-0", b"w-0", b"w-1"})
        assert sorted(d.payload for d in again) == [b"e-0", b"w-0", b"w-1"]
