"""Writes through one address in front of two replicas of a region's sidecar (issue 11).

A Kubernetes Service selects every replica; here a round-robin TCP balancer (`LinkProxy`
without an origin) sends each new connection to the other replica, and every call opens its
own channel, so consecutive calls alternate between the leader and the follower. What must
hold: every `CommitCursor` and `SetReplicated` takes effect whoever answers (the leader's own
view shows it), and `TriggerSnapshot` either starts a snapshot (leader) or fails with
FAILED_PRECONDITION naming the leader (follower), never silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import nats
import pytest

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.ports import HOST
from rsub_dev.proxy import LinkProxy
from rsub_dev.sidecars import RegionSidecars, durable_config, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.client import SidecarClient
from sidecar.api.service import Service
from sidecar.naming import VirtualStream
from sidecar.runtime.errors import NotFound

pytestmark = pytest.mark.integration

STREAM = "orders"
CURSOR = "spark"
DURABLE = "app"


@asynccontextmanager
async def balancer(*replicas: Service) -> AsyncIterator[LinkProxy]:
    ports = [r.grpc_port for r in replicas]
    assert None not in ports, "every replica must serve gRPC"
    proxy = LinkProxy("west-sidecars", None, [(HOST, p) for p in ports if p is not None])
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@asynccontextmanager
async def new_connection(
    address: str,
) -> AsyncIterator[tuple[api_pb2_grpc.CursorServiceStub, api_pb2_grpc.AdminServiceStub]]:
    """The two services over a channel of its own (so a connection of its own: gRPC would
    otherwise share a lingering connection of an earlier channel to the same address)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        yield api_pb2_grpc.CursorServiceStub(channel), api_pb2_grpc.AdminServiceStub(channel)


async def mark_delete(runtime: Service, subscription: str) -> int | None:
    try:
        return (await runtime.get_subscription(STREAM, subscription)).mark_delete
    except NotFound:
        return None


async def test_every_write_through_one_address_takes_effect_or_fails_loudly(
    cluster2: LocalSuperCluster,
) -> None:
    async with (
        # One shard: one replica leads the stream, the other stands by (what this is about).
        RegionSidecars(cluster2, regions=["west"], lease_shards=1) as sidecars,
        sidecars.replica("west", serve=True) as follower,
        balancer(sidecars["west"], follower) as proxy,
    ):
        leader = sidecars["west"]
        assert leader.is_leader and not follower.is_leader
        address = f"{HOST}:{proxy.port}"

        async def leader_cursor_is(value: int) -> None:
            async def seen() -> bool:
                return await mark_delete(leader, CURSOR) == value

            await wait_until(seen, f"the leader to see cursor {CURSOR} at {value}", 20)

        # Data for the cursors: a commit beyond the read stream's last sequence + 1 is refused.
        # One message more than the highest commit: a cursor with data after it stands where
        # it was committed (not extended over the markers that follow the data).
        vs = VirtualStream(STREAM, tuple(cluster2.regions))
        nc = await nats.connect(cluster2.servers("west"))
        try:
            js = nc.jetstream()
            for i in range(31):
                await js.publish(vs.publish_subject("west", "x"), str(i).encode())

            async def sourced() -> bool:
                return (await js.stream_info(vs.read_stream("west"))).state.last_seq >= 31

            await wait_until(sourced, "the data in west's read stream")
        finally:
            await nc.close()

        # CommitCursor: each answer is the stored cursor (forward only, whoever stored it).
        for sequence, expected in [(3, 3), (7, 7), (12, 12), (5, 12)]:
            async with new_connection(address) as (cursor, _):
                reply = await cursor.CommitCursor(
                    api_pb2.CommitCursorRequest(
                        stream=STREAM, subscription=CURSOR, sequence=sequence
                    )
                )
            assert reply.mark_delete == expected
            await leader_cursor_is(expected)
        assert list(proxy.forwarded.values()) == [2, 2]

        # The Spark client, one client (one connection) per commit: each lands elsewhere.
        for sequence in (20, 30):
            client = SidecarClient(address, timeout_s=5)
            try:
                stored = await asyncio.to_thread(
                    client.commit_with_retries, STREAM, CURSOR, sequence
                )
            finally:
                client.close()
            assert stored == sequence and client.commit_failures == 0
            await leader_cursor_is(sequence)
        assert list(proxy.forwarded.values()) == [3, 3]

        # SetReplicated: the durable's metadata, written by whichever replica answers.
        nc = await nats.connect(cluster2.servers("west"))
        try:
            await nc.jetstream().add_consumer(
                vs.read_stream("west"), durable_config(vs, DURABLE, replicated=False)
            )
        finally:
            await nc.close()

        async def both_know_the_durable() -> bool:
            return None not in [await mark_delete(r, DURABLE) for r in (leader, follower)]

        # The follower reads positions only in the sweep (`snapshot.sweep_intervals`, 120
        # intervals of 200 ms here), not on the consumer advisory.
        await wait_until(both_know_the_durable, "both replicas to read the durable", 60)
        for replicated in (True, False):
            async with new_connection(address) as (_, admin):
                changed = await admin.SetReplicated(
                    api_pb2.SetReplicatedRequest(
                        stream=STREAM, subscription=DURABLE, replicated=replicated
                    )
                )
            assert changed.subscription.replicated is replicated

            async def leader_agrees(replicated: bool = replicated) -> bool:
                view = await leader.get_subscription(STREAM, DURABLE)
                return view.replicated is replicated

            await wait_until(leader_agrees, f"the leader to see replicated={replicated}", 20)
        assert list(proxy.forwarded.values()) == [4, 4]

        # TriggerSnapshot: the leader starts one, the follower refuses and names the leader.
        started: list[str] = []
        refused: list[tuple[grpc.StatusCode, str]] = []
        for _ in range(2):
            async with new_connection(address) as (_, admin):
                try:
                    snapshot = await admin.TriggerSnapshot(
                        api_pb2.TriggerSnapshotRequest(stream=STREAM)
                    )
                    started.append(snapshot.snapshot_id)
                except grpc.aio.AioRpcError as error:
                    refused.append((error.code(), error.details() or ""))
        [snapshot_id] = started
        assert snapshot_id.startswith(f"west-{leader.leadership(STREAM).epoch}-")
        [(code, detail)] = refused
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert repr(leader.holder) in detail and "follower" in detail
