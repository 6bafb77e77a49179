"""Pulsar's replicated-subscription scenarios on NATS: two regions, real servers and sidecars.

All tests share one cluster (west, east) with one sidecar per region; each test has a virtual
stream of its own (see scenario_kit.TWO_REGION_STREAMS).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping

import grpc
import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from rsub_dev.sidecars import read_markers, read_stored, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.client import SidecarError
from sidecar.exact import ExactConsumer, covered, progress_of
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.protocol import Marker, Request, SnapshotId, encode
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    World,
    ack_floor,
    applied_from,
    consume,
    consume_all,
    create_durable,
    duplicate_bound,
    duplicates,
    last_seq,
    metric,
    publish,
    publish_paced,
    snapshot_used,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

DURABLE = "app"


def payloads(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


async def test_six_published_three_consumed_in_west_the_rest_in_east(world2: World) -> None:
    vs, west, east = world2.stream("six"), world2.js("west"), world2.js("east")
    sent = payloads("six", 6)
    # The application made the durable in both regions; the update moves east's forward.
    await create_durable(west, vs, "west", DURABLE)
    await create_durable(east, vs, "east", DURABLE)
    await publish_paced(world2.conns["west"], world2.sidecars["west"], vs, sent, batch=2)
    in_west = await consume(west, vs, "west", DURABLE, 3)

    async def east_moved() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) > 0

    await wait_until(east_moved, "the update to move the durable in east", DEADLINE_S)
    # The snapshot east starts from (later updates, caused by east's own consumption, only
    # move the position further).
    used = await snapshot_used(world2.sidecars["east"], world2.sidecars["west"], vs, DURABLE)
    wanted = set(sent) - {d.payload for d in in_west}
    in_east = await consume_all(east, vs, "east", DURABLE, wanted)

    everything = in_west + in_east
    bound = duplicate_bound(in_west, used)
    print(f"six: received {len(everything)}, duplicates {duplicates(everything)} <= {bound}")
    assert {d.payload for d in everything} == set(sent)
    assert used is not None
    assert duplicates(everything) <= bound
    assert await metric(world2.sidecars["west"], "rsub_snapshots_completed_total", stream="six")
    assert await metric(world2.sidecars["west"], "rsub_updates_sent_total", stream="six")
    assert await metric(
        world2.sidecars["east"], "rsub_updates_applied_total", stream="six", origin="west"
    )


async def test_standby_switch_durable_created_in_east_by_an_update(world2: World) -> None:
    vs, west, east = world2.stream("standby"), world2.js("west"), world2.js("east")
    sent = payloads("standby", 20)
    await create_durable(west, vs, "west", DURABLE)
    await publish_paced(world2.conns["west"], world2.sidecars["west"], vs, sent, batch=5)
    assert await ack_floor(east, vs, "east", DURABLE) == -1
    in_west = await consume(west, vs, "west", DURABLE, 10)

    async def created_in_east() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) >= 0

    await wait_until(created_in_east, "the durable to be created in east", DEADLINE_S)
    info = await east.consumer_info(vs.read_stream("east"), DURABLE)
    assert info.config.metadata is not None
    assert info.config.metadata.get("rsub.replicate") == "true"
    # The snapshot east starts from (later updates, caused by east's own consumption, only
    # move the position further).
    used = await snapshot_used(world2.sidecars["east"], world2.sidecars["west"], vs, DURABLE)
    wanted = set(sent) - {d.payload for d in in_west}
    in_east = await consume_all(east, vs, "east", DURABLE, wanted)

    everything = in_west + in_east
    bound = duplicate_bound(in_west, used)
    print(f"standby: received {len(everything)}, duplicates {duplicates(everything)} <= {bound}")
    assert {d.payload for d in everything} == set(sent)
    assert duplicates(everything) <= bound


async def marker_counts(world: World, stream: str) -> dict[str, int]:
    vs = world.stream(stream)
    return {r: len(await read_markers(world.conns[r], vs, r)) for r in world.cluster.regions}


async def test_no_new_markers_without_new_data(world2: World) -> None:
    vs, west = world2.stream("idle"), world2.js("west")
    await create_durable(west, vs, "west", DURABLE)
    await publish_paced(
        world2.conns["west"], world2.sidecars["west"], vs, payloads("idle", 2), batch=2
    )
    await consume(west, vs, "west", DURABLE, 2)
    settle_s = 6 * INTERVAL_MS / 1000
    # After the last data, the follow-up update and the snapshots it causes settle down.
    previous = await marker_counts(world2, "idle")

    async def quiet() -> bool:
        nonlocal previous
        await asyncio.sleep(settle_s)
        now = await marker_counts(world2, "idle")
        still, previous = now == previous, now
        return still

    await wait_until(quiet, "the markers of an idle stream to stop", DEADLINE_S)
    started = await metric(world2.sidecars["west"], "rsub_snapshots_started_total", stream="idle")
    assert started >= 1
    await asyncio.sleep(2 * settle_s)
    assert await marker_counts(world2, "idle") == previous
    again = await metric(world2.sidecars["west"], "rsub_snapshots_started_total", stream="idle")
    assert again == started


async def set_replicated(world: World, region: str, stream: str, replicated: bool) -> None:
    port = world.sidecars[region].grpc_port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await api_pb2_grpc.AdminServiceStub(channel).SetReplicated(
            api_pb2.SetReplicatedRequest(stream=stream, subscription=DURABLE, replicated=replicated)
        )
    assert reply.subscription.replicated is replicated


async def last_data_seq(world: World, stream: str, region: str) -> int:
    vs = world.stream(stream)
    stored = await read_stored(world.conns[region], vs.read_stream(region), vs.data_filter())
    return stored[-1].seq


async def test_replication_switched_off_and_on_at_runtime(world2: World) -> None:
    vs, west, east = world2.stream("toggle"), world2.js("west"), world2.js("east")
    await create_durable(west, vs, "west", DURABLE)
    await publish_paced(
        world2.conns["west"], world2.sidecars["west"], vs, payloads("on", 4), batch=2
    )
    await consume(west, vs, "west", DURABLE, 3)

    async def created_in_east() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) >= 0

    await wait_until(created_in_east, "the durable to be created in east", DEADLINE_S)
    for region in world2.cluster.regions:
        await set_replicated(world2, region, "toggle", False)
    sent_before = await metric(world2.sidecars["west"], "rsub_updates_sent_total", stream="toggle")

    # Off: each region consumes on its own; neither position follows the other.
    await publish(west, vs, "west", payloads("off", 4))
    await consume(west, vs, "west", DURABLE, 5)
    await consume(east, vs, "east", DURABLE, 1)
    east_floor = await ack_floor(east, vs, "east", DURABLE)
    west_floor = await ack_floor(west, vs, "west", DURABLE)
    assert west_floor == await last_seq(west, vs.read_stream("west"))
    await asyncio.sleep(8 * INTERVAL_MS / 1000)
    assert await ack_floor(east, vs, "east", DURABLE) == east_floor
    assert await ack_floor(west, vs, "west", DURABLE) == west_floor
    sent_after = await metric(world2.sidecars["west"], "rsub_updates_sent_total", stream="toggle")
    assert sent_after == sent_before

    # On again: west has consumed everything, so east follows it to the end of the data.
    for region in world2.cluster.regions:
        await set_replicated(world2, region, "toggle", True)
    east_end = await last_data_seq(world2, "toggle", "east")

    async def east_follows() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) >= east_end

    await wait_until(east_follows, "east's position to follow west again", DEADLINE_S)
    assert east_floor < east_end


async def test_grpc_api_answers_documented_status_codes(world2: World) -> None:
    vs, west = world2.stream("api"), world2.js("west")
    await create_durable(west, vs, "west", DURABLE)
    await publish(west, vs, "west", payloads("api", 1))
    await consume(west, vs, "west", DURABLE, 1)
    leader = world2.sidecars["west"]

    async def known() -> bool:
        return any(s.subscription == DURABLE for s in await leader.list_subscriptions("api"))

    await wait_until(known, "the leader to know the durable", DEADLINE_S)

    async def code_of(port: int | None, call: str, request: object) -> tuple[grpc.StatusCode, str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stubs = {
                "GetSubscription": api_pb2_grpc.CursorServiceStub(channel).GetSubscription,
                "ListSnapshots": api_pb2_grpc.CursorServiceStub(channel).ListSnapshots,
                "CommitCursor": api_pb2_grpc.CursorServiceStub(channel).CommitCursor,
                "SetReplicated": api_pb2_grpc.AdminServiceStub(channel).SetReplicated,
                "TriggerSnapshot": api_pb2_grpc.AdminServiceStub(channel).TriggerSnapshot,
            }
            try:
                await stubs[call](request)
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""

    get = api_pb2.GetSubscriptionRequest
    port = leader.grpc_port
    code, detail = await code_of(port, "GetSubscription", get(stream="", subscription=DURABLE))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("stream")
    code, detail = await code_of(port, "GetSubscription", get(stream="api", subscription="a.b"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("subscription")
    code, detail = await code_of(
        port, "CommitCursor", api_pb2.CommitCursorRequest(stream="api", subscription=DURABLE)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("subscription")
    code, _ = await code_of(port, "GetSubscription", get(stream="nope", subscription=DURABLE))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(port, "GetSubscription", get(stream="api", subscription="ghost"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(port, "ListSnapshots", api_pb2.ListSnapshotsRequest(stream="nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await code_of(
        port,
        "SetReplicated",
        api_pb2.SetReplicatedRequest(stream="api", subscription="ghost", replicated=True),
    )
    assert code == grpc.StatusCode.NOT_FOUND

    async with world2.sidecars.replica("west", serve=True) as follower:
        assert not follower.is_leader
        fport = follower.grpc_port

        async def follower_knows() -> bool:
            return bool(await follower.list_subscriptions("api"))

        await wait_until(follower_knows, "the follower to know the durable", DEADLINE_S)
        code, _ = await code_of(fport, "GetSubscription", get(stream="api", subscription=DURABLE))
        assert code == grpc.StatusCode.OK
        # Writes any replica can make (tests/runtime/test_replica_writes.py); a snapshot
        # needs the leader, named in the refusal.
        for call, request in [
            (
                "SetReplicated",
                api_pb2.SetReplicatedRequest(stream="api", subscription=DURABLE, replicated=True),
            ),
            (
                "CommitCursor",
                api_pb2.CommitCursorRequest(stream="api", subscription="cursor", sequence=1),
            ),
        ]:
            code, detail = await code_of(fport, call, request)
            assert code == grpc.StatusCode.OK, (call, detail)
        code, detail = await code_of(
            fport, "TriggerSnapshot", api_pb2.TriggerSnapshotRequest(stream="api")
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION and repr(leader.holder) in detail


async def test_malformed_markers_are_counted_skipped_and_change_nothing(world2: World) -> None:
    vs, west, east = world2.stream("junk"), world2.js("west"), world2.js("east")
    east_sidecar = world2.sidecars["east"]
    await create_durable(west, vs, "west", DURABLE)
    await publish_paced(
        world2.conns["west"], world2.sidecars["west"], vs, payloads("junk", 4), batch=2
    )
    await consume(west, vs, "west", DURABLE, 3)

    async def created_in_east() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) >= 0

    await wait_until(created_in_east, "the durable to be created in east", DEADLINE_S)
    # The update that created it may be followed by one that moves it (a snapshot's, or a
    # vector read later): take east's state once no update arrived for ten intervals.
    loop = asyncio.get_running_loop()
    since, last = loop.time(), (-1, -1)

    async def no_more_updates() -> bool:
        nonlocal since, last
        state = (
            await ack_floor(east, vs, "east", DURABLE),
            await applied_from(east_sidecar, vs, DURABLE, "west"),
        )
        if state != last:
            since, last = loop.time(), state
        return loop.time() - since >= 10 * INTERVAL_MS / 1000

    await wait_until(no_more_updates, "east's durable to settle", DEADLINE_S)
    floor = await ack_floor(east, vs, "east", DURABLE)
    applied = await applied_from(east_sidecar, vs, DURABLE, "west")

    async def rejected(reason: str) -> float:
        return await metric(
            east_sidecar, "rsub_markers_rejected_total", stream="junk", reason=reason
        )

    before = {r: await rejected(r) for r in ("malformed", "unknown_region")}
    foreign = Marker("mars", "junk", 1, Request(SnapshotId("mars", 1, 1), 1))
    for i, data in enumerate([b"\xff\x00garbage", encode(foreign)]):
        await west.publish(
            vs.marker_subject("west"),
            data,
            stream=vs.write_stream("west"),
            headers={"Nats-Msg-Id": f"junk-by-hand-{i}"},
        )

    async def counted() -> bool:
        return all([await rejected(r) == before[r] + 1 for r in before])

    await wait_until(counted, "east to count both junk markers", DEADLINE_S)
    assert await ack_floor(east, vs, "east", DURABLE) == floor
    assert await applied_from(east_sidecar, vs, DURABLE, "west") == applied

    # The sidecars carry on: the next snapshot and update still move east forward.
    await publish_paced(
        world2.conns["west"], world2.sidecars["west"], vs, payloads("after", 2), batch=2
    )
    await consume(west, vs, "west", DURABLE, 3)

    async def moved() -> bool:
        return await ack_floor(east, vs, "east", DURABLE) > floor

    await wait_until(moved, "east to move after the junk", DEADLINE_S)
    with pytest.raises(NotFoundError):
        await east.consumer_info(vs.read_stream("east"), "mars")


# ---- acks above the floor (docs/protocol.md §6) ---------------------------------------------
# Eight parallel workers in west ack out of order, one message never acked (a poisoned one
# holding the floor). East's sidecar receives west's vector and the ranges acked above it;
# after a failover to east the native durable delivers again everything above the floor, the
# exact client with the vector alone the same, and with the ranges only the message never
# acked.

WORKERS_DURABLE = "workers"
MESSAGES = 80
WORKERS = 8
POISONED = 3  # the fourth message delivered is never acked


def origin(vs: VirtualStream, headers: Mapping[str, str] | None) -> tuple[str, int] | None:
    source = (headers or {}).get(SOURCE_HEADER)
    return vs.origin_of(source) if source else None


async def test_parallel_workers_and_one_message_never_acked(world2: World) -> None:
    vs, west, east = world2.stream("parallel"), world2.js("west"), world2.js("east")
    await create_durable(west, vs, "west", WORKERS_DURABLE)
    await create_durable(east, vs, "east", WORKERS_DURABLE)
    await publish(west, vs, "west", [f"p-{i}".encode() for i in range(MESSAGES)])

    sub = await west.pull_subscribe_bind(WORKERS_DURABLE, stream=vs.read_stream("west"))
    fetched: list[Msg] = []

    async def all_fetched() -> bool:
        with contextlib.suppress(nats.errors.TimeoutError):
            fetched.extend(await sub.fetch(MESSAGES - len(fetched), timeout=0.5))
        return len(fetched) >= MESSAGES

    await wait_until(all_fetched, "west's workers fetch every message", DEADLINE_S)
    poisoned = fetched[POISONED]
    rest = [m for m in fetched if m is not poisoned]
    random.Random(7).shuffle(rest)

    async def worker(k: int) -> None:
        for msg in rest[k::WORKERS]:
            await msg.ack_sync()

    await asyncio.gather(*(worker(k) for k in range(WORKERS)))
    address = f"127.0.0.1:{world2.sidecars['east'].grpc_port}"
    acked = [origin(vs, m.headers) for m in rest]

    async def ranges_arrived() -> bool:
        try:
            progress = await progress_of(address, vs.name, WORKERS_DURABLE)
        except SidecarError:
            return False  # not listed there yet
        return all(covered(o, progress) for o in acked)

    await wait_until(ranges_arrived, "east covers every message acked in west", DEADLINE_S)
    progress = await progress_of(address, vs.name, WORKERS_DURABLE)
    assert not covered(origin(vs, poisoned.headers), progress)

    async def east_moved() -> bool:  # over what the vector covers, at its next read
        return await ack_floor(east, vs, "east", WORKERS_DURABLE) > 0

    await wait_until(east_moved, "the vector to move the durable in east", DEADLINE_S)

    # West is lost. East's durable stands where the vector moved it: below the poisoned one.
    read = vs.read_stream("east")
    floor = (await east.consumer_info(read, WORKERS_DURABLE)).ack_floor.stream_seq
    last = (await east.stream_info(read)).state.last_seq
    above = [await east.get_msg(read, seq) for seq in range(floor + 1, last + 1)]
    data = [origin(vs, m.headers) for m in above if (m.subject or "").startswith(f"{vs.name}.")]
    native = sum(1 for o in data if o in acked)
    by_vector = sum(1 for o in data if o in acked and not covered(o, dict(progress)))
    exact = ExactConsumer(
        await east.pull_subscribe_bind(WORKERS_DURABLE, stream=read), progress, vs
    )
    delivered: list[Msg] = []
    while True:
        try:
            delivered.extend(await exact.fetch(MESSAGES, timeout=2))
        except nats.errors.TimeoutError:
            break
    for msg in delivered:
        await msg.ack()
    print(
        f"\nparallel workers, one message never acked: delivered again in east {native} "
        f"(native durable), {by_vector} (exact client, the vector alone), "
        f"{len(delivered) - 1} (exact client, with the acked ranges); "
        f"the message never acked delivered: {[m.data for m in delivered]}"
    )
    assert [m.data for m in delivered] == [poisoned.data]  # nothing lost, nothing twice
    assert native == by_vector == exact.skipped > MESSAGES // 2
