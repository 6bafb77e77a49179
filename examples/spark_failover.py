"""The example Spark pipeline through a regional failover (`make demo-spark`).

On a local three-region NATS super-cluster (west, central, east) with one rsub sidecar per
region, producers publish orders (`{"key": ..., "amount": ...}`) in every region before and
during the run. The `orders_totals` pipeline runs in west on a local Spark (`local[2]`),
reading `orders` with `startingOffsets=subscription` for the external cursor
`orders-totals`, committing its progress to west's sidecar, and appending to a Parquet table keyed
by (`origin_region`, `origin_sequence`).

West's producer stops and the demo waits until east's read stream holds every order west
published, so that no order can die with west. Then west is lost mid-stream: its driver
stops committing and dies as its next micro-batch reaches the sink (that batch is never
written), its servers are SIGKILLed and its sidecar is stopped. A fresh query (new
checkpoint) starts in east with `startingOffsets=subscription` against east's servers and
sidecar, writing into the same table, while central and east keep publishing for a while.
Once east has consumed its whole read stream, the demo prints the totals per key from the
table next to the totals computed from what was published, and what was delivered twice.
It exits 0 only when they are equal and nothing was lost. Everything is torn down at the
end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from examples.demo import Progress, print_rows
from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from rsub_dev.workload import close_quietly, quiet_connect
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from spark_jobs import orders_totals, rsub_spark
from spark_jobs.rsub_spark.listener import end_sequence

STREAM = "orders"
SUBSCRIPTION = "orders-totals"
LOST = "west"
TAKEOVER = "east"
REGIONS = (LOST, "central", TAKEOVER)
SURVIVORS = tuple(r for r in REGIONS if r != LOST)
KEYS = tuple(f"k{i}" for i in range(8))
_PUBLISH_ATTEMPTS = 5
_STEP_TIMEOUT_S = 90.0
_QUIET_LINE_S = 2.0
# Spark's own logs: errors only, and nothing from the streaming engine, whose errors the
# demo reports itself (west's query dies on purpose; any other failure ends the demo).
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = spark %p %c{1}: %m%n
logger.streaming.name = org.apache.spark.sql.execution.streaming
logger.streaming.level = off
"""


class RegionLost(RuntimeError):
    """Raised in west's sink when west is lost: the query dies with its region."""


@dataclass(frozen=True)
class Order:
    """One order as its region's write stream acknowledged it."""

    region: str
    origin_sequence: int
    key: str
    amount: int


@dataclass
class OrderProducer:
    """Publishes orders in one region; an order counts once its write stream acknowledged it.

    Every order carries a unique `Nats-Msg-Id`, so a publish retried after a lost
    acknowledgement is stored once. The subject ends with the region
    (`orders.<region>.placed.<region>`, `orders.placed.<region>` in the read streams), so a
    read stream's per-subject counts tell how many orders arrived from each region.
    """

    nc: NATS
    vs: VirtualStream
    region: str
    rate_per_s: float
    rng: random.Random
    run_id: str
    published: list[Order] = field(default_factory=list)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish_one(self) -> None:
        js = self.nc.jetstream()
        key, amount = self.rng.choice(KEYS), self.rng.randint(1, 20)
        data = json.dumps({"key": key, "amount": amount}).encode()
        headers = {"Nats-Msg-Id": f"{self.run_id}-{self.region}-{len(self.published)}"}
        subject = self.vs.publish_subject(self.region, f"placed.{self.region}")
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                ack = await js.publish(subject, data, timeout=2, headers=headers)
            except (NatsError, TimeoutError):
                if attempt == _PUBLISH_ATTEMPTS:
                    raise
                continue
            self.published.append(Order(self.region, ack.seq, key, amount))
            return

    async def run(self) -> None:
        period = 1 / self.rate_per_s
        next_at = time.monotonic()
        while not self.stopped.is_set():
            await self.publish_one()
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def arrived(nc: NATS, vs: VirtualStream, reader: str, origin: str) -> int:
    """How many orders published in `origin` the read stream of `reader` holds."""
    info = await nc.jetstream().stream_info(
        vs.read_stream(reader), subjects_filter=f"{STREAM}.placed.{origin}"
    )
    return sum((info.state.subjects or {}).values())


