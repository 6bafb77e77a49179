"""`ConsumerSignals` against a real server: the ack signal is one message per `arm`, however
many acks are sent; advisories are followed all along."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from rsub_dev.sidecars import wait_until
from sidecar.nats.signals import ConsumerSignals

pytestmark = pytest.mark.integration

STREAM = "signals"


async def acks(nc: Client, count: int) -> None:
    """`count` acks as a client sends them (the server answers none: no such delivery)."""
    for i in range(count):
        await nc.publish(f"$JS.ACK.{STREAM}.app.1.{i + 1}.{i + 1}.0.0", b"+ACK")
    await nc.flush()


async def test_one_signal_per_arm_however_many_acks(nc: Client, js: JetStreamContext) -> None:
    await js.add_stream(name=STREAM, subjects=[f"{STREAM}.>"])
    moved: list[float] = []
    followed = ConsumerSignals(nc, STREAM, lambda: moved.append(1.0))
    await followed.start()
    try:
        await acks(nc, 200)

        async def signalled(n: int) -> bool:
            return len(moved) >= n

        await wait_until(lambda: signalled(1), "the first ack's signal")
        await asyncio.sleep(0.5)  # the other 199 would have come by now
        assert len(moved) == 1
        await followed.arm()
        await followed.arm()  # already waiting: no second subscription
        await acks(nc, 50)
        await wait_until(lambda: signalled(2), "a signal after arm")
        await asyncio.sleep(0.5)
        assert len(moved) == 2
        # An advisory signals without an arm (consumer created).
        await js.add_consumer(STREAM, api.ConsumerConfig(durable_name="app"))
        await wait_until(lambda: signalled(3), "the consumer advisory's signal")
    finally:
        await followed.close()
