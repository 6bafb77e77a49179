"""Throughput and latency of the `rsub` Spark source against a plain nats-py loop.

Starts one nats-server with the streams of a virtual stream (two regions sourced into
`bench-read-west`), publishes `--messages` orders, then reads the same messages:
1. with a plain nats-py loop (one ordered consumer, the usual way to read a stream);
2. with Spark (`local[2]`, a batch read of the same range into the no-op sink; the read
   stream allows direct get, or not with `--consumer`),
and prints rows per second of both and their ratio (goal: Spark >= half the plain loop).
Then it runs a streaming query with a 1 s trigger while publishing at `--rate` messages/s
with `Rsub-Published-At`, and prints the latency from publish to the row being available in
a micro-batch (p50/p95/max).

    .venv/bin/python bench/bench_spark.py --messages 200000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy
from pyspark.sql import DataFrame, SparkSession

# Run as a script (bench/ is sys.path[0]): the repository root makes `tests.support` importable.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.naming import VirtualStream  # noqa: E402
from spark_jobs import rsub_spark  # noqa: E402
from tests.support.nats_servers import LoneServer  # noqa: E402
from tests.support.spark_helpers import create_layout, wait_sourced  # noqa: E402


async def publish(url: str, vstream: VirtualStream, count: int, payload: bytes) -> None:
    nc = await nats.connect(url)
    try:
        for i in range(count):
            region = "west" if i % 2 == 0 else "east"
            await nc.publish(f"{vstream.name}.{region}.k{i % 16}", payload)
            if i % 5000 == 4999:
                await nc.flush()
            if i % 1000 == 999:
                marker = vstream.marker_subject(region)
                await nc.publish(marker, b"m", headers={"Nats-Msg-Id": f"bench-{i}"})
        await nc.flush()
    finally:
        await nc.close()


async def plain_loop(url: str, read_stream: str, subject: str, last_seq: int) -> tuple[int, float]:
    """Reads every data message with one ordered consumer; (rows, seconds)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        started = time.perf_counter()
        sub = await js.subscribe(
            subject,
            stream=read_stream,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        rows = 0
        async for msg in sub.messages:
            meta = msg.metadata
            rows += 1
            if meta.sequence.stream >= last_seq or meta.num_pending == 0:
                break
        elapsed = time.perf_counter() - started
        await sub.unsubscribe()
        return rows, elapsed
    finally:
        await nc.close()


def spark_read_noop(spark: SparkSession, options: dict[str, str]) -> tuple[int, float]:
    started = time.perf_counter()
    df = spark.read.format("rsub").options(**options).load()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - started
    return df.count(), elapsed


def latency(
    spark: SparkSession,
    url: str,
    vstream: VirtualStream,
    options: dict[str, str],
    seconds: float,
    rate: int,
) -> list[float]:
    delays: list[float] = []
    lock = threading.Lock()

    def sink(batch: DataFrame, _: int) -> None:
        seen = time.time()
        stamps = [r.timestamp.timestamp() for r in batch.select("timestamp").collect()]
        with lock:
            delays.extend(seen - t for t in stamps)

    query = (
        spark.readStream.format("rsub")
        .options(**options, startingOffsets="latest")
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="1 second")
        .start()
    )

    async def steady() -> None:
        nc = await nats.connect(url)
        try:
            interval = 1 / rate
            next_at = time.perf_counter()
            end = next_at + seconds
            i = 0
            while next_at < end:
                stamp = str(int(time.time() * 1000))
                await nc.publish(
                    f"{vstream.name}.west.lat{i % 8}", b"{}", headers={"Rsub-Published-At": stamp}
                )
                i += 1
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await nc.flush()
        finally:
            await nc.close()

    try:
        time.sleep(3)  # let the query start and settle at "latest"
        asyncio.run(steady())
        time.sleep(4)
    finally:
        query.stop()
    return delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--payload-bytes", type=int, default=64)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument(
        "--consumer", action="store_true", help="read streams without allow_direct (consumer path)"
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    payload = (b'{"key": "k1", "amount": 5, "pad": "' + b"x" * args.payload_bytes)[
        : args.payload_bytes
    ]
    with tempfile.TemporaryDirectory() as tmp:
        server = LoneServer(Path(tmp))
        server.start()
        try:
            vstream = asyncio.run(_setup(server.url, args.messages, payload, not args.consumer))
            read_stream = vstream.read_stream("west")
            last_seq = asyncio.run(_last(server.url, vstream, args.messages))
            path = "ordered consumer" if args.consumer else "direct get"
            print(
                f"{read_stream}: {args.messages} data messages, last seq {last_seq}, plugin reads by {path}"
            )

            spark = (
                SparkSession.builder.master("local[2]")
                .appName("bench-rsub")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.memory", "2g")
                .config("spark.ui.showConsoleProgress", "false")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            rsub_spark.register(spark)
            options = {"servers": server.url, "stream": vstream.name, "region": "west"}
            warm = {**options, "endingOffsets": '{"sequence": 2000}'}
            spark_read_noop(spark, warm)  # JVM and Python workers start here, not in the figure

            plain_rows, plain_s = asyncio.run(
                plain_loop(server.url, read_stream, vstream.data_filter(), last_seq)
            )
            spark_rows, spark_s = spark_read_noop(spark, options)
            plain_rate = plain_rows / plain_s
            spark_rate = spark_rows / spark_s
            print(
                f"plain nats-py loop : {plain_rows} rows in {plain_s:.2f}s = {plain_rate:,.0f} rows/s"
            )
            print(
                f"spark rsub (2 cores): {spark_rows} rows in {spark_s:.2f}s = {spark_rate:,.0f} rows/s"
            )
            print(f"ratio spark/plain  : {spark_rate / plain_rate:.2f} (goal >= 0.5)")

            delays = latency(spark, server.url, vstream, options, args.latency_seconds, args.rate)
            if delays:
                ordered = sorted(delays)
                p95 = ordered[int(0.95 * (len(ordered) - 1))]
                print(
                    f"latency publish->row at 1 s trigger: n={len(ordered)} "
                    f"p50={statistics.median(ordered) * 1000:.0f} ms p95={p95 * 1000:.0f} ms "
                    f"max={ordered[-1] * 1000:.0f} ms"
                )
            spark.stop()
        finally:
            server.stop()
    return 0


async def _setup(url: str, count: int, payload: bytes, direct: bool) -> VirtualStream:
    nc = await nats.connect(url)
    try:
        vstream = await create_layout(nc, "bench", direct=direct)
    finally:
        await nc.close()
    await publish(url, vstream, count, payload)
    return vstream


async def _last(url: str, vstream: VirtualStream, count: int) -> int:
    nc = await nats.connect(url)
    try:
        return await wait_sourced(nc, vstream, count, timeout_s=300)
    finally:
        await nc.close()


if __name__ == "__main__":
    raise SystemExit(main())
