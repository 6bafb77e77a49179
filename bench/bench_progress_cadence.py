"""The progress cadence (`progress.interval_ms`) against the exact client's duplicates and
what it costs.

Usage: .venv/bin/python bench/bench_progress_cadence.py [--streams 100,1000] [--loaded 100]
       [--cadences 1000,250,100] [--failovers 3] [--rate 100] [--stream-rate 1]
       [--seconds 20]

For each `--streams` count, a local two-region super-cluster (west, east) with that many
virtual streams, each with one replicated durable `app` in west. The first `--loaded` of
them are loaded: the first gets `--rate` msg/s in west for the failovers (its `app` is not
consumed), the others `--stream-rate` msg/s in west each, and their `app` is consumed and
acked there all along (their progress moves, so their vectors go out: at most one per
stream and cadence, so a stream consumed less often than the cadence costs the same at
every cadence); the rest stay idle.

Each cadence in turn (1 s snapshot interval; the settings take turns on the same cluster and
streams, never at once), both sidecars run as `rsub run` processes with that
`progress.interval_ms`, and `--failovers` failovers are made of a fresh durable of the
first stream, one after the other:
- the durable is consumed steadily in west (with the first failover, for a `--seconds`
  window in which the CPU of west's sidecar, east's, the servers and this bench (the
  application: producers and consumers), the markers west's write streams received,
  updates sent and position reads are measured; from /proc and /metrics);
- west is lost at a random moment: its sidecar SIGKILLed and its application stopped at
  once (west's servers stay up, for the next failover: an update already stored in west's
  write stream still reaches east, which in a loss of the servers it would do only if it
  had been sourced, a few ms later);
- once east's view of the durable has stopped changing, its progress vector is read from
  east's sidecar (gRPC) and the durable continues in east through `sidecar.exact
  .ExactConsumer`, until east delivered a message west never reached; the duplicates are
  the messages it delivers that west consumed before the loss (and, as a check, those of
  them the vector does not cover); then west's sidecar starts again. The application in
  west acks the rest of the batch it holds at the loss (west's servers still run), which in
  a loss of the whole region it would not: those messages are not counted as consumed in
  west.
Prints each failover, then one table per stream count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import nats
from bench_sidecar_footprint import (
    LEASE_TTL_S,
    READY_TIMEOUT_S,
    REGIONS,
    SNAPSHOT_TIMEOUT_S,
    bounded,
    cpu_seconds,
    cpu_wait_seconds,
    lay_out,
    metric_totals,
    server_pids,
    warm_up,
)
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, sidecar_settings, wait_until
from rsub_dev.workload import Consumer, Producer
from sidecar.api.client import RETRYABLE, SidecarError
from sidecar.exact import covered, progress_of
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream

SNAPSHOT_INTERVAL_MS = 1000
APP = "app"
_COUNTED = (
    "rsub_updates_sent_total",
    "rsub_position_reads_total",
    "rsub_snapshots_completed_total",
)
SETTLED_S = 2.0
"""East's view of a failed-over durable is read once unchanged for this long."""
DRAIN_TIMEOUT_S = 120.0
WARM_S = 3.0
"""A later failover's durable is consumed in west this long (and up to 1 s more) first."""


@dataclass
class Failover:
    west_consumed: int
    duplicates: int
    uncovered: int
    lost: int


@dataclass
class Setting:
    cadence_ms: int
    failovers: list[Failover] = field(default_factory=list)
    markers_per_s: float = 0.0
    updates_per_s: float = 0.0
    reads_per_s: float = 0.0
    snapshots_per_s: float = 0.0
    west_cpu: float = 0.0
    east_cpu: float = 0.0
    servers_cpu: float = 0.0
    bench_cpu: float = 0.0
    west_waited: float = 0.0
    """Share of the window west's sidecar was ready to run but waited for a CPU."""
    load: float = 0.0


async def markers_written(js: JetStreamContext, streams: Sequence[VirtualStream]) -> int:
    """Markers (snapshot requests, responses, updates) west's write streams hold."""

    async def one(vs: VirtualStream) -> int:
        info = await js.stream_info(vs.write_stream("west"), subjects_filter=vs.marker_filter())
        return sum((info.state.subjects or {}).values())

    return sum(await bounded(one(vs) for vs in streams))


