"""Data-plane publishing throughput with and without the rsub sidecars running.

Usage: .venv/bin/python bench/bench_publish_overhead.py [--seconds 8] [--rounds 3]

On a local super-cluster (west, central, east) with the virtual stream's topology in
place, a replicated durable in west is consumed and acked all along, and west publishes
as fast as its write stream acknowledges (batches of acknowledged publishes in flight).
Rounds alternate without / with one sidecar process per region (`rsub run`, snapshot
interval 200 ms), in one run on the same cluster; the figure is the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, sidecar_settings
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology

REGIONS = ("west", "central", "east")
STREAM = "bench"
IN_FLIGHT = 200


async def publish_for(nc: Client, vs: VirtualStream, seconds: float) -> float:
    """Acknowledged publishes per second in west over `seconds`."""
    js = nc.jetstream()
    subject = vs.publish_subject("west", "item")
    payload = b"x" * 128
    count = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        await asyncio.gather(*(js.publish(subject, payload) for _ in range(IN_FLIGHT)))
        count += IN_FLIGHT
    return count / (time.monotonic() - started)


async def consume(nc: Client, vs: VirtualStream) -> None:
    sub = await nc.jetstream().pull_subscribe_bind("bench", stream=vs.read_stream("west"))
    while True:
        with contextlib.suppress(TimeoutError):  # nats-py raises its own or the plain one
            msgs = await sub.fetch(500, timeout=0.5)
            for msg in msgs[:-1]:
                await msg.ack()
            if msgs:
                await msgs[-1].ack_sync()


@contextlib.asynccontextmanager
async def sidecar_processes(
    cluster: LocalSuperCluster, workdir: Path
) -> AsyncIterator[SidecarProcess]:
    """One `rsub run` process per region (as deployed: not in the publisher's process)."""
    procs = [
        SidecarProcess(sidecar_settings(cluster, r, streams=[STREAM], interval_ms=200), workdir)
        for r in REGIONS
    ]
    try:
        for proc in procs:
            await proc.start()
            await proc.wait_ready()
        yield procs[0]
    finally:
        await asyncio.gather(*(p.stop() for p in procs))


async def snapshots_completed(proc: SidecarProcess) -> float:
    text = await proc.metrics_text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rsub_snapshots_completed_total"
    )


async def run(seconds: float, rounds: int, directory: Path) -> None:
    vs = VirtualStream(STREAM, REGIONS)
    async with LocalSuperCluster(REGIONS, directory) as cluster:
        nc = await nats.connect(cluster.servers("west"))
        consumer: asyncio.Task[None] | None = None
        try:
            await apply_topology(nc, vs)
            await nc.jetstream().add_consumer(
                vs.read_stream("west"),
                durable_config(vs, "bench"),
            )
            consumer = asyncio.create_task(consume(nc, vs))
            without: list[float] = []
            with_sidecars: list[float] = []
            print(f"publishing in west, {IN_FLIGHT} in flight, {seconds:.0f} s per measurement")
            for n in range(1, rounds + 1):
                without.append(await publish_for(nc, vs, seconds))
                async with sidecar_processes(cluster, directory / f"round-{n}") as west:
                    completed = await snapshots_completed(west)
                    with_sidecars.append(await publish_for(nc, vs, seconds))
                    completed = await snapshots_completed(west) - completed
                print(
                    f"round {n}: without sidecars {without[-1]:8.0f} msg/s, "
                    f"with sidecars {with_sidecars[-1]:8.0f} msg/s "
                    f"({completed:.0f} snapshots completed by west meanwhile)"
                )
            a, b = statistics.median(without), statistics.median(with_sidecars)
            print(
                f"median: without {a:.0f} msg/s, with {b:.0f} msg/s, ratio with/without {b / a:.3f}"
            )
        finally:
            if consumer is not None:
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        asyncio.run(run(args.seconds, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
