"""Moving a durable forward must never rewind an active consumer's delivery.

`CONSUMER.RESET` sets the delivered pointer too: a reset to a sequence below what the consumer
has already delivered redelivers those messages and leaves the acks in flight unanswered
(an AckSync for them times out). A sidecar applies updates while an application consumes
(for instance when the region that sent them is still alive), so this happens in practice.
"""

from __future__ import annotations

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from rsub_dev.cluster import LocalSuperCluster
from sidecar.nats.consumers import move_forward
from sidecar.nats.nats_port import NatsPort

pytestmark = pytest.mark.integration


async def test_moving_forward_does_not_rewind_what_was_delivered(
    cluster2: LocalSuperCluster,
) -> None:
    cluster = cluster2
    nc = await nats.connect(cluster.servers("west"))
    try:
        js = nc.jetstream()
        await js.add_stream(name="s", subjects=["s.>"], max_consumers=10)
        for i in range(6):
            await js.publish("s.x", f"m{i}".encode())
        await js.add_consumer(
            "s",
            ConsumerConfig(
                durable_name="d",
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
            ),
        )
        sub = await js.pull_subscribe_bind("d", stream="s")
        in_flight = await sub.fetch(4, timeout=5)
        await in_flight[0].ack_sync(timeout=5)

        # Ack floor 1, delivered 4: position 2 is behind the delivery.
        outcome = await move_forward(NatsPort(nc), "s", "d", 2)

        assert not outcome.moved
        for msg in in_flight[1:]:
            await msg.ack_sync(timeout=5)
        [after] = await sub.fetch(1, timeout=5)
        assert after.data == b"m4"
    finally:
        await nc.close()