async def counters(
    west: SidecarProcess, js: JetStreamContext, streams: Sequence[VirtualStream]
) -> tuple[float, list[float]]:
    """When, and west's marker count followed by its `_COUNTED` totals."""
    totals = await metric_totals(west, _COUNTED)
    return time.monotonic(), [float(await markers_written(js, streams)), *totals]


async def measure(
    setting: Setting,
    west: SidecarProcess,
    east: SidecarProcess,
    js: JetStreamContext,
    streams: Sequence[VirtualStream],
    servers: Sequence[int],
    args: argparse.Namespace,
) -> None:
    """CPU, markers, updates and reads over an `args.seconds` window (counts read outside it:
    a scrape at 1,000 streams costs the sidecar about a second of CPU)."""
    counted_at, before = await counters(west, js, streams)
    pids = [west.pid, east.pid, os.getpid(), *servers]
    cpu = [cpu_seconds(p) for p in pids]
    waited = cpu_wait_seconds(west.pid)
    started = time.monotonic()
    await asyncio.sleep(args.seconds)
    used = [cpu_seconds(p) - c for p, c in zip(pids, cpu, strict=True)]
    waited = cpu_wait_seconds(west.pid) - waited
    elapsed = time.monotonic() - started
    setting.load = os.getloadavg()[0]
    ended_at, after = await counters(west, js, streams)
    rates = [(a - b) / (ended_at - counted_at) for a, b in zip(after, before, strict=True)]
    setting.markers_per_s, setting.updates_per_s, setting.reads_per_s = rates[:3]
    setting.snapshots_per_s = rates[3]
    setting.west_cpu, setting.east_cpu = 100 * used[0] / elapsed, 100 * used[1] / elapsed
    setting.bench_cpu, setting.servers_cpu = 100 * used[2] / elapsed, 100 * sum(used[3:]) / elapsed
    setting.west_waited = 100 * waited / elapsed


async def east_vector(east: SidecarProcess, vs: VirtualStream, durable: str) -> dict[str, int]:
    """East's progress vector of `durable`; `TimeoutError` (wait_until's "not yet") while it
    has none (NOT_FOUND: no update from west yet) or answers late (a busy sidecar at 1,000
    streams on a saturated machine took more than the call's 10 s)."""
    try:
        return dict(await progress_of(f"127.0.0.1:{east.grpc_port}", vs.name, durable))
    except SidecarError as error:
        if error.code in RETRYABLE or error.code == grpc.StatusCode.NOT_FOUND:
            raise TimeoutError(str(error)) from error
        raise


async def settled_vector(east: SidecarProcess, vs: VirtualStream, durable: str) -> dict[str, int]:
    """East's progress vector of `durable` once it has not changed for `SETTLED_S`."""
    last: dict[str, int] | None = None
    since = time.monotonic()

    async def quiet() -> bool:
        nonlocal last, since
        vector = await east_vector(east, vs, durable)
        if vector != last:
            last, since = vector, time.monotonic()
        return time.monotonic() - since >= SETTLED_S

    await wait_until(quiet, f"east's vector of {durable}", DRAIN_TIMEOUT_S, poll_s=0.2)
    assert last is not None
    return last


async def known_in_east(
    east: SidecarProcess, east_js: JetStreamContext, vs: VirtualStream, durable: str
) -> None:
    """Wait until east's sidecar has a vector from west for `durable`, and the durable."""

    async def known() -> bool:
        vector = await east_vector(east, vs, durable)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await east_js.consumer_info(vs.read_stream("east"), durable)
            return vector.get("west", 0) > 0
        return False

    await wait_until(known, f"{durable} known in east", DRAIN_TIMEOUT_S, poll_s=0.2)


def number(payload: bytes) -> int:
    return int(payload.rsplit(b"-", 1)[1])


