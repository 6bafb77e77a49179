"""Faults on real servers: a region without a sidecar, a sidecar SIGKILLed mid-snapshot, a
leader killed while a follower waits (fencing of the old epoch), a region cut off for longer
than the snapshot timeout. Each test has a cluster of its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.sidecars import (
    ReadStreamMarker,
    RegionSidecars,
    SidecarProcess,
    read_markers,
    read_stored,
    sidecar_settings,
    wait_until,
)
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.naming import VirtualStream
from sidecar.protocol import Marker, Request, Response, Snapshot, SnapshotId, decode, encode
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    LEASE_TTL_S,
    TIMEOUT_S,
    ack_floor,
    clients,
    consume,
    consume_all,
    create_durable,
    metric,
    publish,
    publish_paced,
    snapshot_past_data,
)

pytestmark = pytest.mark.integration

STREAM = "orders"
DURABLE = "app"


def sidecars(cluster: LocalSuperCluster, regions: list[str], **kwargs: float) -> RegionSidecars:
    return RegionSidecars(
        cluster,
        streams=[STREAM],
        regions=regions,
        interval_ms=INTERVAL_MS,
        timeout_s=kwargs.get("timeout_s", TIMEOUT_S),
        lease_ttl_s=LEASE_TTL_S,
        # One shard: one replica leads the stream, another stands by (what these are about).
        lease_shards=1,
    )


@contextlib.asynccontextmanager
async def sidecar_process(
    cluster: LocalSuperCluster, region: str, workdir: Path
) -> AsyncIterator[SidecarProcess]:
    settings = sidecar_settings(
        cluster,
        region,
        streams=[STREAM],
        interval_ms=INTERVAL_MS,
        timeout_s=TIMEOUT_S,
        lease_ttl_s=LEASE_TTL_S,
        lease_shards=1,
    )
    proc = SidecarProcess(settings, workdir)
    try:
        await proc.start()
        await proc.wait_ready()
        yield proc
    finally:
        await proc.kill()


async def status_of(port: int) -> api_pb2.StatusResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        status: api_pb2.StatusResponse = await api_pb2_grpc.AdminServiceStub(channel).Status(
            api_pb2.StatusRequest()
        )
        return status


def requests_of(markers: list[ReadStreamMarker], region: str, round_: int = 1) -> list[SnapshotId]:
    return [
        m.marker.body.id
        for m in markers
        if isinstance(m.marker, Marker)
        and m.marker.region == region
        and isinstance(m.marker.body, Request)
        and m.marker.body.round == round_
    ]


def completed_ids(markers: list[ReadStreamMarker]) -> set[SnapshotId]:
    return {
        m.marker.body.id
        for m in markers
        if isinstance(m.marker, Marker) and isinstance(m.marker.body, Snapshot)
    }


async def test_a_region_without_sidecar_gets_one_request_per_timeout(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream(STREAM, ("west", "east"))
    timeout_s = 1.5
    async with sidecars(cluster, ["west"], timeout_s=timeout_s) as running, clients(cluster) as nc:
        west_js, west = nc["west"].jetstream(), running["west"]
        await create_durable(west_js, vs, "west", DURABLE)
        await publish(west_js, vs, "west", [b"lonely"])

        async def first_request() -> bool:
            return bool(requests_of(await read_markers(nc["west"], vs, "west"), "west"))

        await wait_until(first_request, "the first snapshot request", DEADLINE_S)
        window_s = 4 * timeout_s
        await asyncio.sleep(window_s)
        requests = requests_of(await read_markers(nc["west"], vs, "west"), "west")
        status = await west.status()
        print(f"no sidecar in east: {len(requests)} requests in about {window_s:.1f} s")
        # One attempt per timeout (each a new id), far fewer than one per interval.
        assert len(set(requests)) == len(requests)
        assert 2 <= len(requests) <= window_s / timeout_s + 2
        assert len(requests) < window_s * 1000 / INTERVAL_MS / 2
        assert status.streams[0].snapshot_pending
        assert await metric(west, "rsub_snapshots_timed_out_total", stream=STREAM) >= 1
        assert not await west.list_snapshots(STREAM)

        # East's sidecar arrives: the next attempt completes.
        await running.start("east")

        async def completed() -> bool:
            return bool(await west.list_snapshots(STREAM))

        await wait_until(completed, "a snapshot once east has a sidecar", DEADLINE_S)


async def test_sidecar_killed_in_the_middle_of_a_snapshot(
    make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream(STREAM, ("west", "east"))
    async with (
        sidecar_process(cluster, "west", tmp_path) as killed,
        sidecars(cluster, ["east"]) as running,
        clients(cluster) as nc,
    ):
        west_js, east_js = nc["west"].jetstream(), nc["east"].jetstream()
        await create_durable(west_js, vs, "west", DURABLE)
        # Slow links: every snapshot now takes two delayed round trips, so one is in flight.
        await cluster.set_link_delay("west", "east", 0.6)
        await publish(west_js, vs, "west", [b"before-0", b"before-1"])

        in_flight: list[SnapshotId] = []

        async def snapshot_in_flight() -> bool:
            # Direct gets from the local stream leader only: quick, so the kill comes well
            # before the answer does.
            status = await status_of(killed.grpc_port)
            request = await last_marker(west_js, vs, vs.marker_subject("west"))
            snapshot = await last_marker(west_js, vs, vs.snapshot_subject("west"))
            if not status.streams[0].snapshot_pending or request is None:
                return False
            if not isinstance(request.body, Request) or request.body.round != 1:
                return False
            completed = snapshot.body if snapshot is not None else None
            if isinstance(completed, Snapshot) and completed.id == request.body.id:
                return False
            in_flight.append(request.body.id)
            return True

        await wait_until(snapshot_in_flight, "a snapshot in flight in west", DEADLINE_S)
        await killed.kill()
        old_epoch = in_flight[-1].epoch
        await cluster.set_link_delay("west", "east", 0)

        replacement = await running.start("west")
        await running.wait_leaders()
        assert replacement.leadership(STREAM).epoch > old_epoch
        sent = [f"after-{i}".encode() for i in range(4)]
        await publish_paced(nc["west"], replacement, vs, sent, batch=2)
        consumed = await consume(west_js, vs, "west", DURABLE, 6)
        assert {d.payload for d in consumed} == {b"before-0", b"before-1", *sent}

        # Snapshots resumed under the new epoch, east follows; the killed attempt never
        # completed, even though east answered it.
        async def east_at_the_end() -> bool:
            end = (await read_stored(nc["east"], vs.read_stream("east"), vs.data_filter()))[-1]
            return await ack_floor(east_js, vs, "east", DURABLE) >= end.seq

        await wait_until(east_at_the_end, "east to follow west to the end", DEADLINE_S)
        markers = await read_markers(nc["west"], vs, "west")
        assert in_flight[-1] not in completed_ids(markers)
        assert any(s.epoch == replacement.leadership(STREAM).epoch for s in completed_ids(markers))


async def last_marker(js: JetStreamContext, vs: VirtualStream, subject: str) -> Marker | None:
    """The last marker stored on `subject` in west's read stream (a direct get)."""
    try:
        raw = await js.get_last_msg(vs.read_stream("west"), subject)
    except NotFoundError:
        return None
    decoded = decode(raw.data or b"", stream=vs.name, regions=vs.regions)
    return decoded if isinstance(decoded, Marker) else None


