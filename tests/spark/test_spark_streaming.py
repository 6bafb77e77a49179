"""The rsub source inside a real local Spark (one shared session): streaming, batch, commits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from sidecar._gen.rsub.v1 import api_pb2
from spark_jobs import orders_totals, rsub_spark
from tests.support.api_fakes import StateServer
from tests.support.nats_servers import LoneServer
from tests.support.spark_helpers import (
    Layout,
    SidecarDouble,
    create_layout,
    publish_orders,
    stored_messages,
    wait_sourced,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def fresh_layout(server: LoneServer, name: str, count: int) -> Layout:
    async def build() -> Layout:
        nc = await nats.connect(server.url)
        try:
            vstream = await create_layout(nc, name)
            published = await publish_orders(nc, vstream, count)
            last = await wait_sourced(nc, vstream, count)
            stored = await stored_messages(nc, vstream.read_stream("west"), last)
            return Layout(server.url, vstream, vstream.read_stream("west"), published, stored)
        finally:
            await nc.close()

    return asyncio.run(build())


def publish_more(layout: Layout, count: int) -> None:
    async def more() -> None:
        nc = await nats.connect(layout.url)
        try:
            first = len(layout.published)
            layout.published += await publish_orders(nc, layout.vstream, count, first_index=first)
            last = await wait_sourced(nc, layout.vstream, len(layout.published))
            layout.stored = await stored_messages(nc, layout.read_stream, last)
        finally:
            await nc.close()

    asyncio.run(more())


def options_of(layout: Layout, **extra: str) -> dict[str, str]:
    return {**layout.options(**extra), "stream": layout.vstream.name}


class Collector:
    """A foreachBatch sink keeping the rows of every batch, optionally failing one batch once."""

    def __init__(self, fail_batch: int | None = None) -> None:
        self.batches: dict[int, list[tuple[int, str, bytes]]] = {}
        self.failed_rows: list[tuple[int, str, bytes]] | None = None
        self._fail_batch = fail_batch

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [(r.sequence, r.subject, bytes(r.data)) for r in df.collect()]
        if batch_id == self._fail_batch and self.failed_rows is None:
            self.failed_rows = rows
            raise RuntimeError(f"sink fails batch {batch_id} once")
        self.batches[batch_id] = rows


def run_available_now(
    spark: SparkSession,
    options: dict[str, str],
    checkpoint: Path,
    sink: Callable[[DataFrame, int], None],
) -> Any:
    query = (
        spark.readStream.format("rsub")
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    except StreamingQueryException:
        pass  # the caller looks at query.exception()
    finally:
        query.stop()
    return query


def test_restart_from_checkpoint_replays_the_failed_batch_exactly(
    spark: SparkSession, nats_server: LoneServer, tmp_path: Path
) -> None:
    layout = fresh_layout(nats_server, "restarts", 60)
    options = options_of(layout, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    checkpoint = tmp_path / "checkpoint"

    failing = Collector(fail_batch=1)
    query = run_available_now(spark, options, checkpoint, failing)
    assert query.exception() is not None
    assert failing.failed_rows  # batch 1 was read, then the sink failed it

    publish_more(layout, 40)
    sink = Collector()
    run_available_now(spark, options, checkpoint, sink)
    # The restart replays batch 1 with exactly the rows of the failed attempt.
    assert sink.batches[1] == failing.failed_rows
    rows = [r for b in sorted(failing.batches) for r in failing.batches[b]]
    rows += [r for b in sorted(sink.batches) for r in sink.batches[b]]
    last = layout.stored[-1][0]
    assert rows == layout.data_between(0, last)
    assert len(rows) == 100


def test_batch_read_with_starting_and_ending_offsets(
    spark: SparkSession, orders_layout: Layout
) -> None:
    options = orders_layout.options(
        startingOffsets='{"sequence": 30}', endingOffsets='{"sequence": 150}', includeHeaders="true"
    )
    df = spark.read.format("rsub").options(**options).load()
    assert df.schema == rsub_spark.spark_schema(True)
    rows = df.orderBy("sequence").collect()
    assert [(r.sequence, r.subject, bytes(r.data)) for r in rows] == (
        orders_layout.data_between(29, 150)
    )
    assert {r.origin_region for r in rows} == {"west", "east"}
    prefix = f"{orders_layout.vstream.name}-write-"
    assert all(r.headers["Nats-Stream-Source"].startswith(prefix) for r in rows)
    # Headers the reader may see on the wire but that are not the message's own never show.
    assert all("Nats-Sequence" not in r.headers for r in rows)


def test_listener_commits_every_batch_including_the_last_of_available_now(
    spark: SparkSession, nats_server: LoneServer, sidecar_double: SidecarDouble, tmp_path: Path
) -> None:
    layout = fresh_layout(nats_server, "commits", 50)
    options = options_of(
        layout,
        subscription="billing",
        sidecar=sidecar_double.address,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="20",
    )
    listener = rsub_spark.attach_cursor_commits(spark, options)
    try:
        query = run_available_now(spark, options, tmp_path / "checkpoint", Collector())
        last = layout.stored[-1][0]
        assert listener.wait_for(last, timeout_s=30)
        ends = [
            json.loads(p["sources"][0]["endOffset"])["sequence"]
            for p in query.recentProgress
            if p["sources"][0]["endOffset"] is not None
        ]
        ends = sorted(set(ends))
        assert ends[-1] == last and len(ends) >= 3
        committed = [seq for (_, _, seq) in sidecar_double.backend.commits]
        assert committed == ends
        assert sidecar_double.backend.cursors[("commits", "billing")] == last
    finally:
        spark.streams.removeListener(listener)


def test_fresh_query_starts_after_the_subscription_position(
    spark: SparkSession, nats_server: LoneServer, sidecar_double: SidecarDouble, tmp_path: Path
) -> None:
    layout = fresh_layout(nats_server, "failover", 30)
    position = layout.data_between(0, 10_000)[11][0]  # the 12th data message
    sidecar_double.backend.cursors[("failover", "billing")] = position
    options = options_of(layout, subscription="billing", sidecar=sidecar_double.address)
    sink = Collector()
    run_available_now(spark, options, tmp_path / "checkpoint", sink)
    rows = [r for b in sorted(sink.batches) for r in sink.batches[b]]
    assert rows == layout.data_between(position, layout.stored[-1][0])
    assert len(rows) == 18


def test_subscription_start_drops_covered_rows_also_after_a_restart(
    spark: SparkSession, nats_server: LoneServer, tmp_path: Path
) -> None:
    layout = fresh_layout(nats_server, "exact", 40)  # west origin sequences 1..20
    # West 1..25 and east 1..8 were consumed elsewhere; west 21..25 reach this region later.
    progress = {"west": 25, "east": 8}
    state = api_pb2.GetSubscriptionResponse(
        stream="exact", subscription="billing", kind="external", progress=progress
    )
    sidecar = StateServer([state])
    options = options_of(layout, subscription="billing", sidecar=sidecar.address)
    origins: list[tuple[str, int]] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        origins.extend((r.origin_region, r.origin_sequence) for r in df.collect())

    try:
        run_available_now(spark, options, tmp_path / "checkpoint", sink)
        publish_more(layout, 20)  # west 21..30
        # The restart reads no subscription: the vector comes back with the checkpoint.
        run_available_now(spark, options, tmp_path / "checkpoint", sink)
    finally:
        sidecar.stop()
    published = [(p.region, p.origin_sequence) for p in layout.published]
    assert sorted(origins) == sorted(o for o in published if o[1] > progress[o[0]])
    assert [o for o in origins if o[0] == "west"] == [("west", s) for s in range(26, 31)]


def test_orders_totals_are_exact_under_redelivery(
    spark: SparkSession, nats_server: LoneServer, sidecar_double: SidecarDouble, tmp_path: Path
) -> None:
    layout = fresh_layout(nats_server, "totals", 40)
    expected: dict[str, int] = {}
    for pub in layout.published:
        order = json.loads(pub.data)
        expected[order["key"]] = expected.get(order["key"], 0) + order["amount"]
    table = str(tmp_path / "orders")
    options = options_of(
        layout, subscription="billing", sidecar=sidecar_double.address, startingOffsets="earliest"
    )

    def run(checkpoint: str) -> None:
        query, listener = orders_totals.start(
            spark, options, table, checkpoint, available_now=True, query_name=checkpoint[-3:]
        )
        try:
            query.awaitTermination(120)
            assert listener is not None and listener.wait_for_query(query, timeout_s=30)
        finally:
            query.stop()
            if listener is not None:
                spark.streams.removeListener(listener)

    run(str(tmp_path / "ck1"))
    got = {r.key: r.total for r in orders_totals.totals(spark, table).collect()}
    assert got == expected
    assert sidecar_double.backend.cursors[("totals", "billing")] == layout.stored[-1][0]
    # A fresh checkpoint from the start delivers every message again, as a failover may.
    run(str(tmp_path / "ck2"))
    assert {r.key: r.total for r in orders_totals.totals(spark, table).collect()} == expected
    assert spark.read.parquet(table).count() == 40