class Sink:
    """What the sink received per query, (origin region, origin sequence) of every row; west's
    query dies as its first batch after `lose_west()` reaches the sink."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[str, int]]] = {LOST: [], TAKEOVER: []}
        self.first_batch_at: dict[str, float] = {}
        self.west_died_at: float | None = None
        self._west_lost = threading.Event()
        self._cached: DataFrame | None = None
        self._lock = threading.Lock()

    def lose_west(self) -> None:
        self._west_lost.set()

    def observer(self, query: str) -> Callable[[DataFrame, int], None]:
        def observe(batch: DataFrame, batch_id: int) -> None:
            if query == LOST and self._west_lost.is_set():
                self.west_died_at = time.monotonic()
                raise RegionLost(f"{LOST} is lost: its driver dies before writing batch {batch_id}")
            with self._lock:
                self.first_batch_at.setdefault(query, time.monotonic())
            # Cached, so that the sink does not read the batch from NATS a second time.
            if self._cached is not None:
                self._cached.unpersist()
            self._cached = batch.persist()
            keys = batch.select(*orders_totals.KEY_COLUMNS).collect()
            with self._lock:
                self.rows[query] += [(str(r[0]), int(r[1])) for r in keys]

        return observe

    def count(self, query: str) -> int:
        with self._lock:
            return len(self.rows[query])


class Status:
    """Progress lines on stderr: rewritten in place on a terminal; otherwise a line per new
    phase and at most one every 2 s."""

    def __init__(self) -> None:
        self._progress = Progress()
        self._tty = sys.stderr.isatty()
        self._started = time.monotonic()
        self._last: tuple[str, float] = ("", 0.0)

    def show(self, phase: str, detail: str = "") -> None:
        now = time.monotonic()
        if not self._tty and phase == self._last[0] and now - self._last[1] < _QUIET_LINE_S:
            return
        self._last = (phase, now)
        self._progress.show(f"[{now - self._started:5.1f} s] {phase}{detail}")

    def done(self) -> None:
        self._progress.done()


def spark_session(directory: Path) -> SparkSession:
    """The shared local Spark session; its Python workers run this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log4j2 = directory / "log4j2.properties"
    log4j2.write_text(_LOG4J2)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rsub-demo-failover")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j2}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rsub_spark.register(spark)
    return spark


def stop_spark(spark: SparkSession) -> None:
    for query in spark.streams.active:
        with contextlib.suppress(Exception):
            stop_between_batches(query, timeout_s=3)
    spark.stop()


def stop_between_batches(query: StreamingQuery, timeout_s: float = 30) -> None:
    """Stops `query` while no batch runs (or after `timeout_s` anyway): interrupted in its
    foreachBatch function, Spark 4.3's stream thread dies printing a StackOverflowError."""
    deadline = time.monotonic() + timeout_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


def committed_batches(query: StreamingQuery) -> int:
    """How many batches the query committed; raises if it failed."""
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"query {query.name} failed: {error}")
    last = query.lastProgress
    return 0 if last is None else int(last["batchId"]) + 1


def processed_up_to(query: StreamingQuery, read_stream: str) -> int:
    """The end sequence of the query's last committed batch (0: none yet); raises if the
    query failed."""
    committed_batches(query)
    last: dict[str, Any] = query.lastProgress or {}
    ends = [end_sequence(s.get("endOffset"), read_stream) for s in last.get("sources", [])]
    return max((end for end in ends if end is not None), default=0)


@dataclass(frozen=True)
class Outcome:
    published: dict[str, int]
    stranded: int
    delivered: dict[str, int]
    twice: int
    table_rows: int
    table_duplicates: int
    missing: int
    unexpected: int
    resumed_after: int
    loss_to_first_batch_s: float
    expected: dict[str, tuple[int, int]]
    got: dict[str, tuple[int, int]]

    @property
    def ok(self) -> bool:
        return (
            self.expected == self.got
            and not self.stranded
            and not self.missing
            and not self.unexpected
            and not self.table_duplicates
        )


def totals_of(orders: Sequence[Order]) -> dict[str, tuple[int, int]]:
    """(sum of amounts, count) per key."""
    sums: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for order in orders:
        sums[order.key] += order.amount
        counts[order.key] += 1
    return {key: (sums[key], counts[key]) for key in counts}


