"""`LocalSubscriptions` reads positions only from consumers' leaders (three-server region).

A clustered server lists a consumer it could not ask with an empty state and no leader:
one whose servers are all offline (here an R1 durable whose server was shut down, as a
rolling restart does). Read as a position, its "nothing pending" said the whole stream
was consumed, and under an empty name, while the durable itself dropped out of the read
(the machine would take it for deleted). Chaos seed 33 (docs/reliability.md, Findings)
showed the same kind of stateless answer from `CONSUMER.INFO`.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import nats
import pytest
from nats.aio.client import Client
from nats.js import api

from rsub_dev.cluster import ClusterFactory
from sidecar.naming import VirtualStream
from sidecar.nats.cursors import CursorStore
from sidecar.nats.nats_port import NatsPort
from sidecar.protocol import (
    HoldConsumer,
    MachineConfig,
    Output,
    PositionsListing,
    StreamMachine,
)
from sidecar.runtime.clock import wall_clock_ms
from sidecar.runtime.positions import LocalSubscriptions

pytestmark = pytest.mark.integration

VS = VirtualStream("orders", ("west",))


async def test_a_listing_names_the_lease_epoch_held_from_its_start_to_its_end(
    nc: Client,
) -> None:
    """The machine takes a consumption sign only from a read made wholly under its epoch
    (docs/protocol.md §8): a lease lost or taken again during the read gives 0."""
    js = nc.jetstream()
    await js.add_stream(name=VS.read_stream("west"), subjects=[VS.data_filter()])
    await js.create_key_value(bucket="cursors")
    store = CursorStore(await js.key_value("cursors"))
    for asked, epoch in [((7, 7), 7), ((7, 9), 0), ((0, 7), 0), ((7, 0), 0), ((0, 0), 0)]:
        subscriptions = LocalSubscriptions(VS, "west", wall_clock_ms, partial(next, iter(asked)))
        listing = await subscriptions.read(NatsPort(nc), store, 0)
        assert listing.lease_epoch == epoch, asked
        assert subscriptions.listing({}).lease_epoch == epoch  # a cursor commit's


async def test_a_durable_whose_servers_are_all_down_keeps_its_last_read_and_no_position(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west"], servers_per_region=3)
    nc = await nats.connect(cluster.servers("west"))
    try:
        js = nc.jetstream()
        stream = VS.read_stream("west")
        await js.add_stream(name=stream, subjects=[VS.data_filter()], num_replicas=3)
        await js.add_consumer(
            stream,
            durable_name="app0",
            ack_policy=api.AckPolicy.EXPLICIT,
            num_replicas=1,
            metadata={"rsub.replicate": "true"},
        )
        for i in range(20):
            await js.publish("orders.west.x", str(i).encode(), stream=stream)
        sub = await js.pull_subscribe_bind("app0", stream=stream)
        for msg in await sub.fetch(5, timeout=5):
            await msg.ack_sync()
        await js.create_key_value(bucket="cursors", replicas=3)
        subscriptions = LocalSubscriptions(VS, "west", wall_clock_ms, lambda: 0)
        store = CursorStore(await js.key_value("cursors"))
        assert (await subscriptions.read(NatsPort(nc), store, 0)).positions == {"app0": 5}
        known = subscriptions.durables["app0"]

        info = await js.consumer_info(stream, "app0")
        assert info.cluster is not None and info.cluster.leader is not None
        index = int(info.cluster.leader.rsplit("-", 1)[1])
        await nc.close()
        others = [url for i, url in enumerate(cluster.servers("west")) if i != index]
        nc = await nats.connect(others)
        await cluster.stop_server("west", index, kill=False)

        store = CursorStore(await nc.jetstream().key_value("cursors"))
        listing = await subscriptions.read(NatsPort(nc), store, 0)
        assert listing.positions == {}, "a position read from a consumer nobody could ask"
        assert listing.subscriptions == {"app0": known}
        assert subscriptions.durables == {"app0": known}
    finally:
        await nc.close()


async def test_a_fresh_read_stream_with_a_region_down_holds_nothing(
    make_cluster: ClusterFactory,
) -> None:
    """A first deployment in west while east is down: west's new read stream (three
    replicas) sources east's write stream, which does not exist yet (never heard from:
    `active` -1), and its leader is recent; but it is the stream's first, elected with it
    (docs/protocol.md §7), so west's leader holds nothing. Without the stream's creation
    time the same listing is taken for a return."""
    vs = VirtualStream("orders", ("west", "east"))
    cluster = await make_cluster(["west"], servers_per_region=3)
    nc = await nats.connect(cluster.servers("west"))
    try:
        js = nc.jetstream()
        stream = vs.read_stream("west")
        await js.add_stream(
            name=stream,
            num_replicas=3,
            sources=[api.StreamSource(name=vs.write_stream("east"))],
        )
        await js.add_consumer(
            stream,
            durable_name="app",
            ack_policy=api.AckPolicy.EXPLICIT,
            metadata={"rsub.replicate": "true"},
        )
        await js.create_key_value(bucket="cursors", replicas=3)
        subscriptions = LocalSubscriptions(vs, "west", wall_clock_ms, lambda: 0)
        store = CursorStore(await js.key_value("cursors"))
        listing = await subscriptions.read(NatsPort(nc), store, 0)
    finally:
        await nc.close()
    assert listing.sources == {"east": None} and listing.leader_age_ms is not None
    assert listing.stream_age_ms is not None

    def first_read(listing_read: PositionsListing) -> list[Output]:
        machine = StreamMachine(MachineConfig("west", vs.name, vs.regions))
        machine.tick(wall_clock_ms())
        machine.became_leader(1)
        return [o for o in machine.read_done(listing_read) if isinstance(o, HoldConsumer)]

    assert first_read(listing) == []
    assert first_read(dataclasses.replace(listing, stream_age_ms=None)) == [
        HoldConsumer("app", 120_000)
    ]
