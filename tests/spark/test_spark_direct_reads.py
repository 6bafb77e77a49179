"""The Spark source's direct-get reads on real servers (no Spark: the reader itself): a
lagging replica, and a region cut off from the JetStream meta leader.

A two-region super-cluster with one server per region loses its meta leader with either
region: the survivor's stream leaders still answer direct gets and `STREAM.INFO`, but
`STREAM.MSG.GET` answers 503 once the server has been leaderless for its lost-quorum
interval (10 s on nats-server 2.15).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pyarrow as pa
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import ServiceUnavailableError

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from sidecar.naming import VirtualStream
from sidecar.nats import jsapi
from sidecar.nats.topology import apply_topology
from spark_jobs.rsub_spark.nats_read import RsubReadError
from spark_jobs.rsub_spark.options import parse_options
from spark_jobs.rsub_spark.rows import spark_schema
from spark_jobs.rsub_spark.source import NO_PROGRESS, SequenceRange, read_range_batches
from tests.support.spark_helpers import wait_sourced

pytestmark = pytest.mark.integration

STREAM = "orders"
VSTREAM = VirtualStream(STREAM, ("west", "east"))
REGIONS_OF_FOUR = ["west", "east", "north", "south"]


def read_rows(opts: dict[str, str], start: int, end: int) -> list[dict[str, Any]]:
    parsed = parse_options(opts)
    batches = list(
        read_range_batches(parsed, spark_schema(False), SequenceRange(start, end, NO_PROGRESS))
    )
    return pa.Table.from_batches(batches).to_pylist() if batches else []


async def wait_msg_get_unavailable(nc: NATS, stream: str, timeout_s: float = 60) -> None:
    """Waits until the stream leader answers `STREAM.MSG.GET` with 503 (no meta leader)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await jsapi.msg_get(nc, stream, 1, timeout_s=2)
        except ServiceUnavailableError:
            return
        except TimeoutError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stream}: STREAM.MSG.GET still answers after {timeout_s} s")
        await asyncio.sleep(0.5)


async def lagging_mirror(nc: NATS, stream: str, region: str) -> None:
    """A mirror of `stream` in `region` that answers its direct gets (`mirror_direct`) once
    it caught up, and holds no more than the messages `stream` holds now: it lags behind
    every later one."""
    origin = await jsapi.request(nc, f"STREAM.INFO.{stream}", timeout_s=10)
    held = int(origin["state"]["messages"])
    mirror = f"{stream}-mirror"
    config = {
        "name": mirror,
        "mirror": {"name": stream},
        "mirror_direct": True,
        "placement": {"cluster": region},
        "max_msgs": held,
        "discard": "new",
    }
    await jsapi.request(nc, f"STREAM.CREATE.{mirror}", config, timeout_s=10)
    deadline = time.monotonic() + 30
    while (await jsapi.request(nc, f"STREAM.INFO.{mirror}", timeout_s=10))["state"][
        "messages"
    ] < held:
        assert time.monotonic() < deadline, f"{mirror} does not catch up with {stream}"
        await asyncio.sleep(0.1)


async def lagging_layout(cluster: LocalSuperCluster) -> tuple[NATS, dict[str, str], int]:
    """West's read stream (in cluster west) holds 20 data messages; a mirror of it in east
    holds the first 10. A reader in east asks its direct gets to the mirror (a server prefers
    the queue members of its own cluster). Returns a client in east, the reader's options
    and the read stream's last sequence."""
    read_stream = VSTREAM.read_stream("west")
    nc = await nats.connect(cluster.servers("east"))
    await apply_topology(nc, VSTREAM)
    js = nc.jetstream()
    for i in range(20):
        if i == 10:
            await wait_sourced(nc, VSTREAM, 10, region="west")
            await lagging_mirror(nc, read_stream, "east")
        await js.publish(VSTREAM.publish_subject("west", "k"), b"%d" % i)
    last = await wait_sourced(nc, VSTREAM, 20, region="west")
    opts = {"servers": ",".join(cluster.servers("east")), "stream": STREAM, "region": "west"}
    return nc, opts, last


@pytest.mark.parametrize("meta_leader", [True, False], ids=["meta-leader", "no-meta-leader"])
async def test_a_lagging_replica_never_shortens_a_range(
    make_cluster: ClusterFactory, meta_leader: bool
) -> None:
    """The mirror answers the first ten, then "no message": the stream leader says otherwise,
    or without a meta leader the rest is read over every subject, and the read fails rather
    than end early. West and east lose the meta leader with two regions of four."""
    cluster = await make_cluster(["west", "east"] if meta_leader else REGIONS_OF_FOUR)
    nc, opts, last = await lagging_layout(cluster)
    try:
        missed = r"keep missing sequence 11 \(a lagging replica\?\)"
        if not meta_leader:
            for region in REGIONS_OF_FOUR[2:]:
                await cluster.stop_region(region)
            await wait_msg_get_unavailable(nc, VSTREAM.read_stream("west"))
            missed = r"keep missing sequence 11 \(a lagging replica\?; no meta leader to ask\)"
        with pytest.raises(RsubReadError, match=missed):
            await asyncio.to_thread(read_rows, opts, 0, last)
    finally:
        await nc.close()


async def test_a_range_ending_in_markers_is_read_without_a_meta_leader(
    cluster2: LocalSuperCluster,
) -> None:
    read_stream = VSTREAM.read_stream("east")
    nc = await nats.connect(cluster2.servers("east"))
    try:
        await apply_topology(nc, VSTREAM)
        js = nc.jetstream()
        for i in range(30):
            await js.publish(VSTREAM.publish_subject("east", f"k{i % 3}"), b"%d" % i)
        await wait_sourced(nc, VSTREAM, 30, region="east")
        # Markers after the last data message: the direct gets find no data message before
        # the range's end, and the reader must make sure none is left there.
        for _ in range(3):
            await js.publish(VSTREAM.snapshot_subject("east"), b"snapshot", stream=read_stream)
        last = int((await js.stream_info(read_stream)).state.last_seq)
        opts = {"servers": ",".join(cluster2.servers("east")), "stream": STREAM, "region": "east"}
        before = await asyncio.to_thread(read_rows, opts, 0, last)
        assert [r["data"] for r in before] == [b"%d" % i for i in range(30)]

        await cluster2.stop_region("west")
        await wait_msg_get_unavailable(nc, read_stream)
        after = await asyncio.to_thread(read_rows, opts, 0, last)
        assert after == before
        # A range of markers only, too.
        assert await asyncio.to_thread(read_rows, opts, last - 2, last) == []
    finally:
        await nc.close()
