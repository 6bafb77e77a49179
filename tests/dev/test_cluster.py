"""The local super-cluster: real nats-server processes, JetStream in every region."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import Placement, StreamConfig, StreamSource

from rsub_dev.cluster import ClusterError, ClusterFactory, LocalSuperCluster
from rsub_dev.ports import free_ports

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


async def gateway_peers(cluster: LocalSuperCluster, region: str) -> tuple[set[str], set[str]]:
    """Regions that `region`'s first server has (outbound, inbound) gateway connections to."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{cluster.monitors(region)[0]}/gatewayz") as resp,
    ):
        gatewayz = await resp.json()
    return set(gatewayz["outbound_gateways"]), set(gatewayz["inbound_gateways"])


async def test_cut_link_partitions_and_restore_resumes(make_cluster: ClusterFactory) -> None:
    cluster3 = await make_cluster(["west", "central", "east"])  # proxied links
    await make_sourced_pair(cluster3, "west", "east")
    await publish(cluster3, "west", 5)
    async with connect(cluster3, "east") as east:
        await wait_for_count(east, "dst", 5, within_s=20)

        await cluster3.cut_link("west", "east")
        await publish(cluster3, "west", 5, start=5)
        # Nothing may cross while cut; gateways must not find a way around the proxies
        # (gossiped URLs), while the links to central stay up.
        for _ in range(15):
            assert (await east.jetstream().stream_info("dst")).state.messages == 5
            outbound, inbound = await gateway_peers(cluster3, "west")
            assert outbound == inbound == {"central"}
            await asyncio.sleep(0.2)

        await cluster3.restore_link("west", "east")
        await cluster3.wait_ready()
        await cluster3.wait_sources_active(regions=["east"])
        await wait_for_count(east, "dst", 10, within_s=60)
    outbound, inbound = await gateway_peers(cluster3, "west")
    assert outbound == inbound == {"central", "east"}


async def test_link_delay_slows_but_delivers(make_cluster: ClusterFactory) -> None:
    cluster2 = await make_cluster(["west", "east"])  # proxied links
    delay_s = 0.3
    async with connect(cluster2, "west") as west, connect(cluster2, "east") as east:

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data)

        await east.subscribe("echo", cb=echo)
        await east.flush()
        # Wait until the subscription's interest has crossed the gateway.
        deadline = time.monotonic() + 20
        while True:
            try:
                await west.request("echo", b"warm-up", timeout=1)
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                assert time.monotonic() < deadline, "echo never reachable from west"
                await asyncio.sleep(0.1)

        await cluster2.set_link_delay("west", "east", delay_s)
        started = time.monotonic()
        reply = await west.request("echo", b"ping", timeout=10)
        delayed_rtt_s = time.monotonic() - started
        assert reply.data == b"ping"
        # Request and reply each cross one delayed direction.
        assert delayed_rtt_s >= 2 * delay_s

        await cluster2.set_link_delay("west", "east", 0)
        assert (await west.request("echo", b"again", timeout=5)).data == b"again"


async def test_stop_and_start_region_keeps_data(cluster3: LocalSuperCluster) -> None:
    await make_sourced_pair(cluster3, "west", "east")
    await publish(cluster3, "west", 10)
    west_pids = set(cluster3.pids())
    await cluster3.stop_region("west")
    assert len(cluster3.pids()) == 2
    with pytest.raises(ClusterError, match="already running"):
        await cluster3.start_server("east", 0)

    await cluster3.start_region("west")
    await cluster3.wait_ready()
    assert set(cluster3.pids()) != west_pids
    async with connect(cluster3, "west") as nc:
        info = await nc.jetstream().stream_info("src")
    assert info.state.messages == 10
    assert info.cluster is not None and info.cluster.name == "west"


async def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="regions: 'no way'"):
        LocalSuperCluster(["no way"], tmp_path)
    with pytest.raises(ValueError, match="one region with one server"):
        LocalSuperCluster(["solo"], tmp_path)
    with pytest.raises(ValueError, match="duplicate"):
        LocalSuperCluster(["a", "a"], tmp_path)
    with pytest.raises(ValueError, match="max_file"):
        LocalSuperCluster(["a", "b"], tmp_path, max_file="lots")
    cluster = LocalSuperCluster(["a", "b"], tmp_path, proxy_gateways=False)
    with pytest.raises(ClusterError, match="'c' is not part"):
        cluster.servers("c")


async def test_start_retries_when_a_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    handed_out: list[list[int]] = []

    def ports_with_one_taken(count: int) -> list[int]:
        ports = free_ports(count)
        if not handed_out:
            ports[0] = taken  # the first server's client port
        handed_out.append(ports)
        return ports

    monkeypatch.setattr("rsub_dev.cluster.free_ports", ports_with_one_taken)
    try:
        async with LocalSuperCluster(["west", "east"], tmp_path) as cluster:
            assert len(handed_out) == 2
            assert cluster.servers("west") == [f"nats://127.0.0.1:{handed_out[1][0]}"]
            with pytest.raises(ClusterError, match="already started"):
                await cluster.start()
    finally:
        squatter.close()
    assert "address already in use" in (tmp_path / "west-0.log").read_text()