async def failover(
    conns: dict[str, Client],
    west: SidecarProcess,
    east: SidecarProcess,
    vs: VirtualStream,
    durable: str,
    meanwhile: Awaitable[None],
) -> Failover:
    """`durable` consumed in west while `meanwhile` runs and up to 1 s more (at random),
    west lost, continued exactly in east."""
    west_js, east_js = conns["west"].jetstream(), conns["east"].jetstream()
    # From the read stream's end: the durables before it left their messages there.
    end = (await west_js.stream_info(vs.read_stream("west"))).state.last_seq
    config = dataclasses.replace(
        durable_config(vs, durable),
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=end + 1,
    )
    await west_js.add_consumer(vs.read_stream("west"), config)
    consumer = Consumer(durable)
    in_west = asyncio.create_task(consumer.run(conns["west"], vs, "west"))
    await known_in_east(east, east_js, vs, durable)
    await meanwhile
    await asyncio.sleep(random.uniform(0, 1))
    lost_at = time.monotonic()
    consumer.stop()
    await west.kill()
    await in_west
    # What the application received after the loss (the rest of its batch, acked while
    # west's servers still run) it would not have consumed in a loss of the whole region.
    before = [d for d in consumer.in_region("west") if d.at <= lost_at]
    consumed_west = {d.payload for d in before}
    delivered_west = [number(d.payload) for d in consumer.in_region("west")]
    first_west, last_west = min(delivered_west), max(delivered_west)
    vector = await settled_vector(east, vs, durable)
    in_east = asyncio.create_task(consumer.run(conns["east"], vs, "east", vector))

    async def passed() -> bool:
        return any(number(d.payload) > last_west for d in consumer.in_region("east"))

    try:
        await wait_until(passed, f"east past west's last of {durable}", DRAIN_TIMEOUT_S)
    finally:
        consumer.stop()
        await in_east
    delivered_east = {d.payload for d in consumer.in_region("east")}
    everything = {d.payload for d in consumer.deliveries}
    lost = sum(
        1 for n in range(first_west, last_west + 1) if f"west-{n}".encode() not in everything
    )
    return Failover(
        west_consumed=len(consumed_west),
        duplicates=len(delivered_east & consumed_west),
        uncovered=sum(1 for d in before if not covered(d.origin, vector)),
        lost=lost,
    )


async def run_setting(
    args: argparse.Namespace,
    cluster: LocalSuperCluster,
    conns: dict[str, Client],
    streams: Sequence[VirtualStream],
    servers: Sequence[int],
    cadence_ms: int,
    workdir: Path,
) -> Setting:
    def process(region: str) -> SidecarProcess:
        settings = sidecar_settings(
            cluster,
            region,
            streams=[vs.name for vs in streams],
            interval_ms=SNAPSHOT_INTERVAL_MS,
            timeout_s=SNAPSHOT_TIMEOUT_S,
            lease_ttl_s=LEASE_TTL_S,
            progress_interval_ms=cadence_ms,
        )
        return SidecarProcess(settings, workdir / region)

    setting = Setting(cadence_ms)
    west, east = process("west"), process("east")
    try:
        # East first: a first snapshot west started before east answers would time out.
        # The load starts once both have rebuilt every stream (at 1,000 streams a rebuild
        # under it outlasted the 600 s limit on this machine).
        for proc in (east, west):
            await proc.start()
            await proc.wait_ready(READY_TIMEOUT_S)
        async with background(conns, streams, args):
            for k in range(args.failovers):
                if k > 0:
                    await west.start()
                    await west.wait_ready(READY_TIMEOUT_S)
                # The first failover's durable is consumed in west through the measured window.
                meanwhile = (
                    measure(setting, west, east, conns["west"].jetstream(), streams, servers, args)
                    if k == 0
                    else asyncio.sleep(WARM_S)
                )
                durable = f"f{cadence_ms}-{k}"
                outcome = await failover(conns, west, east, streams[0], durable, meanwhile)
                setting.failovers.append(outcome)
                print(
                    f"{len(streams)} streams, progress every {cadence_ms} ms, failover {k + 1}: "
                    f"west consumed {outcome.west_consumed}, exact client's duplicates in east "
                    f"{outcome.duplicates} (not covered by east's vector: {outcome.uncovered}), "
                    f"lost {outcome.lost}",
                    flush=True,
                )
    finally:
        await asyncio.gather(west.stop(), east.stop())
    return setting


