"""Failover of a Spark query between regions through the real sidecars (no test double).

A two-region super-cluster runs one real sidecar per region. The `orders_totals` pipeline
consumes in west and commits its progress to west's sidecar; the subscription is replicated
to east by the PIP-33 snapshots; west is lost; a fresh query in east starts where the
subscription stands there. Spark calls block, so they run in threads while the event loop
keeps the cluster's gateway proxies and the sidecars going.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import DeliverPolicy
from pyspark.sql import SparkSession

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars
from sidecar.naming import VirtualStream
from spark_jobs import orders_totals
from spark_jobs.rsub_spark import SidecarClient, SidecarError
from tests.support.spark_helpers import Published, publish_orders, wait_sourced

pytestmark = [pytest.mark.spark, pytest.mark.integration]

STREAM = "orders"


def run_totals(spark: SparkSession, options: dict[str, str], table: str, checkpoint: str) -> int:
    """One availableNow run of the pipeline; the number of rows it read."""
    query, listener = orders_totals.start(
        spark, options, table, checkpoint, available_now=True, query_name=Path(checkpoint).name
    )
    try:
        query.awaitTermination(120)
        assert listener is not None and listener.wait_for_query(query, timeout_s=30)
        return sum(int(p["numInputRows"]) for p in query.recentProgress)
    finally:
        query.stop()
        if listener is not None:
            spark.streams.removeListener(listener)


async def covered_in(
    nc: NATS, vstream: VirtualStream, region: str, sidecar: str, wanted: int
) -> int:
    """Waits until `region`'s subscription position covers `wanted` data messages."""
    js = nc.jetstream()
    client = SidecarClient(sidecar)
    deadline = time.monotonic() + 60
    try:
        while True:
            mark = 0
            with contextlib.suppress(SidecarError):
                view = await asyncio.to_thread(client.subscription, STREAM, "billing")
                mark = view.mark_delete
            covered = 0
            if mark:
                info = await js.stream_info(
                    vstream.read_stream(region), subjects_filter=vstream.data_filter()
                )
                held = sum((info.state.subjects or {}).values())
                after: int | None = 0
                if mark < info.state.last_seq:
                    consumer = await js.add_consumer(
                        vstream.read_stream(region),
                        filter_subject=vstream.data_filter(),
                        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=mark + 1,
                        inactive_threshold=5,
                    )
                    after = consumer.num_pending
                    await js.delete_consumer(vstream.read_stream(region), consumer.name)
                covered = held - (after or 0)
            assert covered <= wanted, f"{region} skips messages nobody consumed"
            if covered == wanted:
                return mark
            if time.monotonic() > deadline:
                raise TimeoutError(f"{region} covers {covered} of {wanted} consumed messages")
            await asyncio.sleep(0.2)
    finally:
        client.close()


async def test_a_fresh_query_in_another_region_continues_the_subscription(
    cluster2: LocalSuperCluster, spark: SparkSession, tmp_path: Path
) -> None:
    vstream = VirtualStream(STREAM, ("west", "east"))
    table = str(tmp_path / "orders")
    async with RegionSidecars(cluster2, streams=[STREAM], interval_ms=200) as sidecars:
        west_sidecar = f"127.0.0.1:{sidecars['west'].grpc_port}"
        east_sidecar = f"127.0.0.1:{sidecars['east'].grpc_port}"
        nc = await nats.connect(cluster2.servers("east"))
        try:
            # The topology makes read streams allow direct gets: they let the east query read
            # while east is cut off from the meta leader.
            published: list[Published] = await publish_orders(nc, vstream, 60, markers=False)
            await wait_sourced(nc, vstream, 60, region="west")
            west_options = {
                "servers": ",".join(cluster2.servers("west")),
                "stream": STREAM,
                "region": "west",
                "subscription": "billing",
                "sidecar": west_sidecar,
                "startingOffsets": "earliest",
            }
            # A running query: its batches move on past the snapshot markers that follow the
            # data, so the subscription can be carried by a snapshot to east.
            query, listener = await asyncio.to_thread(
                orders_totals.start,
                spark,
                west_options,
                table,
                str(tmp_path / "west"),
                trigger_interval="300 milliseconds",
                query_name="west",
            )
            try:
                await wait_sourced(nc, vstream, 60, region="east")
                await covered_in(nc, vstream, "east", east_sidecar, 60)
            finally:
                await asyncio.to_thread(query.stop)
                if listener is not None:
                    spark.streams.removeListener(listener)
            assert spark.read.parquet(table).count() == 60
            published += await publish_orders(nc, vstream, 40, first_index=60, markers=False)
            await wait_sourced(nc, vstream, 100, region="east")
            # East's position still covers the 60 consumed orders, and only them.
            await covered_in(nc, vstream, "east", east_sidecar, 60)
        finally:
            await nc.close()

        await sidecars.stop("west")
        await cluster2.stop_region("west")
        east_options = {
            "servers": ",".join(cluster2.servers("east")),
            "stream": STREAM,
            "region": "east",
            "subscription": "billing",
            "sidecar": east_sidecar,
            "startingOffsets": "subscription",
        }
        read_in_east = await asyncio.to_thread(
            run_totals, spark, east_options, table, str(tmp_path / "east")
        )

    # East started right after the subscription's position: the 40 new orders, no duplicate.
    assert read_in_east == 40
    assert await asyncio.to_thread(lambda: spark.read.parquet(table).count()) == 100
    expected: dict[str, int] = {}
    for pub in published:
        order = json.loads(pub.data)
        expected[order["key"]] = expected.get(order["key"], 0) + order["amount"]
    got = await asyncio.to_thread(
        lambda: {r.key: r.total for r in orders_totals.totals(spark, table).collect()}
    )
    assert got == expected
