"""What a consumed subscription costs its region's sidecar per acknowledged message.

Usage: .venv/bin/python bench/bench_ack_signals.py [--seconds 20] [--rate 2000] [--batch 100]

The sidecar reads a stream's positions only when they may have moved, and an ack is one of
its signals (`sidecar/nats/signals.py`: it subscribes to `$JS.ACK.<read stream>.>`), so every
ack a client sends also reaches the sidecar, one core NATS message each. On a local
two-region super-cluster with one virtual stream and one replicated durable in west, both
regions' sidecars run (`rsub run`, 1 s interval); a producer publishes `--rate` messages/s
in west and an application fetches them in batches of `--batch` and acks each one. Over the
window: acks sent, west's sidecar CPU (from /proc) per ack and in % of a core, its position
reads, and the same sidecar's CPU over an idle window of the same length just before.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import nats
from bench_sidecar_footprint import REGIONS, cpu_seconds, metric_total
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, sidecar_settings
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology


async def produce(nc: Client, vs: VirtualStream, rate: int) -> None:
    js = nc.jetstream()
    tick = 0.05
    while True:
        started = time.monotonic()
        await asyncio.gather(
            *(js.publish(vs.publish_subject("west", "x"), b"x") for _ in range(int(rate * tick)))
        )
        await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))


async def consume(nc: Client, vs: VirtualStream, batch: int, acked: list[int]) -> None:
    sub = await nc.jetstream().pull_subscribe_bind("app", stream=vs.read_stream("west"))
    while True:
        try:
            msgs = await sub.fetch(batch, timeout=1)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
        acked[0] += len(msgs)


async def run(seconds: float, rate: int, batch: int, directory: Path) -> None:
    vs = VirtualStream("acks", REGIONS)
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        conns = {r: await nats.connect(cluster.servers(r)) for r in REGIONS}
        try:
            await apply_topology(conns["west"], vs)
            js = conns["west"].jetstream()
            await js.add_consumer(vs.read_stream("west"), durable_config(vs, "app"))
            procs = [
                SidecarProcess(
                    sidecar_settings(cluster, r, streams=[vs.name], interval_ms=1000),
                    directory / r,
                )
                for r in REGIONS
            ]
            for proc in procs:
                await proc.start()
            west = procs[0]
            try:
                await asyncio.sleep(3)
                cpu, started = cpu_seconds(west.pid), time.monotonic()
                await asyncio.sleep(seconds)
                idle = cpu_seconds(west.pid) - cpu
                idle_pct = 100 * idle / (time.monotonic() - started)
                acked = [0]
                tasks = [
                    asyncio.ensure_future(produce(conns["west"], vs, rate)),
                    asyncio.ensure_future(consume(conns["west"], vs, batch, acked)),
                ]
                await asyncio.sleep(2)
                reads = await metric_total(west, "rsub_position_reads_total")
                count, cpu, started = acked[0], cpu_seconds(west.pid), time.monotonic()
                await asyncio.sleep(seconds)
                cpu = cpu_seconds(west.pid) - cpu
                elapsed = time.monotonic() - started
                count = acked[0] - count
                reads = await metric_total(west, "rsub_position_reads_total") - reads
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                await asyncio.gather(*(p.stop() for p in procs))
            per_ack = 1e6 * (cpu - idle * elapsed / seconds) / max(1, count)
            print(
                f"{count / elapsed:,.0f} acks/s for {elapsed:.0f} s: west's sidecar "
                f"{100 * cpu / elapsed:.1f} % of a core (idle before: {idle_pct:.1f} %), "
                f"{per_ack:.1f} us of CPU per ack above idle, {reads / elapsed:.1f} position "
                f"reads/s",
                flush=True,
            )
        finally:
            await asyncio.gather(*(nc.close() for nc in conns.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=int, default=2000, help="messages published per second")
    parser.add_argument("--batch", type=int, default=100, help="messages per fetch")
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-acks-") as tmp:
        asyncio.run(run(args.seconds, args.rate, args.batch, Path(tmp)))


if __name__ == "__main__":
    main()
