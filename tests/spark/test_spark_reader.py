"""The rsub reader against a real nats-server, without Spark: ranges, rows, offsets, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import pickle
from datetime import UTC, datetime
from typing import Any

import nats
import pyarrow as pa
import pytest
from nats.js.api import StreamConfig, StreamSource
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from rsub_dev.ports import free_ports
from sidecar._gen.rsub.v1 import api_pb2
from sidecar.naming import VirtualStream
from spark_jobs.rsub_spark.nats_read import (
    NatsSession,
    RsubDataLossError,
    RsubReadError,
    stream_bounds,
)
from spark_jobs.rsub_spark.options import RsubOptionError, parse_options
from spark_jobs.rsub_spark.rows import spark_schema
from spark_jobs.rsub_spark.source import (
    NO_PROGRESS,
    RsubBatchReader,
    RsubCheckpointError,
    RsubDataSource,
    RsubStreamReader,
    SequenceRange,
    read_range_batches,
)
from tests.support.api_fakes import StateServer
from tests.support.nats_servers import LoneServer
from tests.support.spark_helpers import (
    Layout,
    SidecarDouble,
    create_layout,
    publish_orders,
    wait_sourced,
)

pytestmark = pytest.mark.integration


def read_rows(opts: dict[str, str], start: int, end: int) -> list[dict[str, Any]]:
    parsed = parse_options(opts)
    schema = spark_schema(parsed.include_headers)
    batches = list(read_range_batches(parsed, schema, SequenceRange(start, end, NO_PROGRESS)))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def stream_reader(layout: Layout, **extra: str) -> RsubStreamReader:
    source = RsubDataSource(layout.options(**extra))
    return source.streamReader(source.schema())


def test_full_range_is_every_data_message_in_order_without_markers(orders_layout: Layout) -> None:
    last = orders_layout.stored[-1][0]
    rows = read_rows(orders_layout.options(), 0, last)
    expected = orders_layout.data_between(0, last)
    assert [(r["sequence"], r["subject"], r["data"]) for r in rows] == expected
    assert len(rows) == len(orders_layout.published) == 200
    # The stream really holds markers, so the filter was exercised.
    assert any(subject.startswith("_rsub.") for _, subject, _ in orders_layout.stored)
    assert all(not r["subject"].startswith("_rsub.") for r in rows)
    opts = parse_options(orders_layout.options())
    session = NatsSession(opts)
    try:
        bounds = session.run(lambda nc: stream_bounds(nc, opts))
    finally:
        session.close()
    # The fixture runs every test with both read paths: direct get, and a consumer.
    assert bounds.allow_direct == (orders_layout.vstream.name == "orders")


def test_rows_carry_the_origin_and_the_publish_time(orders_layout: Layout) -> None:
    last = orders_layout.stored[-1][0]
    rows = read_rows(orders_layout.options(includeHeaders="true"), 0, last)
    name = orders_layout.vstream.name
    by_origin = {(r["origin_region"], r["origin_sequence"]): r for r in rows}
    assert len(by_origin) == len(orders_layout.published)
    for pub in orders_layout.published:
        row = by_origin[(pub.region, pub.origin_sequence)]
        assert row["data"] == pub.data
        assert row["subject"] == f"{name}." + pub.subject.split(".", 2)[2]
        stamp = row["timestamp"]
        published_at = (pub.headers or {}).get("Rsub-Published-At")
        if published_at is None:
            assert abs((stamp - datetime.now(UTC)).total_seconds()) < 3600
        elif published_at.isdigit():
            assert stamp == datetime.fromtimestamp(int(published_at) / 1000, UTC)
        else:
            assert stamp == datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
        headers = dict(row["headers"] or [])
        assert headers.get("Nats-Stream-Source", "").startswith(f"{name}-write-{pub.region} ")
        for key, value in (pub.headers or {}).items():
            assert headers[key] == value


def test_origins_follow_custom_stream_patterns(nats_server: LoneServer) -> None:
    patterns = {"writeStreamPattern": "w_{region}_{name}", "readStreamPattern": "r_{region}_{name}"}

    async def origins(**extra: str) -> VirtualStream | None:
        nc = await nats.connect(nats_server.url)
        try:
            await create_layout(
                nc,
                "refunds",
                write_pattern=patterns["writeStreamPattern"],
                read_pattern=patterns["readStreamPattern"],
            )
            base = {"servers": nats_server.url, "stream": "refunds", "region": "west"}
            opts = parse_options({**base, **extra})
            assert opts.read_stream == "r_west_refunds"
            return (await stream_bounds(nc, opts)).origins
        finally:
            await nc.close()

    found = asyncio.run(origins(**patterns))
    assert found is not None and set(found.regions) == {"west", "east"}
    assert found.origin_of("w_east_refunds 7 refunds.east.>") == ("east", 7)
    # With the default write pattern the sources are not recognised: no origin columns, no guess.
    assert asyncio.run(origins(readStreamPattern=patterns["readStreamPattern"])) is None


@pytest.mark.parametrize("cuts", [[0, 37, 38, 120, 260], [0, 1, 2, 3, 500]])
def test_ranges_partition_the_stream_exactly_and_replay_identically(
    orders_layout: Layout, cuts: list[int]
) -> None:
    last = orders_layout.stored[-1][0]
    bounds = [min(c, last) for c in cuts]
    pieces = []
    for lo, hi in itertools.pairwise(bounds):
        first = read_rows(orders_layout.options(), lo, hi)
        assert first == read_rows(orders_layout.options(), lo, hi)  # a retry reads the same
        assert [(r["sequence"], r["subject"], r["data"]) for r in first] == (
            orders_layout.data_between(lo, hi)
        )
        pieces.extend(first)
    assert [r["sequence"] for r in pieces] == [s for s, _, _ in orders_layout.data_between(0, last)]


def test_a_range_of_markers_only_is_empty(orders_layout: Layout) -> None:
    markers = [s for s, subject, _ in orders_layout.stored if subject.startswith("_rsub.")]
    seq = next(m for m in markers if m > 5)
    assert read_rows(orders_layout.options(), seq - 1, seq) == []
    # A range ending on a marker stops at it without waiting for later data.
    rows = read_rows(orders_layout.options(), seq - 3, seq)
    assert [r["sequence"] for r in rows] == [
        s for s, _, _ in orders_layout.data_between(seq - 3, seq)
    ]


def test_offsets_limits_and_latest_cache(orders_layout: Layout, nats_server: LoneServer) -> None:
    last = orders_layout.stored[-1][0]
    first_data = orders_layout.data_between(0, last)[0][0]
    assert stream_reader(orders_layout).initialOffset() == {
        "stream": orders_layout.read_stream,
        "sequence": last,
    }
    assert stream_reader(orders_layout, startingOffsets="earliest").initialOffset()["sequence"] == 0
    assert (
        stream_reader(orders_layout, startingOffsets='{"sequence": 42}').initialOffset()["sequence"]
        == 41
    )
    reader = stream_reader(orders_layout, startingOffsets="earliest", maxOffsetsPerTrigger="50")
    try:
        start = reader.initialOffset()
        assert reader.getDefaultReadLimit() == ReadMaxRows(50)
        assert reader.latestOffset(start, ReadMaxRows(50))["sequence"] == 50
        assert reader.latestOffset(start, ReadAllAvailable())["sequence"] == last
        parts = reader.partitions(start, {"stream": orders_layout.read_stream, "sequence": 50})
        rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
        assert rows[0]["sequence"] == first_data
        assert [r["sequence"] for r in rows] == [s for s, _, _ in orders_layout.data_between(0, 50)]
        east = orders_layout.vstream.read_stream("east")
        with pytest.raises(RsubCheckpointError, match=f"read stream '{east}'"):
            reader.latestOffset({"stream": east, "sequence": 5}, ReadAllAvailable())
        with pytest.raises(RsubDataLossError, match="was the stream deleted and created again"):
            reader.latestOffset(
                {"stream": orders_layout.read_stream, "sequence": last + 1000}, ReadAllAvailable()
            )
        # The reader travels to executors by pickle, open connection or not.
        clone = pickle.loads(pickle.dumps(reader))
        assert clone.latestOffset(start, ReadMaxRows(10))["sequence"] == 10
    finally:
        reader.stop()


def test_latest_offset_is_cached_and_available_now_is_capped(nats_server: LoneServer) -> None:
    async def setup() -> Layout:
        nc = await nats.connect(nats_server.url)
        try:
            vstream = await create_layout(nc, "caching")
            published = await publish_orders(nc, vstream, 10)
            await wait_sourced(nc, vstream, 10)
            return Layout(nats_server.url, vstream, vstream.read_stream("west"), published)
        finally:
            await nc.close()

    async def more(layout: Layout, total: int) -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await publish_orders(nc, layout.vstream, total - 10, first_index=10)
            await wait_sourced(nc, layout.vstream, total)
        finally:
            await nc.close()

    layout = asyncio.run(setup())
    options = layout.options(startingOffsets="earliest", latestOffsetCacheMs="60000")
    options["stream"] = "caching"
    source = RsubDataSource(options)
    reader = source.streamReader(source.schema())
    try:
        start = reader.initialOffset()
        before = reader.latestOffset(start, ReadAllAvailable())
        reader.prepareForTriggerAvailableNow()
        asyncio.run(more(layout, 20))
        # Within the cache age, the answer is the cached one; after availableNow started, the
        # target never moves even when the cache refreshes.
        assert reader.latestOffset(start, ReadAllAvailable()) == before
        assert reader.reportLatestOffset() == before
    finally:
        reader.stop()
    fresh_options = {**options, "latestOffsetCacheMs": "0"}
    fresh = RsubDataSource(fresh_options).streamReader(source.schema())
    try:
        assert fresh.latestOffset(start, ReadAllAvailable())["sequence"] > before["sequence"]
    finally:
        fresh.stop()


def test_batch_reader_honours_starting_and_ending_offsets(orders_layout: Layout) -> None:
    source = RsubDataSource(
        orders_layout.options(
            startingOffsets='{"sequence": 20}',
            endingOffsets='{"sequence": 120}',
            maxRecordsPerPartition="40",
        )
    )
    reader = source.reader(source.schema())
    parts = reader.partitions()
    assert [(p.start, p.end) for p in parts] == [(19, 52), (52, 86), (86, 120)]
    rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
    assert [(r["sequence"], r["subject"], r["data"]) for r in rows] == (
        orders_layout.data_between(19, 120)
    )
    assert isinstance(reader, RsubBatchReader)


def test_unknown_stream_and_unreachable_servers_are_named(orders_layout: Layout) -> None:
    with pytest.raises(
        RsubReadError, match=rf"read stream '{orders_layout.vstream.name}-read-north'.*not found"
    ):
        stream_reader(orders_layout, region="north").initialOffset()
    dead = f"nats://127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(RsubReadError, match=f"cannot reach NATS at {dead}"):
        read_rows({**orders_layout.options(), "servers": dead}, 0, 10)
    with pytest.raises(RsubOptionError, match="unknown option 'startingoffset'"):
        RsubDataSource({**orders_layout.options(), "startingoffset": "earliest"}).schema()
    source = RsubDataSource(orders_layout.options(endingOffsets="latest"))
    with pytest.raises(RsubOptionError, match="endingOffsets is for batch reads only"):
        source.streamReader(source.schema())


def test_lost_sequences_fail_or_are_skipped(nats_server: LoneServer) -> None:
    async def setup() -> tuple[Layout, int]:
        nc = await nats.connect(nats_server.url)
        try:
            vstream = await create_layout(nc, "lossy")
            await publish_orders(nc, vstream, 30)
            last = await wait_sourced(nc, vstream, 30)
            js = nc.jetstream()
            await js.purge_stream(vstream.read_stream("west"), keep=10)
            info = await js.stream_info(vstream.read_stream("west"))
            return Layout(nats_server.url, vstream, vstream.read_stream("west")), int(
                info.state.first_seq
            ) if last else 0
        finally:
            await nc.close()

    layout, first = asyncio.run(setup())
    options = {**layout.options(), "stream": "lossy"}
    with pytest.raises(RsubDataLossError, match=rf"no longer holds sequences 1\.\.{first - 1}"):
        read_rows(options, 0, first + 5)
    rows = read_rows({**options, "failOnDataLoss": "false"}, 0, first + 5)
    assert rows and all(first <= r["sequence"] <= first + 5 for r in rows)
    earliest = RsubDataSource({**options, "startingOffsets": "earliest"})
    reader = earliest.streamReader(earliest.schema())
    try:
        assert reader.initialOffset()["sequence"] == first - 1
    finally:
        reader.stop()


def test_subscription_start_asks_the_sidecar(
    orders_layout: Layout, sidecar_double: SidecarDouble
) -> None:
    options = orders_layout.options(subscription="billing", sidecar=sidecar_double.address)
    with pytest.raises(
        RuntimeError,
        match=f"subscription 'billing' of stream '{orders_layout.vstream.name}' not found",
    ):
        stream_reader(orders_layout, **options).initialOffset()
    sidecar_double.backend.cursors[(orders_layout.vstream.name, "billing")] = 57
    assert stream_reader(orders_layout, **options).initialOffset() == {
        "stream": orders_layout.read_stream,
        "sequence": 57,
    }
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(RuntimeError, match=f"sidecar {dead} unreachable"):
        stream_reader(
            orders_layout, subscription="billing", sidecar=dead, timeoutMs="2000"
        ).initialOffset()


@pytest.mark.parametrize("streaming", [True, False])
def test_a_start_from_a_durable_consumer_is_refused_before_any_read(
    orders_layout: Layout, streaming: bool
) -> None:
    name = orders_layout.vstream.name
    durable = api_pb2.GetSubscriptionResponse(
        stream=name, subscription="billing", kind="durable", mark_delete=5
    )
    sidecar = StateServer([durable])
    options = orders_layout.options(subscription="billing", sidecar=sidecar.address)
    try:
        with pytest.raises(RsubOptionError) as refused:
            if streaming:
                stream_reader(orders_layout, **options).initialOffset()
            else:
                source = RsubDataSource(options)
                source.reader(source.schema()).partitions()
    finally:
        sidecar.stop()
    assert str(refused.value).startswith(
        f"option subscription: 'billing' is a durable consumer of stream '{name}' (sidecar "
        f"{sidecar.address}), not an external cursor: "
    )
    assert f"`rsub create-cursor {name} NAME --sidecar {sidecar.address}`" in str(refused.value)


def cursor_state(
    stream: str, position: int, progress: dict[str, int]
) -> api_pb2.GetSubscriptionResponse:
    """What the sidecar answers for the cursor `billing` at `position` with `progress`."""
    return api_pb2.GetSubscriptionResponse(
        stream=stream,
        subscription="billing",
        kind="external",
        mark_delete=position,
        progress=progress,
    )


def test_subscription_start_leaves_out_covered_rows_and_carries_the_vector_in_offsets(
    orders_layout: Layout,
) -> None:
    name, last = orders_layout.vstream.name, orders_layout.stored[-1][0]
    position = orders_layout.data_between(0, last)[39][0]  # the 40th data message
    every = read_rows(orders_layout.options(), position, last)
    # Each origin's vector covers half of its messages above the position.
    progress = {}
    for region in ("west", "east"):
        above = [r["origin_sequence"] for r in every if r["origin_region"] == region]
        progress[region] = above[len(above) // 2]
    state = cursor_state(name, position, progress)
    sidecar = StateServer([state])
    options = orders_layout.options(subscription="billing", sidecar=sidecar.address)
    reader = stream_reader(orders_layout, **options)
    try:
        vector = dict(sorted(progress.items()))
        start = reader.initialOffset()
        assert start == {
            "stream": orders_layout.read_stream,
            "sequence": position,
            "progress": vector,
        }
        start = json.loads(json.dumps(start))  # as the checkpoint gives it back
        end = reader.latestOffset(start, ReadAllAvailable())
        # Spark compares offsets as JSON text: the vector's keys keep their order.
        assert json.dumps(end) == json.dumps({**start, "sequence": last})
        rows = [
            r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()
        ]
        batch_source = RsubDataSource(options)
        batch = batch_source.reader(batch_source.schema())
        parts = batch.partitions()
        assert parts[0].start == position
        assert rows == [r for p in parts for b in batch.read(p) for r in b.to_pylist()]
    finally:
        reader.stop()
        sidecar.stop()
    kept = [r for r in every if r["origin_sequence"] > progress[r["origin_region"]]]
    assert rows == kept and 0 < len(kept) < len(every)


def test_subscription_start_also_leaves_out_rows_acked_above_other_regions_floors(
    orders_layout: Layout,
) -> None:
    """The ranges acked out of order elsewhere (docs/protocol.md §6) travel in the offsets
    with the vector, and their rows are left out as the vector's are."""
    name, last = orders_layout.vstream.name, orders_layout.stored[-1][0]
    position = orders_layout.data_between(0, last)[39][0]
    every = read_rows(orders_layout.options(), position, last)
    progress: dict[str, int] = {}
    acked: dict[str, list[int]] = {}
    for region in ("west", "east"):
        above = [r["origin_sequence"] for r in every if r["origin_region"] == region]
        progress[region] = above[len(above) // 4]
        # Every third message after the vector's, each a range of its own.
        acked[region] = [seq for seq in above[len(above) // 4 + 1 :: 3] for _ in range(2)]
    state = cursor_state(name, position, progress)
    for region, bounds in acked.items():
        state.acked[region].bounds.extend(bounds)
    sidecar = StateServer([state])
    options = orders_layout.options(subscription="billing", sidecar=sidecar.address)
    reader = stream_reader(orders_layout, **options)
    try:
        start = reader.initialOffset()
        assert start["acked"] == {
            r: [[b[i], b[i + 1]] for i in range(0, len(b), 2)] for r, b in sorted(acked.items())
        }
        start = json.loads(json.dumps(start))  # as the checkpoint gives it back
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end["acked"] == start["acked"]
        rows = [
            r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()
        ]
    finally:
        reader.stop()
        sidecar.stop()
    kept = [
        r
        for r in every
        if r["origin_sequence"] > progress[r["origin_region"]]
        and r["origin_sequence"] not in acked[r["origin_region"]]
    ]
    assert rows == kept and 0 < len(kept) < len(every)


def test_empty_partition_of_a_batch_read_yields_nothing(orders_layout: Layout) -> None:
    source = RsubDataSource(orders_layout.options())
    reader = source.reader(source.schema())
    assert list(reader.read(SequenceRange(5, 5, NO_PROGRESS))) == []
    # A range past the stream's end means the stream was replaced: sequences would not match.
    with pytest.raises(RsubDataLossError, match="ends at sequence"):
        list(reader.read(SequenceRange(10_000, 10_010, NO_PROGRESS)))


def test_rows_of_a_stream_no_region_writes_arrive_without_origin(nats_server: LoneServer) -> None:
    """The read stream also sources a stream that is no region's write stream: its rows arrive
    with empty origin columns, from the start and from a subscription whose vector covers
    every row of the regions (issue 20: a source dropping such rows lost data in every query)."""
    name = "ordersf"
    legacy = [f"legacy-{i}".encode() for i in range(10)]

    async def build() -> tuple[int, VirtualStream]:
        nc = await nats.connect(nats_server.url)
        try:
            vstream = await create_layout(nc, name)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=f"{name}-legacy", subjects=[f"{name}.legacy.>"]))
            read = (await js.stream_info(vstream.read_stream("west"))).config
            sources = [*(read.sources or []), StreamSource(f"{name}-legacy")]
            await js.update_stream(dataclasses.replace(read, sources=sources))
            published = await publish_orders(nc, vstream, 20, markers=False)
            for i, data in enumerate(legacy):
                await js.publish(f"{name}.legacy.k{i}", data)
            return await wait_sourced(nc, vstream, len(published) + len(legacy)), vstream
        finally:
            await nc.close()

    last, vstream = asyncio.run(build())
    options = {"servers": nats_server.url, "stream": name, "region": "west"}
    rows = read_rows(options, 0, last)
    assert len(rows) == 30
    unknown = [r for r in rows if r["origin_region"] is None]
    assert sorted(r["data"] for r in unknown) == sorted(legacy)
    assert all(r["origin_sequence"] is None for r in unknown)
    assert all(r["subject"].startswith(f"{name}.legacy.") for r in unknown)

    # Every region's row is covered: a subscription start keeps exactly the unknown ones.
    state = api_pb2.GetSubscriptionResponse(
        stream=name,
        subscription="billing",
        kind="external",
        mark_delete=0,
        progress={region: 1_000 for region in vstream.regions},
    )
    sidecar = StateServer([state])
    try:
        source = RsubDataSource({**options, "subscription": "billing", "sidecar": sidecar.address})
        reader = source.reader(source.schema())
        kept = [r for p in reader.partitions() for b in reader.read(p) for r in b.to_pylist()]
    finally:
        sidecar.stop()
    assert kept == unknown
