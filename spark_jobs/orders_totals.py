"""Example pipeline: orders from the `orders` virtual stream into an idempotent Parquet table.

Each message of `orders` carries JSON like `{"key": "k3", "amount": 5}`. Every micro-batch is
appended to a Parquet table of orders keyed by `(origin_region, origin_sequence)`: rows whose
key is already in the table are dropped, so the table stays exactly right when Spark retries
a batch or when a failover to another region delivers some messages a second time (their
read-stream sequence differs there, their origin does not). `totals()` computes the running
totals per key from the table. Messages whose data is not such JSON are kept with a null key
and amount, and left out of the totals.

    rsub create-cursor orders orders-totals --sidecar localhost:7070
    python -m spark_jobs.orders_totals --servers nats://localhost:4222 --region west \\
        --sidecar localhost:7070 --subscription orders-totals --table /data/orders \\
        --checkpoint /data/orders-checkpoint

The subscription is an external cursor of the job's own: options refused as the job sets up
(a durable consumer named as the subscription, a malformed option) end it before any batch,
with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence

import structlog
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark_jobs import rsub_spark

log = structlog.get_logger(__name__)

ORDER_JSON_SCHEMA = "key string, amount long"
KEY_COLUMNS = ("origin_region", "origin_sequence")


def orders_of(stream: DataFrame) -> DataFrame:
    """The order rows of an rsub DataFrame (streaming or batch)."""
    order = F.from_json(F.col("data").cast("string"), ORDER_JSON_SCHEMA)
    return stream.select(
        "origin_region",
        "origin_sequence",
        "sequence",
        "timestamp",
        order.getField("key").alias("key"),
        order.getField("amount").alias("amount"),
    )


def _existing(spark: SparkSession, table: str) -> DataFrame | None:
    try:
        return spark.read.parquet(table)
    except AnalysisException as error:
        if error.getCondition() == "PATH_NOT_FOUND":
            return None
        raise


def append_new_orders(batch: DataFrame, table: str) -> int:
    """Appends the orders of `batch` not yet in `table` (by origin); returns how many."""
    spark = batch.sparkSession
    # Read the source once, however many times the plan below looks at the batch.
    fresh = (
        batch.where(F.col("origin_region").isNotNull()).dropDuplicates(list(KEY_COLUMNS)).persist()
    )
    existing = _existing(spark, table)
    if existing is not None:
        # Only the part of the table the batch can collide with (Parquet skips the rest).
        lowest = fresh.groupBy("origin_region").agg(F.min("origin_sequence").alias("lowest"))
        known = (
            existing.select(*KEY_COLUMNS)
            .join(F.broadcast(lowest), "origin_region")
            .where(F.col("origin_sequence") >= F.col("lowest"))
            .select(*KEY_COLUMNS)
        )
        new = fresh.join(known, list(KEY_COLUMNS), "left_anti").persist()
    else:
        new = fresh
    try:
        count = new.count()
        if count:
            new.write.mode("append").parquet(table)
    finally:
        new.unpersist()
        fresh.unpersist()
    return count


def totals(spark: SparkSession, table: str) -> DataFrame:
    """Running totals per key: `key`, `total` (sum of amounts), `orders` (count)."""
    orders = _existing(spark, table)
    if orders is None:
        return spark.createDataFrame([], "key string, total long, orders long")
    return (
        orders.where(F.col("key").isNotNull() & F.col("amount").isNotNull())
        .groupBy("key")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("orders"))
    )


def start(
    spark: SparkSession,
    options: Mapping[str, str],
    table: str,
    checkpoint: str,
    *,
    available_now: bool = False,
    trigger_interval: str = "1 second",
    query_name: str = "orders_totals",
    on_batch: Callable[[DataFrame, int], None] | None = None,
) -> tuple[StreamingQuery, rsub_spark.CursorCommitListener | None]:
    """Starts the pipeline; with a subscription and a sidecar, commits its progress there.
    `on_batch(batch, batch_id)` sees every micro-batch before it is appended (to observe
    what the sink receives)."""
    rsub_spark.register(spark)
    parsed = rsub_spark.parse_options(options)
    listener = None
    if parsed.subscription is not None and parsed.sidecar is not None:
        listener = rsub_spark.attach_cursor_commits(spark, options, query_name)

    def write(batch: DataFrame, batch_id: int) -> None:
        if on_batch is not None:
            on_batch(batch, batch_id)
        added = append_new_orders(batch, table)
        log.info("orders_totals.batch", batch=batch_id, added=added)

    stream = spark.readStream.format("rsub").options(**options).load()
    writer = (
        orders_of(stream)
        .writeStream.queryName(query_name)
        .foreachBatch(write)
        .option("checkpointLocation", checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger_interval)
    )
    return writer.start(), listener


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--stream", default="orders")
    parser.add_argument("--sidecar")
    parser.add_argument("--subscription")
    parser.add_argument("--starting-offsets")
    parser.add_argument("--table", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args(argv)
    options = {"servers": args.servers, "stream": args.stream, "region": args.region}
    for key, value in (
        ("sidecar", args.sidecar),
        ("subscription", args.subscription),
        ("startingOffsets", args.starting_offsets),
    ):
        if value:
            options[key] = value
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("orders_totals").getOrCreate()
    try:
        query, listener = start(
            spark, options, args.table, args.checkpoint, available_now=args.available_now
        )
    except (rsub_spark.RsubOptionError, rsub_spark.SidecarError) as error:
        print(f"error: {error}", file=sys.stderr)
        spark.stop()
        return 2
    query.awaitTermination()
    if listener is not None and not listener.wait_for_query(query, timeout_s=30):
        log.warning("orders_totals.last_commit_missing", subscription=args.subscription)
    totals(spark, args.table).orderBy("key").show(truncate=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