class Demo:
    """The run's state; `run()` goes through the phases in order."""

    cluster: LocalSuperCluster
    sidecars: RegionSidecars
    spark: SparkSession
    west_query: StreamingQuery
    west_listener: rsub_spark.CursorCommitListener | None

    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        self.args = args
        self.directory = directory
        self.vs = VirtualStream(STREAM, REGIONS)
        self.table = str(directory / "orders-table")
        self.sink = Sink()
        self.status = Status()
        self.ncs: dict[str, NATS] = {}
        self.producers: dict[str, OrderProducer] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def counts(self) -> str:
        sent = " ".join(f"{r} {len(p.published)}" for r, p in self.producers.items())
        got = " ".join(f"{q} {self.sink.count(q)}" for q in (LOST, TAKEOVER))
        return f": published {sent} | delivered to the sink {got}"

    def options(self, region: str) -> dict[str, str]:
        return {
            "servers": ",".join(self.cluster.servers(region)),
            "stream": STREAM,
            "region": region,
            "subscription": SUBSCRIPTION,
            "sidecar": f"127.0.0.1:{self.sidecars[region].grpc_port}",
            "startingOffsets": "subscription",
        }

    def start_query(
        self, region: str
    ) -> tuple[StreamingQuery, rsub_spark.CursorCommitListener | None]:
        return orders_totals.start(
            self.spark,
            self.options(region),
            self.table,
            str(self.directory / f"checkpoint-{region}"),
            trigger_interval=f"{self.args.trigger_ms} milliseconds",
            query_name=region,
            on_batch=self.sink.observer(region),
        )

    async def mark_delete(self, region: str) -> int:
        client = rsub_spark.SidecarClient(self.options(region)["sidecar"])
        try:
            view = await asyncio.to_thread(client.subscription, STREAM, SUBSCRIPTION)
            mark_delete = view.mark_delete
            return mark_delete
        finally:
            client.close()

    async def stop_producers(self, regions: Sequence[str]) -> None:
        for region in regions:
            self.producers[region].stopped.set()
            await self.tasks.pop(region)

    async def run(self) -> Outcome:
        # Spark takes its time to start: in parallel with the cluster.
        spark_ready = asyncio.ensure_future(asyncio.to_thread(spark_session, self.directory))
        spark: SparkSession | None = None
        try:
            self.status.show(f"starting {', '.join(REGIONS)} and Spark in {self.directory}")
            async with (
                LocalSuperCluster(REGIONS, self.directory / "cluster") as self.cluster,
                RegionSidecars(
                    self.cluster, streams=[STREAM], interval_ms=self.args.interval_ms
                ) as self.sidecars,
            ):
                self.status.show("cluster and sidecars ready")
                self.ncs = {r: await quiet_connect(self.cluster.servers(r)) for r in REGIONS}
                await self.publish_before()
                self.status.show("orders published in every region; waiting for Spark")
                self.spark = spark = await spark_ready
                self.status.show("Spark ready")
                self.status.done()
                await self.consume_in_west()
                lost_at = await self.lose_west()
                resumed_after = await self.mark_delete(TAKEOVER)
                await self.consume_in_east(lost_at)
                west_in_east = await arrived(self.ncs[TAKEOVER], self.vs, TAKEOVER, LOST)
            self.status.show("reading the table")
            return await self.outcome(west_in_east, resumed_after, lost_at)
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            for nc in self.ncs.values():
                await close_quietly(nc)
            if spark is None:
                spark_ready.cancel()
            else:
                await asyncio.to_thread(stop_spark, spark)
            self.status.done()

    async def publish_before(self) -> None:
        """Orders in every region before the pipeline starts; the subscription at cursor 0."""
        rng = random.Random(self.args.seed)
        run_id = uuid.uuid4().hex[:12]
        self.producers = {
            r: OrderProducer(
                self.ncs[r], self.vs, r, self.args.rate, random.Random(rng.random()), run_id
            )
            for r in REGIONS
        }

        async def burst(producer: OrderProducer) -> None:
            for _ in range(self.args.burst):
                await producer.publish_one()

        await asyncio.gather(*(burst(p) for p in self.producers.values()))
        client = rsub_spark.SidecarClient(self.options(LOST)["sidecar"])
        try:
            # Creates the cursor at 0, as `rsub create-cursor` does (docs/spark.md).
            await asyncio.to_thread(client.commit, STREAM, SUBSCRIPTION, 0)
        finally:
            client.close()

    async def consume_in_west(self) -> None:
        """The producers keep publishing; the pipeline consumes in west for a while."""
        self.tasks = {r: asyncio.create_task(p.run()) for r, p in self.producers.items()}
        self.west_query, self.west_listener = await asyncio.to_thread(self.start_query, LOST)

        wanted = int(self.args.west_batches)

        async def committed_enough() -> bool:
            self.status.show(f"consuming in {LOST}", self.counts())
            return await asyncio.to_thread(committed_batches, self.west_query) >= wanted

        await wait_until(committed_enough, f"{wanted} batches committed in {LOST}", 180)
        self.status.done()

    async def lose_west(self) -> float:
        """Make sure nothing can die with west, then lose it; the time its query died."""
        await self.stop_producers([LOST])
        wanted = len(self.producers[LOST].published)

        async def safe_in_east() -> bool:
            self.status.show(f"waiting for {TAKEOVER} to hold {LOST}'s orders", self.counts())
            if await arrived(self.ncs[TAKEOVER], self.vs, TAKEOVER, LOST) < wanted:
                return False
            with contextlib.suppress(rsub_spark.SidecarError):
                return await self.mark_delete(TAKEOVER) > 0
            return False

        await wait_until(
            safe_in_east,
            f"{TAKEOVER} to hold {LOST}'s orders and a position of {SUBSCRIPTION!r}",
            _STEP_TIMEOUT_S,
            poll_s=0.2,
        )
        # From here on nothing is committed; the query dies as its next batch reaches the sink.
        self.sink.lose_west()
        if self.west_listener is not None:
            self.spark.streams.removeListener(self.west_listener)

        async def west_query_died() -> bool:
            self.status.show(f"{LOST} lost: its query dies at its next batch", self.counts())
            return not await asyncio.to_thread(lambda: self.west_query.isActive)

        await wait_until(west_query_died, f"{LOST}'s query to die", _STEP_TIMEOUT_S, poll_s=0.1)
        died_at = self.sink.west_died_at
        if died_at is None:
            raise RuntimeError(f"query {LOST} ended otherwise: {self.west_query.exception()}")
        await self.cluster.stop_region(LOST)
        # Runtime.stop can let nats-py's ConnectionResetError out while reconnecting.
        with contextlib.suppress(OSError):
            await self.sidecars.stop(LOST)
        await close_quietly(self.ncs.pop(LOST))
        self.status.show(f"{LOST} lost: query dead, servers SIGKILLed, sidecar stopped")
        self.status.done()
        return died_at

    async def consume_in_east(self, lost_at: float) -> None:
        """A fresh query in east; the survivors publish a while more; east consumes it all."""
        east_query, east_listener = await asyncio.to_thread(self.start_query, TAKEOVER)

        async def survivors_done() -> bool:
            self.status.show(f"consuming in {TAKEOVER}, survivors publishing", self.counts())
            return bool(time.monotonic() - lost_at >= self.args.after_seconds)

        await wait_until(survivors_done, "the survivors' publishing", self.args.after_seconds + 5)
        await self.stop_producers(SURVIVORS)

        async def holds_everything() -> bool:
            self.status.show(f"waiting for {TAKEOVER}'s read stream", self.counts())
            for origin in SURVIVORS:
                held = await arrived(self.ncs[TAKEOVER], self.vs, TAKEOVER, origin)
                if held < len(self.producers[origin].published):
                    return False
            return True

        await wait_until(holds_everything, f"{TAKEOVER} to hold every order", _STEP_TIMEOUT_S)
        read_stream = self.vs.read_stream(TAKEOVER)
        last_seq = (await self.ncs[TAKEOVER].jetstream().stream_info(read_stream)).state.last_seq

        async def consumed_all() -> bool:
            self.status.show(f"consuming in {TAKEOVER} up to {last_seq}", self.counts())
            done = await asyncio.to_thread(processed_up_to, east_query, read_stream)
            return done >= last_seq

        await wait_until(consumed_all, f"{TAKEOVER} to consume it all", _STEP_TIMEOUT_S)
        self.status.done()
        if east_listener is not None:
            await asyncio.to_thread(east_listener.wait_for_query, east_query, 10)
            self.spark.streams.removeListener(east_listener)
        await asyncio.to_thread(stop_between_batches, east_query)

    async def outcome(self, west_in_east: int, resumed_after: int, lost_at: float) -> Outcome:
        spark, table = self.spark, self.table
        rows = await asyncio.to_thread(
            lambda: spark.read.parquet(table).select(*orders_totals.KEY_COLUMNS).collect()
        )
        got = await asyncio.to_thread(
            lambda: {
                r.key: (int(r.total), int(r.orders))
                for r in orders_totals.totals(spark, table).collect()
            }
        )
        # Per-origin order: the orders of west that reached east are its first ones.
        west = sorted(self.producers[LOST].published, key=lambda o: o.origin_sequence)
        survivable = west[:west_in_east] + [
            o for r in SURVIVORS for o in self.producers[r].published
        ]
        expected_keys = {(o.region, o.origin_sequence) for o in survivable}
        table_keys = {(str(r[0]), int(r[1])) for r in rows}
        delivered = Counter(row for rows_of in self.sink.rows.values() for row in rows_of)
        return Outcome(
            published={r: len(p.published) for r, p in self.producers.items()},
            stranded=len(west) - west_in_east,
            delivered={q: len(r) for q, r in self.sink.rows.items()},
            twice=sum(n - 1 for n in delivered.values()),
            table_rows=len(rows),
            table_duplicates=len(rows) - len(table_keys),
            missing=len(expected_keys - table_keys),
            unexpected=len(table_keys - expected_keys),
            resumed_after=resumed_after,
            loss_to_first_batch_s=self.sink.first_batch_at.get(TAKEOVER, float("nan")) - lost_at,
            expected=totals_of(survivable),
            got=got,
        )


