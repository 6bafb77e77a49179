"""The local super-cluster: real nats-server processes, JetStream in every region."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import Placement, StreamConfig, StreamSource

from sidecar.dev.cluster import ClusterFactory, LocalSuperCluster

pytestmark = pytest.mark.integration


@asynccontextmanager
async def connect(cluster: LocalSuperCluster, region: str) -> AsyncIterator[Client]:
    nc = await nats.connect(servers=cluster.servers(region), max_reconnect_attempts=-1)
    try:
        yield nc
    finally:
        await nc.close()


async def wait_for_count(nc: Client, stream: str, count: int, within_s: float) -> None:
    js = nc.jetstream()
    deadline = time.monotonic() + within_s
    seen = -1
    while time.monotonic() < deadline:
        try:
            seen = (await js.stream_info(stream)).state.messages
        except (nats.errors.Error, TimeoutError):
            seen = -1
        if seen == count:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{stream} has {seen} messages, expected {count} within {within_s}s")


async def make_sourced_pair(cluster: LocalSuperCluster, origin: str, target: str) -> None:
    """`src` placed in `origin`, `dst` placed in `target` sourcing `src`."""
    async with connect(cluster, origin) as nc:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(name="src", subjects=["src.>"], placement=Placement(cluster=origin))
        )
        await js.add_stream(
            StreamConfig(
                name="dst", sources=[StreamSource(name="src")], placement=Placement(cluster=target)
            )
        )
        info = await js.stream_info("dst")
        assert info.cluster is not None and info.cluster.name == target


async def publish(cluster: LocalSuperCluster, region: str, count: int, start: int = 0) -> None:
    async with connect(cluster, region) as nc:
        js = nc.jetstream()
        for i in range(start, start + count):
            await js.publish("src.x", f"m{i}".encode())


async def test_three_regions_one_server_each(cluster3: LocalSuperCluster) -> None:
    described = cluster3.describe()
    assert list(described["regions"]) == ["west", "central", "east"]
    assert len(described["pids"]) == 3
    async with aiohttp.ClientSession() as http:
        for region in cluster3.regions:
            [monitor] = cluster3.monitors(region)
            async with http.get(f"{monitor}/varz") as resp:
                varz = await resp.json()
            assert varz["server_name"] == f"{region}-0"
            assert varz["cluster"]["name"] == region
            async with http.get(f"{monitor}/jsz") as resp:
                jsz = await resp.json()
            assert jsz["meta_cluster"]["cluster_size"] == 3
    # JetStream answers in every region, and a stream lands in the region it is placed in.
    for region in cluster3.regions:
        async with connect(cluster3, region) as nc:
            js = nc.jetstream()
            info = await js.add_stream(
                StreamConfig(
                    name=f"s-{region}",
                    subjects=[f"{region}.>"],
                    placement=Placement(cluster=region),
                )
            )
            assert info.cluster is not None and info.cluster.name == region


async def test_three_servers_per_region(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(["west", "east"], servers_per_region=3)
    assert len(cluster.servers("west")) == 3
    async with connect(cluster, "west") as nc:
        js = nc.jetstream()
        info = await js.add_stream(
            StreamConfig(
                name="r3", subjects=["r3.>"], num_replicas=3, placement=Placement(cluster="east")
            )
        )
        assert info.cluster is not None and info.cluster.name == "east"
        assert len(info.cluster.replicas or []) == 2


async def test_sourcing_across_regions(cluster3: LocalSuperCluster) -> None:
    await make_sourced_pair(cluster3, "west", "east")
    await publish(cluster3, "west", 10)
    async with connect(cluster3, "east") as nc:
        await wait_for_count(nc, "dst", 10, within_s=20)
