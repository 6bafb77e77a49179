"""End to end: one in-process `Runtime` per region on a real local super-cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from sidecar.config import Config
from sidecar.dev.cluster import LocalSuperCluster
from sidecar.runtime import Runtime

pytestmark = pytest.mark.integration

STREAM = "orders"
DURABLE = "app"


def sidecar_config(cluster: LocalSuperCluster, region: str, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "region": region,
        "regions": list(cluster.regions),
        "nats": {"servers": cluster.servers(region)},
        "streams": [{"name": STREAM}],
        "snapshot": {"interval_ms": 200, "timeout_s": 5},
        "lease": {"ttl_s": 3},
        "grpc": {"listen": "127.0.0.1:0"},
        "http": {"listen": "127.0.0.1:0"},
        **overrides,
    }
    return Config.from_mapping(data)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, limit_s: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def sidecars(cluster: LocalSuperCluster) -> AsyncIterator[dict[str, Runtime]]:
    runtimes: dict[str, Runtime] = {}
    try:
        # One after the other: the first applies the topology, the others find it in place.
        for region in cluster.regions:
            runtime = runtimes[region] = Runtime(sidecar_config(cluster, region))
            await runtime.start()
            await runtime.wait_ready(60)
        await eventually(all_lead(list(runtimes.values())), "leadership in every region")
        yield runtimes
    finally:
        await asyncio.gather(*(r.stop() for r in runtimes.values()))


def all_lead(runtimes: Sequence[Runtime]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(r.is_leader for r in runtimes)

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
    await js.add_consumer(
        f"{STREAM}-read-{region}",
        durable_name=DURABLE,
        filter_subject=f"{STREAM}.>",
        ack_policy=api.AckPolicy.EXPLICIT,
        metadata={"rsub.replicate": "true"},
    )
    return await js.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-{region}")


async def consume(sub: JetStreamContext.PullSubscription, n: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < n:
        with contextlib.suppress(nats.errors.TimeoutError):
            for msg in await sub.fetch(n - len(got), timeout=2):
                await msg.ack_sync()
                got.append(msg.data)
    return got


async def publish(js: JetStreamContext, region: str, payloads: Sequence[bytes]) -> None:
    for data in payloads:
        await js.publish(f"{STREAM}.{region}.item", data, stream=f"{STREAM}-write-{region}")


async def test_consumption_continues_in_the_other_region_without_loss(
    cluster2: LocalSuperCluster,
) -> None:
    async with sidecars(cluster2) as runtimes, clients(cluster2) as conns:
        west, east = conns["west"].jetstream(), conns["east"].jetstream()
        payloads = [f"m{i}".encode() for i in range(6)]
        sub_west = await replicated_durable(west, "west")

        await publish(west, "west", payloads[:3])
        consumed_west = await consume(sub_west, 3)

        # The west sidecar snapshots, sees the durable caught up and sends an update; the east
        # sidecar creates the durable right after the snapshot's position in east.
        async def created_in_east() -> bool:
            try:
                await east.consumer_info(f"{STREAM}-read-east", DURABLE)
            except NotFoundError:
                return False
            return True

        await eventually(created_in_east, "the durable to be created in east")
        info = await east.consumer_info(f"{STREAM}-read-east", DURABLE)
        assert info.config.metadata is not None
        assert info.config.metadata["rsub.replicate"] == "true"
        assert info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE

        await publish(west, "west", payloads[3:])
        sub_east = await east.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-east")
        consumed_east = await consume(sub_east, 3)
        with contextlib.suppress(nats.errors.TimeoutError):
            consumed_east += [m.data for m in await sub_east.fetch(10, timeout=1)]

        everything = consumed_west + consumed_east
        duplicates = len(everything) - len(set(everything))
        print(f"received {len(everything)} messages, {duplicates} duplicates")
        assert set(everything) == set(payloads)
        assert duplicates <= 3

        east_view = await runtimes["east"].get_subscription(STREAM, DURABLE)
        assert [a.from_region for a in east_view.applied] == ["west"]
        west_view = await runtimes["west"].get_subscription(STREAM, DURABLE)
        assert west_view.last_snapshot_id is not None
        assert await runtimes["west"].list_snapshots(STREAM)