async def publish_stale_request(nc: Client, vs: VirtualStream, epoch: int) -> SnapshotId:
    """A request of west with an old epoch, published by hand like a zombie leader would."""
    stale = SnapshotId("west", epoch, 999_999)
    await nc.jetstream().publish(
        vs.marker_subject("west"),
        encode(Marker("west", vs.name, epoch, Request(stale, 1))),
        stream=vs.write_stream("west"),
        headers={"Nats-Msg-Id": f"zombie-{stale}"},
    )
    return stale


async def test_leader_killed_follower_takes_over_old_epoch_is_fenced(
    make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream(STREAM, ("west", "east"))
    async with (
        sidecar_process(cluster, "west", tmp_path) as leader,
        sidecars(cluster, ["east"]) as running,
        running.replica("west", serve=True) as follower,
        clients(cluster) as nc,
    ):
        west_js = nc["west"].jetstream()
        east: Service = running["east"]
        old_epoch = (await status_of(leader.grpc_port)).streams[0].leader_epoch
        assert old_epoch > 0 and not follower.is_leader
        await create_durable(west_js, vs, "west", DURABLE)
        await publish_paced(nc["west"], follower, vs, [b"a", b"b"], batch=2)

        await leader.kill()

        async def took_over() -> bool:
            return follower.is_leader

        await wait_until(took_over, "the follower to take over", DEADLINE_S)
        assert follower.leadership(STREAM).epoch > old_epoch
        # East learns the new epoch from the new leader's first snapshot.
        await publish(west_js, vs, "west", [b"c"])
        await snapshot_past_data(nc["west"], follower, vs)

        async def stale(runtime: Service) -> float:
            return await metric(
                runtime, "rsub_markers_rejected_total", stream=STREAM, reason="stale_epoch"
            )

        before = {r: await stale(r) for r in (east, follower)}
        zombie = await publish_stale_request(nc["west"], vs, old_epoch)

        async def fenced() -> bool:
            return all([await stale(r) > before[r] for r in (east, follower)])

        await wait_until(fenced, "both sidecars to count the stale marker", DEADLINE_S)
        # Nobody answered the zombie's request (checked after a later snapshot went round).
        await publish(west_js, vs, "west", [b"d"])
        await snapshot_past_data(nc["west"], follower, vs)
        answered = [
            m
            for m in await read_markers(nc["west"], vs, "west")
            if isinstance(m.marker, Marker)
            and isinstance(m.marker.body, Response)
            and m.marker.body.id == zombie
        ]
        assert answered == []


async def test_region_cut_off_longer_than_the_timeout_then_restored(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west", "central", "east"])
    vs = VirtualStream(STREAM, ("west", "central", "east"))
    async with sidecars(cluster, ["west", "central", "east"]) as running, clients(cluster) as nc:
        js = {r: c.jetstream() for r, c in nc.items()}
        west = running["west"]
        await create_durable(js["west"], vs, "west", DURABLE)
        sent = [b"w-0", b"w-1"]
        await publish_paced(nc["west"], west, vs, sent, batch=2)
        consumed = await consume(js["west"], vs, "west", DURABLE, 2)

        async def east_created() -> bool:
            return await ack_floor(js["east"], vs, "east", DURABLE) >= 0

        await wait_until(east_created, "the durable to reach east", DEADLINE_S)

        for other in ("west", "central"):
            await cluster.cut_link("east", other)
        timed_out = await metric(west, "rsub_snapshots_timed_out_total", stream=STREAM)
        for region in ("west", "central"):
            during = [f"cut-{region}-{i}".encode() for i in range(3)]
            await publish(js[region], vs, region, during)
            sent += during
        # Half of it is consumed in west during the cut, the rest will be consumed in east.
        consumed += await consume(js["west"], vs, "west", DURABLE, 3)
        floor_in_east = await ack_floor(js["east"], vs, "east", DURABLE)
        snapshots_before = len(await west.list_snapshots(STREAM))

        async def attempt_timed_out() -> bool:
            return await metric(west, "rsub_snapshots_timed_out_total", stream=STREAM) > timed_out

        await wait_until(attempt_timed_out, "a snapshot attempt to time out", DEADLINE_S)
        # Without east's answer no snapshot completes, so nothing moves in east.
        assert len(await west.list_snapshots(STREAM)) == snapshots_before
        assert await ack_floor(js["east"], vs, "east", DURABLE) == floor_in_east

        for other in ("west", "central"):
            await cluster.restore_link("east", other)
        await cluster.wait_ready()
        await cluster.wait_sources_active(timeout=120)

        async def resumed() -> bool:
            return len(await west.list_snapshots(STREAM)) > snapshots_before

        await wait_until(resumed, "snapshots to resume after the cut", DEADLINE_S)
        rest = set(sent) - {d.payload for d in consumed}
        in_east = await consume_all(js["east"], vs, "east", DURABLE, rest)
        assert {d.payload for d in consumed + in_east} == set(sent)
        assert not {d.payload for d in in_east} & {b"w-0"}
