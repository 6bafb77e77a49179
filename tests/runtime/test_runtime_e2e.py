"""End to end: one in-process `Runtime` per region on a real local super-cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError, ServiceUnavailableError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.nats.cursors import CursorStore
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound, NotLeader, Unavailable
from sidecar.runtime.views import SubscriptionView

pytestmark = pytest.mark.integration

STREAM = "orders"
DURABLE = "app"


async def view_of(runtime: Runtime, subscription: str) -> SubscriptionView | None:
    try:
        return await runtime.get_subscription(STREAM, subscription)
    except NotFound:
        return None


def leads(runtime: Runtime) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return runtime.is_leader

    return check


@contextlib.asynccontextmanager
async def clients(cluster: LocalSuperCluster) -> AsyncIterator[dict[str, Client]]:
    conns = {r: await nats.connect(cluster.servers(r)) for r in cluster.regions}
    try:
        yield conns
    finally:
        for nc in conns.values():
            await nc.close()


async def replicated_durable(
    js: JetStreamContext, region: str
) -> JetStreamContext.PullSubscription:
    async def created() -> bool:
        # A loaded machine can make the meta leader briefly unavailable (503): try again.
        with contextlib.suppress(ServiceUnavailableError, nats.errors.TimeoutError):
            await js.add_consumer(
                f"{STREAM}-read-{region}",
                durable_name=DURABLE,
                filter_subject=f"{STREAM}.>",
                ack_policy=api.AckPolicy.EXPLICIT,
                metadata={"rsub.replicate": "true"},
            )
            return True
        return False

    await wait_until(created, f"the durable in {region}")
    return await js.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-{region}")


async def consume(sub: JetStreamContext.PullSubscription, n: int) -> list[bytes]:
    got: list[bytes] = []

    async def fetched_all() -> bool:
        with contextlib.suppress(TimeoutError):  # nats-py raises its own or asyncio's
            for msg in await sub.fetch(n - len(got), timeout=1):
                await msg.ack_sync()
                got.append(msg.data)
        return len(got) >= n

    await wait_until(fetched_all, f"{n} messages")
    return got


async def publish(js: JetStreamContext, region: str, payloads: Sequence[bytes]) -> None:
    for data in payloads:
        await js.publish(f"{STREAM}.{region}.item", data, stream=f"{STREAM}-write-{region}")


async def test_consumption_continues_in_the_other_region_without_loss(
    cluster2: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars, clients(cluster2) as conns:
        west, east = conns["west"].jetstream(), conns["east"].jetstream()
        payloads = [f"m{i}".encode() for i in range(6)]
        sub_west = await replicated_durable(west, "west")

        await publish(west, "west", payloads[:3])
        consumed_west = await consume(sub_west, 3)

        # The west sidecar sends an update (its progress vector at once, a snapshot once one
        # completes); the east sidecar creates the durable where the update puts it.
        async def created_in_east() -> bool:
            try:
                await east.consumer_info(f"{STREAM}-read-east", DURABLE)
            except (NotFoundError, nats.errors.TimeoutError):
                return False
            return True

        await wait_until(created_in_east, "the durable to be created in east")
        info = await east.consumer_info(f"{STREAM}-read-east", DURABLE)
        assert info.config.metadata is not None
        assert info.config.metadata["rsub.replicate"] == "true"
        assert info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE

        await publish(west, "west", payloads[3:])
        sub_east = await east.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-east")
        consumed_east = await consume(sub_east, 3)
        with contextlib.suppress(TimeoutError):  # nats-py raises its own or asyncio's
            consumed_east += [m.data for m in await sub_east.fetch(10, timeout=1)]

        everything = consumed_west + consumed_east
        duplicates = len(everything) - len(set(everything))
        print(f"received {len(everything)} messages, {duplicates} duplicates")
        assert set(everything) == set(payloads)
        assert duplicates <= 3

        # East comes to hold west's progress (m0..m2, write-stream sequences 1..3 at least):
        # the vector west sends once it reads all three acked, maybe an interval after one
        # with only m0 (east's durable then created at it: a loaded machine did so); whether a
        # snapshot update also came depends on timing (west's mark-delete falls back below
        # every later snapshot once m3..m5 are pending there).
        async def east_holds_west_progress() -> bool:
            view = await sidecars["east"].get_subscription(STREAM, DURABLE)
            return view.progress.get("west", 0) >= 3

        await wait_until(east_holds_west_progress, "west's progress of 3 in east")
        east_view = await sidecars["east"].get_subscription(STREAM, DURABLE)
        assert all(a.from_region == "west" for a in east_view.applied)
        west_view = await sidecars["west"].get_subscription(STREAM, DURABLE)
        assert west_view.progress_sent["west"] >= 3

        # Snapshots complete as well (on a loaded machine, possibly after the vector did all).
        async def snapshot_completed() -> bool:
            return bool(await sidecars["west"].list_snapshots(STREAM))

        await wait_until(snapshot_completed, "a snapshot of west to complete")


async def test_three_regions_lose_nothing_when_consumption_moves(
    cluster3: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster3, serve=False) as sidecars, clients(cluster3) as conns:
        js = {r: nc.jetstream() for r, nc in conns.items()}
        first = {r: [f"{r}-{i}".encode() for i in range(2)] for r in cluster3.regions}
        for region, payloads in first.items():
            await publish(js[region], region, payloads)
        sub_west = await replicated_durable(js["west"], "west")
        consumed_west = await consume(sub_west, 6)

        for region in ("central", "east"):

            async def created(region: str = region) -> bool:
                with contextlib.suppress(NotFoundError, nats.errors.TimeoutError):
                    await js[region].consumer_info(f"{STREAM}-read-{region}", DURABLE)
                    return True
                return False

            await wait_until(created, f"the durable to be created in {region}")

        later = {r: [f"{r}-later".encode()] for r in cluster3.regions}
        for region, payloads in later.items():
            await publish(js[region], region, payloads)
        sub_east = await js["east"].pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-east")
        consumed_east: list[bytes] = []
        expected = {p for ps in [*first.values(), *later.values()] for p in ps}

        async def east_has_the_rest() -> bool:
            with contextlib.suppress(TimeoutError):  # nats-py raises its own or asyncio's
                for msg in await sub_east.fetch(10, timeout=0.5):
                    await msg.ack_sync()
                    consumed_east.append(msg.data)
            return set(consumed_west + consumed_east) == expected

        await wait_until(east_has_the_rest, "east to receive everything west did not")
        everything = consumed_west + consumed_east
        print(f"received {len(everything)}, {len(everything) - len(set(everything))} duplicates")
        snapshots = await sidecars["west"].list_snapshots(STREAM)
        assert all(set(s.positions) == {"central", "east"} for s in snapshots)


async def test_a_restarted_sidecar_rebuilds_from_its_read_stream(
    cluster2: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars, clients(cluster2) as conns:
        west = conns["west"].jetstream()
        sub = await replicated_durable(west, "west")
        await publish(west, "west", [b"a", b"b", b"c"])
        await consume(sub, 3)
        old = sidecars["west"]

        async def update_sent() -> bool:
            view = await view_of(old, DURABLE)
            return view is not None and view.last_snapshot_id is not None

        await wait_until(update_sent, "an update for the durable")
        before = {s.id for s in await old.list_snapshots(STREAM)}
        old_epoch = old.leadership(STREAM).epoch
        await sidecars.stop("west")

        new = await sidecars.start("west")
        after = {s.id for s in await new.list_snapshots(STREAM)}
        assert before <= after
        # The update markers it wrote itself tell the new sidecar what was sent already.
        view = await new.get_subscription(STREAM, DURABLE)
        assert view.last_snapshot_id in after
        assert view.mark_delete >= 3
        await wait_until(leads(new), "the new sidecar to lead")
        assert new.leadership(STREAM).epoch > old_epoch


async def test_a_follower_serves_reads_refuses_to_snapshot_and_takes_over(
    cluster2: LocalSuperCluster,
) -> None:
    # One shard: one replica leads the stream, the other stands by (sharing:
    # tests/runtime/test_shared_leadership.py).
    async with (
        RegionSidecars(cluster2, serve=False, lease_shards=1) as sidecars,
        clients(cluster2) as conns,
    ):
        west = conns["west"].jetstream()
        sub = await replicated_durable(west, "west")
        await publish(west, "west", [b"a"])
        await consume(sub, 1)
        async with sidecars.replica("west") as follower:
            assert not follower.is_leader and follower.readiness.ready

            async def follower_knows_the_durable() -> bool:
                return await view_of(follower, DURABLE) is not None

            await wait_until(follower_knows_the_durable, "the follower to see the durable")
            # Leader only, and the refusal names the leader (writes any replica can make:
            # tests/runtime/test_replica_writes.py).
            with pytest.raises(NotLeader, match=repr(sidecars["west"].holder)):
                await follower.trigger_snapshot(STREAM)

            old_epoch = sidecars["west"].leadership(STREAM).epoch
            await sidecars.stop("west")
            await wait_until(leads(follower), "the follower to take over")
            assert follower.leadership(STREAM).epoch > old_epoch

            # The new leader snapshots with its own epoch.
            await publish(west, "west", [b"b"])
            await consume(sub, 1)

            async def new_epoch_snapshot() -> bool:
                snapshots = await follower.list_snapshots(STREAM)
                return any(
                    s.id.startswith(f"west-{follower.leadership(STREAM).epoch}-") for s in snapshots
                )

            await wait_until(new_epoch_snapshot, "a snapshot of the new leader")


async def test_malformed_markers_are_counted_and_skipped(cluster2: LocalSuperCluster) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars, clients(cluster2) as conns:
        east = conns["east"].jetstream()
        for i, junk in enumerate([b"\xff\x00garbage", b""]):
            await east.publish(
                f"_rsub.{STREAM}.marker.east",
                junk,
                stream=f"{STREAM}-write-east",
                headers={"Nats-Msg-Id": f"junk-{i}"},
            )
        metrics = sidecars["west"].metrics.registry

        def rejected() -> float:
            return sum(
                metrics.get_sample_value(
                    "rsub_markers_rejected_total", {"stream": STREAM, "reason": reason}
                )
                or 0.0
                for reason in ("malformed", "missing_field")
            )

        async def both_counted() -> bool:
            return rejected() == 2

        await wait_until(both_counted, "the junk markers to be counted in west")
        # The sidecar carries on: a replicated durable still gets snapshots.
        west = conns["west"].jetstream()
        sub = await replicated_durable(west, "west")
        await publish(west, "west", [b"x"])
        await consume(sub, 1)

        async def snapshot_taken() -> bool:
            return bool(await sidecars["west"].list_snapshots(STREAM))

        await wait_until(snapshot_taken, "a snapshot after the junk")


async def test_external_cursor_committed_over_grpc_is_replicated(
    cluster2: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster2) as sidecars, clients(cluster2) as conns:
        west = conns["west"].jetstream()
        await publish(west, "west", [b"a", b"b"])
        west_port, east_port = sidecars["west"].grpc_port, sidecars["east"].grpc_port
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{west_port}") as west_channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{east_port}") as east_channel,
        ):
            west_api = api_pb2_grpc.CursorServiceStub(west_channel)
            east_api = api_pb2_grpc.CursorServiceStub(east_channel)

            async def east_has_the_cursor() -> bool:
                # The Spark source commits everything it read: the read stream's end.
                last = (await west.stream_info(f"{STREAM}-read-west")).state.last_seq
                await west_api.CommitCursor(
                    api_pb2.CommitCursorRequest(stream=STREAM, subscription="spark", sequence=last)
                )
                try:
                    state = await east_api.GetSubscription(
                        api_pb2.GetSubscriptionRequest(stream=STREAM, subscription="spark")
                    )
                except grpc.aio.AioRpcError:
                    return False
                return bool(state.kind == "external" and state.mark_delete > 0)

            await wait_until(east_has_the_cursor, "the cursor to reach east")
            backwards = await west_api.CommitCursor(
                api_pb2.CommitCursorRequest(stream=STREAM, subscription="spark", sequence=1)
            )
            assert backwards.mark_delete > 1


async def last_data_seq(js: JetStreamContext, read_stream: str) -> int:
    seq = (await js.get_last_msg(read_stream, f"{STREAM}.>")).seq
    assert seq is not None
    return seq


async def test_a_cursor_at_the_last_data_message_reaches_the_other_region(
    cluster2: LocalSuperCluster,
) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars, clients(cluster2) as conns:
        west, east = conns["west"].jetstream(), conns["east"].jetstream()
        read_west, read_east = f"{STREAM}-read-west", f"{STREAM}-read-east"
        await publish(west, "west", [b"a", b"b", b"c"])

        async def sourced() -> bool:
            return (await west.stream_info(read_west)).state.messages >= 3

        await wait_until(sourced, "the data in west's read stream")
        last_data = await last_data_seq(west, read_west)
        # Like a finished availableNow Spark job: one commit, at the last data message; the
        # snapshot markers land after it and no further commit ever comes.
        assert await sidecars["west"].commit_cursor(STREAM, "spark", last_data) == last_data

        async def applied_in_east() -> bool:
            view = await view_of(sidecars["east"], "spark")
            return view is not None and bool(view.applied)

        await wait_until(applied_in_east, "the cursor to reach east")
        sent = await sidecars["west"].get_subscription(STREAM, "spark")
        [snapshot] = [
            s
            for s in await sidecars["west"].list_snapshots(STREAM)
            if s.id == sent.last_snapshot_id
        ]
        position = snapshot.positions["east"]
        applied = (await sidecars["east"].get_subscription(STREAM, "spark")).applied
        assert [(a.from_region, a.position) for a in applied] == [("west", position)]
        # The right position: where west's request landed in east, after all of west's data.
        request = await east.get_msg(read_east, position)
        assert request.subject == f"_rsub.{STREAM}.marker.west"
        east_data = await last_data_seq(east, read_east)
        assert east_data < position
        east_cursors = CursorStore(await east.key_value("rsub-leases-east"))

        async def stored_in_east() -> bool:  # written once an update's move is carried out
            stored = (await east_cursors.load(STREAM)).get("spark")
            view = await sidecars["east"].get_subscription(STREAM, "spark")
            # West's progress vector may arrive before the snapshot's update and store the
            # cursor at east's last data message: followed by markers only, its effective
            # position then already reaches the update's, which moves nothing more.
            return stored is not None and stored >= east_data and view.mark_delete >= position

        await wait_until(stored_in_east, f"east's cursor past {east_data}, effective at {position}")
        # West's stored cursor stays where the commit put it, unless east's cursor, once moved,
        # went back to west in an update of east's own (updates go both ways, and east's
        # snapshot maps it to where east's request landed in west, after west's data): then it
        # moved over markers only, never past data.
        # Which comes first depends on the timing (a fresh-clone CI run on four workers read 8).
        west_cursors = CursorStore(await west.key_value("rsub-leases-west"))
        stored_west = (await west_cursors.load(STREAM))["spark"]
        if stored_west != last_data:
            view = await sidecars["west"].get_subscription(STREAM, "spark")
            from_east = [a.position for a in view.applied if a.from_region == "east"]
            assert from_east and last_data < stored_west <= max(from_east), (stored_west, from_east)
            assert await last_data_seq(west, read_west) == last_data  # only markers after it


async def test_trigger_snapshot_starts_one_or_returns_the_pending_one(
    cluster2: LocalSuperCluster,
) -> None:
    # West's sidecar alone: with no east sidecar to answer, an attempt stays pending.
    async with RegionSidecars(cluster2, regions=["west"]) as sidecars:
        west = sidecars["west"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{west.grpc_port}") as channel:
            admin = api_pb2_grpc.AdminServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await admin.TriggerSnapshot(api_pb2.TriggerSnapshotRequest(stream=STREAM))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no replicated subscription" in (refused.value.details() or "")

            await west.commit_cursor(STREAM, "spark", 0)
            # No data at all: the interval rule alone would never start one.
            reply = await admin.TriggerSnapshot(api_pb2.TriggerSnapshotRequest(stream=STREAM))
            assert reply.snapshot_id.startswith(f"west-{west.leadership(STREAM).epoch}-")
            again = await admin.TriggerSnapshot(api_pb2.TriggerSnapshotRequest(stream=STREAM))
            assert again.snapshot_id == reply.snapshot_id
        [stream] = (await west.status()).streams
        assert stream.snapshot_pending


async def test_lost_connection_is_reported_and_recovered(cluster2: LocalSuperCluster) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars:
        west = sidecars["west"]
        await cluster2.stop_region("west")

        async def disconnected() -> bool:
            return not west.readiness.ready

        await wait_until(disconnected, "west to report the lost connection")
        assert west.metrics.registry.get_sample_value("rsub_nats_connected") == 0
        with pytest.raises(Unavailable):
            await west.commit_cursor(STREAM, "spark", 1)
        status = await west.status()
        assert not status.connected

        await cluster2.start_region("west")

        async def recovered() -> bool:
            # JetStream needs a moment after the restart: until then writes are UNAVAILABLE.
            try:
                return await west.commit_cursor(STREAM, "spark", 1) == 1
            except Unavailable:
                return False

        await wait_until(recovered, "west to reconnect and store a cursor again")
        assert west.readiness.ready
        assert west.metrics.registry.get_sample_value("rsub_nats_connected") == 1


async def test_backend_status_watch_and_set_replicated(cluster2: LocalSuperCluster) -> None:
    async with RegionSidecars(cluster2, serve=False) as sidecars, clients(cluster2) as conns:
        west_rt = sidecars["west"]
        west = conns["west"].jetstream()
        await west.add_consumer(
            f"{STREAM}-read-west", durable_name="plain", filter_subject=f"{STREAM}.>"
        )

        async def plain_known() -> bool:
            return await view_of(west_rt, "plain") is not None

        await wait_until(plain_known, "the plain durable to be listed")
        assert not (await west_rt.get_subscription(STREAM, "plain")).replicated
        view = await west_rt.set_replicated(STREAM, "plain", True)
        assert view.replicated
        info = await west.consumer_info(f"{STREAM}-read-west", "plain")
        assert info.config.metadata is not None
        assert info.config.metadata["rsub.replicate"] == "true"
        with pytest.raises(NotFound):
            await west_rt.set_replicated(STREAM, "missing", True)
        with pytest.raises(NotFound):
            await west_rt.get_subscription("nope", "plain")

        await west_rt.commit_cursor(STREAM, "spark", 0)
        watch = west_rt.watch_subscription(STREAM, "spark")
        first = await anext(watch)
        assert (first.kind, first.mark_delete) == ("external", 0)
        await publish(west, "west", [b"a"])
        assert await west_rt.commit_cursor(STREAM, "spark", 1) == 1
        second = await asyncio.wait_for(anext(watch), 10)
        assert second.mark_delete == 1
        await watch.aclose()

        async def links_active() -> bool:
            status = await west_rt.status()
            [stream] = status.streams
            return {(s.origin_region, s.active) for s in stream.sources} == {
                ("west", True),
                ("east", True),
            }

        await wait_until(links_active, "both sources of the west read stream to be active")
        status = await west_rt.status()
        assert (status.region, status.leader, status.connected) == ("west", True, True)
        assert status.epoch == west_rt.leadership(STREAM).epoch > 0
        assert status.streams[0].replicated_subscriptions == 2
        # Lease and cursors live in a KV bucket placed in the region itself.
        kv_info = await west.stream_info("KV_rsub-leases-west")
        assert kv_info.cluster is not None and kv_info.cluster.name == "west"
