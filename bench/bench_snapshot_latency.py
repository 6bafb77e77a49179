"""Snapshot completion time against inter-region latency (3 regions: two rounds per snapshot).

Usage: .venv/bin/python bench/bench_snapshot_latency.py [--seconds 10] [--delays-ms 0,20,50]
       [--interval-ms 200] [--trace]

On a local super-cluster (west, central, east) with one sidecar per region, a replicated
durable in west and a steady producer in west, every gateway link gets the delay (each
way); for each delay the snapshots west completes are measured from the markers stored in
its read stream: first request stored -> completed-snapshot marker stored. The lower bound
is two rounds of one round trip each: 2 x 2 x delay. The first snapshot is a warm-up, not
counted: its markers wait for sourcing to start (see docs/benchmarks.md). `wanted` is how many could have
completed (one per interval); with `--trace`, the slowest snapshot of each delay is traced:
each of its markers as stored in every region's write stream (when it was published) and
read stream (when sourcing delivered it), in ms after its first request was stored.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import nats
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import (
    RegionSidecars,
    durable_config,
    percentile,
    read_markers,
    read_stored,
    snapshot_latencies_ms,
    wait_until,
)
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.protocol import Marker, Request, Response, Snapshot, Update, decode

REGIONS = ("west", "central", "east")
STREAM = "bench"
RATE_PER_S = 50


async def produce(nc: Client, vs: VirtualStream, stop: asyncio.Event) -> None:
    js = nc.jetstream()
    subject = vs.publish_subject("west", "item")
    for n in itertools.count():
        if stop.is_set():
            return
        await js.publish(subject, str(n).encode())
        await asyncio.sleep(1 / RATE_PER_S)


def _of_snapshot(marker: Marker, sid: str) -> str | None:
    """How `marker` takes part in snapshot `sid` (None: it does not)."""
    body = marker.body
    if isinstance(body, Request) and str(body.id) == sid:
        return f"request r{body.round} by {marker.region}"
    if isinstance(body, Response) and str(body.id) == sid:
        return f"response r{body.round} by {marker.region}"
    if isinstance(body, Snapshot) and str(body.id) == sid:
        return "completed"
    if isinstance(body, Update) and str(body.snapshot_id) == sid:
        return f"update by {marker.region}"
    return None


async def trace(nc: Client, vs: VirtualStream, sid: str) -> None:
    """Print when each marker of snapshot `sid` was stored, in every stream of every region."""
    rows: list[tuple[float, str, str]] = []
    for region in REGIONS:
        for stream, subjects in (
            (vs.write_stream(region), vs.marker_subject(region)),
            (vs.read_stream(region), vs.marker_filter()),
        ):
            for stored in await read_stored(nc, stream, subjects):
                decoded = decode(stored.data, stream=vs.name, regions=vs.regions)
                role = _of_snapshot(decoded, sid) if isinstance(decoded, Marker) else None
                if role is not None:
                    rows.append((stored.stored_unix_ms, role, stream))
    start = min(t for t, role, stream in rows if role == "request r1 by west")
    for stored_ms, role, stream in sorted(rows):
        print(f"{'':>16}{stored_ms - start:8.1f} ms  {role:<22} stored in {stream}")


async def run(
    delays_ms: Sequence[int], seconds: float, interval_ms: int, directory: Path, traced: bool
) -> None:
    vs = VirtualStream(STREAM, REGIONS)
    async with (
        LocalSuperCluster(REGIONS, directory) as cluster,
        RegionSidecars(cluster, streams=[STREAM], interval_ms=interval_ms, timeout_s=10),
    ):
        nc = await nats.connect(cluster.servers("west"))
        try:
            await nc.jetstream().add_consumer(
                vs.read_stream("west"),
                durable_config(vs, "bench"),
            )
            stop = asyncio.Event()
            producer = asyncio.create_task(produce(nc, vs, stop))
            print(
                f"3 regions, snapshot interval {interval_ms} ms, {RATE_PER_S} msg/s in west, "
                f"{seconds:.0f} s per delay"
            )
            first: dict[str, float] = {}

            async def first_completed() -> bool:
                first.update(snapshot_latencies_ms(await read_markers(nc, vs, "west"), "west"))
                return bool(first)

            await wait_until(first_completed, "west's first snapshot", 60, poll_s=0.2)
            print(
                f"warm-up (not counted below): the first snapshot took {max(first.values()):.1f} "
                "ms (the first markers wait for nats-server's sourcing of each write stream to "
                "start)"
            )
            print(
                f"{'delay each way':>15} {'snapshots':>10} {'wanted':>7} {'p50':>9} {'p99':>9} "
                f"{'max':>9} {'bound':>9}"
            )
            seen: set[str] = set()
            for delay_ms in delays_ms:
                for a, b in itertools.combinations(REGIONS, 2):
                    await cluster.set_link_delay(a, b, delay_ms / 1000)
                # Let snapshots that started under the previous delay finish first.
                await asyncio.sleep(1 + 4 * delay_ms / 1000)
                seen |= set(snapshot_latencies_ms(await read_markers(nc, vs, "west"), "west"))
                started = time.monotonic()
                await asyncio.sleep(seconds)
                latencies = snapshot_latencies_ms(await read_markers(nc, vs, "west"), "west")
                by_id = {sid: ms for sid, ms in latencies.items() if sid not in seen}
                fresh = list(by_id.values())
                seen |= set(latencies)
                elapsed = time.monotonic() - started
                if not fresh:
                    print(f"{delay_ms:>12} ms  no snapshot completed in {elapsed:.0f} s")
                    continue
                wanted = int(elapsed * 1000 / interval_ms)
                print(
                    f"{delay_ms:>12} ms {len(fresh):>10} {wanted:>7} {percentile(fresh, 50):>6.1f} "
                    f"ms {percentile(fresh, 99):>6.1f} ms {max(fresh):>6.1f} ms "
                    f"{4 * delay_ms:>6} ms"
                )
                if traced:
                    slowest = max(by_id, key=by_id.__getitem__)
                    print(f"{'':>16}slowest: {slowest}")
                    await trace(nc, vs, slowest)
            stop.set()
            await producer
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--delays-ms", default="0,20,50")
    parser.add_argument("--interval-ms", type=int, default=200)
    parser.add_argument("--trace", action="store_true", help="trace the slowest snapshots")
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    delays = [int(d) for d in args.delays_ms.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        asyncio.run(run(delays, args.seconds, args.interval_ms, Path(tmp), args.trace))


if __name__ == "__main__":
    main()
