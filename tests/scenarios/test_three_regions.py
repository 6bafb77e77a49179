"""Three regions: the two-round snapshot, and a durable that fails over twice (west, central,
east) without losing a message. Real servers and one sidecar per region."""

from __future__ import annotations

import pytest

from rsub_dev.sidecars import in_flight_count, read_markers, read_stored, wait_until
from sidecar.protocol import Marker, Request, Response
from sidecar.runtime import Runtime
from tests.support.scenario_kit import (
    DEADLINE_S,
    World,
    applied_from,
    consume,
    consume_all,
    create_durable,
    duplicate_bound,
    duplicates,
    publish,
    snapshot_past_data,
    snapshot_used,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

DURABLE = "app"


async def test_two_round_snapshots_and_a_consumer_failing_over_twice(world3: World) -> None:
    vs = world3.stream("rounds")
    js = {r: world3.js(r) for r in world3.cluster.regions}
    west, central = world3.sidecars["west"], world3.sidecars["central"]
    east = world3.sidecars["east"]
    await create_durable(js["west"], vs, "west", DURABLE)
    sent: list[bytes] = []

    async def publish_batch(batch: int, paced_by: Runtime) -> None:
        """3 messages from every region, then a snapshot of `paced_by` past all of them."""
        for region in world3.cluster.regions:
            payloads = [f"{region}-{batch}-{i}".encode() for i in range(3)]
            await publish(js[region], vs, region, payloads)
            sent.extend(payloads)
        read_stream = vs.read_stream(paced_by.region)

        async def arrived() -> bool:
            stored = await read_stored(world3.conns[paced_by.region], read_stream, vs.data_filter())
            return len(stored) == len(sent)

        await wait_until(arrived, f"batch {batch} in {paced_by.region}", DEADLINE_S)
        await snapshot_past_data(world3.conns[paced_by.region], paced_by, vs)

    for batch in range(3):
        await publish_batch(batch, west)
    in_west = await consume(js["west"], vs, "west", DURABLE, 12)

    async def central_has_it() -> bool:
        return await applied_from(central, vs, DURABLE, "west") >= 0

    await wait_until(central_has_it, "west's update to reach central", DEADLINE_S)
    used_by_central = await snapshot_used(central, west, vs, DURABLE)
    # Producers go on; central's snapshots (it has the durable now) cover only data that
    # arrives after them: one snapshot first, then a batch, and central consumes into it.
    await snapshot_past_data(world3.conns["central"], central, vs)
    await publish_batch(3, central)
    from_central_before = await applied_from(east, vs, DURABLE, "central")
    info = await js["central"].consumer_info(vs.read_stream("central"), DURABLE)
    in_central = await consume(js["central"], vs, "central", DURABLE, info.num_pending - 3)

    async def east_follows_central() -> bool:
        return await applied_from(east, vs, DURABLE, "central") > from_central_before

    await wait_until(east_follows_central, "central's update to reach east", DEADLINE_S)
    consumed = {d.payload for d in in_west + in_central}
    in_east = await consume_all(js["east"], vs, "east", DURABLE, set(sent) - consumed)

    everything = in_west + in_central + in_east
    assert used_by_central is not None
    # Consumed in west after the snapshot started, plus what was still on its way to central
    # from the other regions then (sourcing lags behind the snapshot's request).
    first_hop = duplicate_bound(in_west, used_by_central) + await in_flight_count(
        world3.conns,
        vs,
        "central",
        used_by_central.positions["central"],
        used_by_central.completed_unix_ms - used_by_central.duration_ms,
        ["central", "east"],
    )
    print(
        f"rounds: received {len(everything)} of {len(sent)}, duplicates "
        f"{duplicates(everything)} (west->central bound {first_hop})"
    )
    assert {d.payload for d in everything} == set(sent)
    assert duplicates(in_west + in_central) <= first_hop

    # Two rounds: every completed snapshot of west has its two requests in west's read stream
    # and both other regions answered both rounds; positions name both other regions.
    snapshots = await west.list_snapshots(vs.name)
    assert snapshots
    assert all(set(s.positions) == {"central", "east"} for s in snapshots)
    markers = [m.marker for m in await read_markers(world3.conns["west"], vs, "west")]
    requests = {
        (str(m.body.id), m.body.round)
        for m in markers
        if isinstance(m, Marker) and isinstance(m.body, Request) and m.region == "west"
    }
    answers = {
        (str(m.body.id), m.body.round, m.region)
        for m in markers
        if isinstance(m, Marker) and isinstance(m.body, Response) and m.body.id.region == "west"
    }
    for snapshot in snapshots:
        assert {(snapshot.id, 1), (snapshot.id, 2)} <= requests
        for region in ("central", "east"):
            assert {(snapshot.id, 1, region), (snapshot.id, 2, region)} <= answers
