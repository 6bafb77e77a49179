"""Replicas of a region that share the streams (issue 13 item 5), on real servers.

Three replicas of west's sidecar (one `rsub run` child, two in-process runtimes) share 30
streams: each leads some, none all, every stream exactly one. The child is SIGKILLed with a
snapshot of one of its streams in flight; the other two take its streams over within the
lease TTL (polled against a deadline, no timing asserted), with higher epochs; a marker of
the killed replica's epoch published afterwards is counted as stale; and a durable consumed
in west across the takeover, then failed over to east, loses nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest

from rsub_dev.cluster import ClusterFactory
from rsub_dev.sidecars import RegionSidecars, SidecarProcess, sidecar_settings, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.naming import VirtualStream
from sidecar.protocol import Marker, Request, SnapshotId, encode
from sidecar.runtime.errors import NotLeader
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    LEASE_TTL_S,
    TIMEOUT_S,
    clients,
    consume,
    consume_all,
    create_durable,
    metric,
    publish,
    snapshot_past_data,
)

pytestmark = pytest.mark.integration

STREAMS = tuple(f"tenant-{i:02d}" for i in range(30))
DURABLE = "app"
# What the takeover may take beyond the TTL on this loaded machine (rounds every ttl/3,
# the membership expiring as well): a deadline for polling, not a measured figure.
TAKEOVER_DEADLINE_S = 3 * LEASE_TTL_S + 20


async def status_of(port: int) -> api_pb2.StatusResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        status: api_pb2.StatusResponse = await api_pb2_grpc.AdminServiceStub(channel).Status(
            api_pb2.StatusRequest()
        )
        return status


def led_by(runtime: Service) -> set[str]:
    return {s for s in STREAMS if runtime.leadership(s).leader}


async def test_three_replicas_share_thirty_streams_and_take_over_a_killed_ones(
    make_cluster: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await make_cluster(["west", "east"])
    settings = sidecar_settings(
        cluster,
        "west",
        streams=STREAMS,
        interval_ms=INTERVAL_MS,
        timeout_s=TIMEOUT_S,
        lease_ttl_s=LEASE_TTL_S,
    )
    killed = SidecarProcess(settings, tmp_path)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(killed.kill)
        await killed.start()
        await killed.wait_ready()

        async def killed_leads() -> set[str]:
            return {s.stream for s in (await status_of(killed.grpc_port)).streams if s.leads}

        async def leads_all() -> bool:
            return await killed_leads() == set(STREAMS)

        await wait_until(leads_all, "the first replica to lead every stream", DEADLINE_S)
        running = await stack.enter_async_context(
            RegionSidecars(
                cluster,
                streams=STREAMS,
                regions=["east"],
                interval_ms=INTERVAL_MS,
                timeout_s=TIMEOUT_S,
                lease_ttl_s=LEASE_TTL_S,
            )
        )
        nc = await stack.enter_async_context(clients(cluster))
        east = running["east"]

        # A replica joining takes its share; a third one too.
        a = await stack.enter_async_context(running.replica("west", serve=True))

        async def a_took_its_share() -> bool:
            return bool(led_by(a)) and len(await killed_leads()) < len(STREAMS)

        await wait_until(a_took_its_share, "the second replica to take its share", DEADLINE_S)
        b = await stack.enter_async_context(running.replica("west", serve=True))
        holders = {a.holder: a, b.holder: b}

        async def shared() -> bool:
            k_status = await status_of(killed.grpc_port)
            led = {"k": {s.stream for s in k_status.streams if s.leads}, "a": led_by(a)}
            led["b"] = led_by(b)
            once = all(sum(s in streams for streams in led.values()) == 1 for s in STREAMS)
            # Each replica names the same leader for every stream.
            agree = all(
                a.leadership(s.stream).holder == b.leadership(s.stream).holder == s.leader
                for s in k_status.streams
            )
            return once and agree and all(0 < len(v) < len(STREAMS) for v in led.values())

        await wait_until(shared, "three replicas to share the streams", DEADLINE_S)
        killed_streams = await killed_leads()
        # TriggerSnapshot on a replica that does not lead the stream names the one that does.
        a_stream = sorted(led_by(a))[0]
        with pytest.raises(NotLeader, match=repr(a.holder)):
            await b.trigger_snapshot(a_stream)
        print(
            f"shared: killed {len(killed_streams)}, a {len(led_by(a))}, b {len(led_by(b))} "
            f"of {len(STREAMS)} streams"
        )

        # One of the child's streams: a durable consumed in west, a snapshot in flight.
        victim = sorted(killed_streams)[0]
        vs = VirtualStream(victim, tuple(cluster.regions))
        west_js, east_js = nc["west"].jetstream(), nc["east"].jetstream()
        await create_durable(west_js, vs, "west", DURABLE)
        before = [f"before-{i}".encode() for i in range(4)]
        await publish(west_js, vs, "west", before)
        await snapshot_past_data(nc["west"], a, vs)  # a follows the child's snapshots
        consumed = await consume(west_js, vs, "west", DURABLE, 2)
        old_epoch = a.leadership(victim).leader_epoch
        assert old_epoch > 0 and a.leadership(victim).holder not in holders
        # Slow links: a snapshot takes delayed round trips, so one is in flight when killed.
        await cluster.set_link_delay("west", "east", 0.6)
        await publish(west_js, vs, "west", [b"trigger"])

        async def in_flight() -> bool:
            status = await status_of(killed.grpc_port)
            return any(s.stream == victim and s.snapshot_pending for s in status.streams)

        await wait_until(in_flight, f"a snapshot of {victim} in flight", DEADLINE_S)
        await killed.kill()

        # West keeps consuming during the takeover.
        during = [f"during-{i}".encode() for i in range(4)]
        await publish(west_js, vs, "west", during)
        consumed += await consume(west_js, vs, "west", DURABLE, 3)

        async def taken_over() -> bool:
            return all(
                a.leadership(s).holder in holders
                and a.leadership(s).holder == b.leadership(s).holder
                and holders[str(a.leadership(s).holder)].leadership(s).leader
                for s in killed_streams
            )

        await wait_until(taken_over, "the killed replica's streams taken over", TAKEOVER_DEADLINE_S)
        for s in killed_streams:
            leader = holders[str(a.leadership(s).holder)]
            assert leader.leadership(s).epoch > 0
        new_leader = holders[str(a.leadership(victim).holder)]
        new_epoch = new_leader.leadership(victim).epoch
        assert new_epoch > old_epoch
        assert led_by(a) | led_by(b) == set(STREAMS) and not led_by(a) & led_by(b)
        await cluster.set_link_delay("west", "east", 0)

        # The new leader snapshots under its epoch; then a marker of the old one is stale.
        after = [f"after-{i}".encode() for i in range(2)]
        await publish(west_js, vs, "west", after)
        await snapshot_past_data(nc["west"], new_leader, vs)

        async def stale(runtime: Service) -> float:
            return await metric(
                runtime, "rsub_markers_rejected_total", stream=victim, reason="stale_epoch"
            )

        watchers = (east, a, b)
        seen_before = [await stale(r) for r in watchers]
        zombie = SnapshotId("west", old_epoch, 999_999)
        await west_js.publish(
            vs.marker_subject("west"),
            encode(Marker("west", victim, old_epoch, Request(zombie, 1))),
            stream=vs.write_stream("west"),
            headers={"Nats-Msg-Id": f"zombie-{zombie}"},
        )

        async def fenced() -> bool:
            counts = [await stale(r) for r in watchers]
            return all(n > b for n, b in zip(counts, seen_before, strict=True))

        await wait_until(fenced, "east and both replicas to count the stale marker", DEADLINE_S)

        # Fail over to east: everything published is delivered at least once.
        published = {*before, b"trigger", *during, *after}
        rest = published - {d.payload for d in consumed}
        consumed += await consume_all(east_js, vs, "east", DURABLE, rest)
        assert {d.payload for d in consumed} == published
