"""CPU and memory of one sidecar with many streams and replicated subscriptions.

Usage: .venv/bin/python bench/bench_sidecar_footprint.py [--streams 100] [--durables 10]
       [--seconds 30]

On a local two-region super-cluster, `--streams` virtual streams each get `--durables`
replicated durables in west; west's and east's sidecars run as `rsub run` processes with a
1 s snapshot interval. West's sidecar is measured from /proc: CPU seconds (user + system)
over a window and its resident memory, first idle (no new data: no snapshot starts), then
with one message per stream per second published in west (every stream snapshots every
second).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path

import nats
import structlog
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, sidecar_settings
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology

REGIONS = ("west", "east")
CONCURRENCY = 20
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def memory_mib(pid: int) -> dict[str, float]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


async def bounded(jobs: Iterable[Awaitable[object]]) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Awaitable[object]) -> None:
        async with limit:
            await job

    await asyncio.gather(*(one(j) for j in jobs))


async def snapshots_completed(proc: SidecarProcess) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(await proc.metrics_text())
        for s in family.samples
        if s.name == "rsub_snapshots_completed_total"
    )


async def window(
    proc: SidecarProcess, seconds: float, label: str, load: Awaitable[None] | None = None
) -> None:
    task = asyncio.ensure_future(load) if load is not None else None
    cpu, snaps, started = cpu_seconds(proc.pid), await snapshots_completed(proc), time.monotonic()
    await asyncio.sleep(seconds)
    cpu = cpu_seconds(proc.pid) - cpu
    snaps = await snapshots_completed(proc) - snaps
    elapsed = time.monotonic() - started
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    mem = memory_mib(proc.pid)
    print(
        f"{label:>6}: CPU {cpu:6.2f} s in {elapsed:.0f} s ({100 * cpu / elapsed:5.1f} % of a core), "
        f"RSS {mem['VmRSS']:.0f} MiB (peak {mem['VmHWM']:.0f} MiB), "
        f"{snaps / elapsed:.1f} snapshots/s completed"
    )


async def publish_each_stream(nc: Client, streams: list[VirtualStream]) -> None:
    js = nc.jetstream()
    while True:
        started = time.monotonic()
        await asyncio.gather(
            *(js.publish(vs.publish_subject("west", "tick"), b"x") for vs in streams)
        )
        await asyncio.sleep(max(0.0, 1 - (time.monotonic() - started)))


async def run(stream_count: int, durables: int, seconds: float, directory: Path) -> None:
    names = [f"s{i:03d}" for i in range(stream_count)]
    streams = [VirtualStream(n, REGIONS) for n in names]
    async with LocalSuperCluster(REGIONS, directory) as cluster:
        nc = await nats.connect(cluster.servers("west"))
        procs = [
            SidecarProcess(
                sidecar_settings(cluster, r, streams=names, interval_ms=1000, timeout_s=30),
                directory / r,
            )
            for r in REGIONS
        ]
        try:
            started = time.monotonic()
            await bounded(apply_topology(nc, vs) for vs in streams)
            js = nc.jetstream()
            await bounded(
                js.add_consumer(
                    vs.read_stream("west"),
                    durable_config(vs, f"d{d}"),
                )
                for vs in streams
                for d in range(durables)
            )
            print(
                f"{stream_count} streams x {durables} replicated durables in west set up in "
                f"{time.monotonic() - started:.0f} s"
            )
            for proc in procs:
                await proc.start()
                await proc.wait_ready(600)
            west = procs[0]
            print(f"sidecars ready after {time.monotonic() - started:.0f} s; measuring west's")
            await window(west, seconds, "idle")
            await window(west, seconds, "loaded", publish_each_stream(nc, streams))
        finally:
            await asyncio.gather(*(p.stop() for p in procs))
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--durables", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp:
        asyncio.run(run(args.streams, args.durables, args.seconds, Path(tmp)))


if __name__ == "__main__":
    main()