def print_outcome(outcome: Outcome) -> None:
    keys = sorted(set(outcome.expected) | set(outcome.got))
    header = ["key", "total (table)", "total (published)", "orders (table)", "orders (published)"]

    def cells(key: str) -> list[str]:
        got, want = outcome.got.get(key, (0, 0)), outcome.expected.get(key, (0, 0))
        mark = "" if got == want else "  <- differs"
        return [key, str(got[0]), str(want[0]), str(got[1]), f"{want[1]}{mark}"]

    print(
        f"\nrunning totals of {STREAM!r}: consumed in {LOST}, {LOST} lost, continued in {TAKEOVER}"
    )
    print_rows(header, [cells(key) for key in keys])
    published = sum(outcome.published.values())
    per_region = "  ".join(f"{r} {n}" for r, n in outcome.published.items())
    print(f"\npublished (acknowledged):  {published} ({per_region})")
    print(
        f"never left {LOST}:           {outcome.stranded} ({LOST}'s producer stopped and "
        f"{TAKEOVER} held all its orders before {LOST} was lost; orders left behind would be "
        "counted here and not expected in the table)"
    )
    per_query = "  ".join(f"{q} {n}" for q, n in outcome.delivered.items())
    print(f"delivered to the sink:     {sum(outcome.delivered.values())} rows ({per_query})")
    print(
        f"delivered twice:           {outcome.twice} (read in {LOST} after the last snapshot "
        f"that reached {TAKEOVER}, and again in {TAKEOVER})"
    )
    print(
        f"table:                     {outcome.table_rows} rows, {outcome.table_duplicates} "
        f"duplicated, {outcome.missing} published orders missing, {outcome.unexpected} rows "
        "nobody published"
    )
    print(f"{TAKEOVER} resumed after:        sequence {outcome.resumed_after} of its read stream")
    print(
        f"loss of {LOST} -> first batch in {TAKEOVER}: {outcome.loss_to_first_batch_s:.1f} s "
        f"(from {LOST}'s query dying to a fresh query's first batch in {TAKEOVER})"
    )
    verdict = "OK: equal to" if outcome.ok else "FAILED: not equal to"
    print(f"\nresult: {verdict} the totals of what was published")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10, help="orders/s per region")
    parser.add_argument("--burst", type=int, default=50, help="orders per region up front")
    parser.add_argument("--west-batches", type=int, default=4, help="committed before the loss")
    parser.add_argument("--after-seconds", type=float, default=4, help="publishing after loss")
    parser.add_argument("--interval-ms", type=int, default=200, help="snapshot interval")
    parser.add_argument("--trigger-ms", type=int, default=500, help="micro-batch trigger")
    parser.add_argument("--seed", type=int, default=7, help="keys and amounts")
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    configure_logging("console", "warning", stream=sys.stderr)
    # py4j logs every exception raised in a foreachBatch function, west's death included.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    started = time.monotonic()
    try:
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
            outcome = asyncio.run(Demo(args, args.dir.resolve()).run())
        else:
            with tempfile.TemporaryDirectory(prefix="rsub-demo-spark-") as tmp:
                outcome = asyncio.run(Demo(args, Path(tmp)).run())
    except KeyboardInterrupt:
        print("\ninterrupted: everything was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as error:
        # A query failed or a step did not finish in time; everything was stopped.
        print(f"\nFAILED: {error}", file=sys.stderr)
        return 1
    print_outcome(outcome)
    print(f"total time {time.monotonic() - started:.1f} s")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