@contextlib.asynccontextmanager
async def background(
    conns: dict[str, Client], streams: Sequence[VirtualStream], args: argparse.Namespace
) -> AsyncIterator[None]:
    """While inside: `--rate` msg/s in west on the first stream (its failovers' durables),
    `--stream-rate` on each of the next `--loaded` - 1 with their `app` consumed there."""
    loaded = streams[1 : args.loaded]
    producers = [Producer(conns["west"], vs, "west", args.stream_rate) for vs in loaded]
    producers.append(Producer(conns["west"], streams[0], "west", args.rate))
    consumers = [Consumer(APP) for _ in loaded]
    tasks = [asyncio.create_task(p.run()) for p in producers]
    tasks += [
        asyncio.create_task(c.run(conns["west"], vs, "west"))
        for c, vs in zip(consumers, loaded, strict=True)
    ]
    try:
        yield
    finally:
        for producer in producers:
            producer.stopped.set()
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run(args: argparse.Namespace, count: int, directory: Path) -> list[Setting]:
    streams = [VirtualStream(f"s{i:04d}", REGIONS) for i in range(count)]
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        conns = {r: await nats.connect(cluster.servers(r)) for r in REGIONS}
        try:
            started = time.monotonic()
            await lay_out(conns["west"], streams, [APP])
            await warm_up(conns, streams)
            print(
                f"{count} streams ({min(args.loaded, count)} loaded) set up in "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
            servers = server_pids(directory / "cluster")
            return [
                await run_setting(
                    args, cluster, conns, streams, servers, cadence, directory / f"p{cadence}"
                )
                for cadence in args.cadences
            ]
        finally:
            await asyncio.gather(*(nc.close() for nc in conns.values()))


def table(
    count: int, loaded: int, stream_rate: float, rate: float, settings: Sequence[Setting]
) -> list[str]:
    lines = [
        f"{count} streams ({loaded} loaded: {stream_rate:g} msg/s each, the first {rate:g}),"
        " 1 s snapshot interval:",
        "| progress every | exact client's duplicates per failover (mean) | west consumed "
        "per failover | markers/s written by west | updates sent/s | position reads/s "
        "| snapshots/s | west's sidecar CPU | east's sidecar CPU | servers CPU | bench CPU "
        "| west waited for a CPU | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        dups = [f.duplicates for f in s.failovers]
        checks = [f.uncovered for f in s.failovers]
        lost = sum(f.lost for f in s.failovers)
        lines.append(
            f"| {s.cadence_ms} ms | {', '.join(map(str, dups))} (mean {statistics.mean(dups):.0f}, {statistics.mean(dups) / rate:.2f} s of"
            f" consumption;"
            f" uncovered {', '.join(map(str, checks))}; lost {lost}) "
            f"| {', '.join(str(f.west_consumed) for f in s.failovers)} "
            f"| {s.markers_per_s:.1f} | {s.updates_per_s:.1f} | {s.reads_per_s:.1f} "
            f"| {s.snapshots_per_s:.1f} | {s.west_cpu:.1f} % | {s.east_cpu:.1f} % "
            f"| {s.servers_cpu:.1f} % | {s.bench_cpu:.1f} % | {s.west_waited:.0f} % "
            f"| {s.load:.1f} |"
        )
    return lines


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers such as 100,1000")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=positive_ints, default=[100, 1000])
    parser.add_argument("--loaded", type=int, default=100, help="streams consumed in west")
    parser.add_argument("--cadences", type=positive_ints, default=[1000, 250, 100])
    parser.add_argument("--failovers", type=int, default=3, help="per cadence")
    parser.add_argument("--rate", type=float, default=100.0, help="msg/s on the failover stream")
    parser.add_argument(
        "--stream-rate", type=float, default=1.0, help="msg/s on each other loaded stream"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    tables = []
    for count in args.streams:
        with tempfile.TemporaryDirectory(prefix="bench-cadence-") as tmp:
            settings = asyncio.run(run(args, count, Path(tmp)))
        loaded = min(args.loaded, count)
        tables.append(table(count, loaded, args.stream_rate, args.rate, settings))
        print("\n".join(tables[-1]), flush=True)
    print("\n\n".join("\n".join(t) for t in tables))


if __name__ == "__main__":
    main()
