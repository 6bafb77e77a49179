"""The main job: a local multi-region run of rsub (`make demo`, `python -m sidecar.dev.demo`).

Brings up one NATS cluster per region on 127.0.0.1, applies the virtual-stream topology,
publishes from every region at once, waits until every read stream holds every message, and
prints one row per region. Everything is torn down at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy

from sidecar.dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.nats.names import SOURCE_HEADER, VirtualStream
from sidecar.nats.topology import apply_topology

PUBLISH_BATCH = 500


@dataclass(frozen=True)
class RegionResult:
    region: str
    messages: int
    per_origin: dict[str, int]
    order_intact: bool
    converge_s: float


class Progress:
    """One rewritten status line on a terminal, plain lines otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()

    def show(self, text: str) -> None:
        if self._tty:
            sys.stderr.write(f"\r\x1b[K{text}")
        else:
            sys.stderr.write(f"{text}\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self._tty:
            sys.stderr.write("\n")


async def publish_region(nc: NATS, vs: VirtualStream, region: str, count: int) -> None:
    """Publish `count` messages in `region`, acknowledged by its write stream, in batches."""
    js = nc.jetstream()
    subject = vs.publish_subject(region, "created")
    for start in range(0, count, PUBLISH_BATCH):
        batch = range(start, min(start + PUBLISH_BATCH, count))
        acks = [js.publish(subject, f'{{"n": {n}}}'.encode()) for n in batch]
        await asyncio.gather(*acks)


async def read_origins(nc: NATS, vs: VirtualStream, region: str) -> list[tuple[str, int]]:
    """(origin region, origin sequence) of every data message in `region`'s read stream."""
    js = nc.jetstream()
    stream = vs.read_stream(region)
    info = await js.stream_info(stream)
    last = info.state.last_seq
    origins: list[tuple[str, int]] = []
    if info.state.messages == 0:
        return origins
    sub = await js.subscribe(
        vs.data_filter(),
        stream=stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            origin = vs.origin_of((msg.headers or {}).get(SOURCE_HEADER, ""))
            if origin is not None:
                origins.append(origin)
            if msg.metadata.sequence.stream >= last or msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return origins


def order_intact(origins: Sequence[tuple[str, int]]) -> bool:
    """True when every origin's sequences appear strictly increasing."""
    last: dict[str, int] = {}
    for region, seq in origins:
        if seq <= last.get(region, 0):
            return False
        last[region] = seq
    return True


async def wait_converged(
    ncs: dict[str, NATS], vs: VirtualStream, expected: int, started: float, progress: Progress
) -> dict[str, float]:
    """Seconds from the start of publishing until each read stream held `expected` messages."""
    converged: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(converged) < len(vs.regions):
        counts = {}
        for region in vs.regions:
            info = await ncs[region].jetstream().stream_info(vs.read_stream(region))
            counts[region] = info.state.messages
            if region not in converged and info.state.messages >= expected:
                converged[region] = time.monotonic() - started
        progress.show("converging: " + "  ".join(f"{r} {counts[r]}/{expected}" for r in vs.regions))
        if time.monotonic() > deadline:
            raise TimeoutError(f"read streams did not converge: {counts}")
        await asyncio.sleep(0.1)
    return converged


async def replication_check(
    cluster: LocalSuperCluster, vs: VirtualStream, per_region: int, progress: Progress
) -> list[RegionResult]:
    ncs = {r: await nats.connect(servers=cluster.servers(r)) for r in vs.regions}
    try:
        report = await apply_topology(ncs[vs.regions[0]], vs)
        created = sum(1 for s in report.streams if s.action == "created")
        progress.show(f"topology applied: {created} streams created")
        progress.done()
        started = time.monotonic()
        await asyncio.gather(*(publish_region(ncs[r], vs, r, per_region) for r in vs.regions))
        converge = await wait_converged(ncs, vs, per_region * len(vs.regions), started, progress)
        progress.done()
        results = []
        for region in vs.regions:
            origins = await read_origins(ncs[region], vs, region)
            per_origin = {r: sum(1 for o, _ in origins if o == r) for r in vs.regions}
            results.append(
                RegionResult(
                    region, len(origins), per_origin, order_intact(origins), converge[region]
                )
            )
        return results
    finally:
        for nc in ncs.values():
            await nc.close()


def print_table(results: Sequence[RegionResult], regions: Sequence[str]) -> None:
    header = ["region", "messages", *(f"from {r}" for r in regions), "order intact", "converged"]
    rows = [
        [
            r.region,
            str(r.messages),
            *(str(r.per_origin[o]) for o in regions),
            "yes" if r.order_intact else "NO",
            f"{r.converge_s:.2f} s",
        ]
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for line in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


async def run(regions: Sequence[str], per_region: int, directory: Path) -> int:
    progress = Progress()
    progress.show(f"starting {len(regions)} regions in {directory} ...")
    started = time.monotonic()
    async with LocalSuperCluster(regions, directory) as cluster:
        progress.show(f"cluster ready in {time.monotonic() - started:.1f} s")
        progress.done()
        vs = VirtualStream("orders", tuple(regions))
        results = await replication_check(cluster, vs, per_region, progress)
    expected = per_region * len(regions)
    print()
    print(f"virtual stream 'orders': {per_region} messages published in each region")
    print_table(results, regions)
    healthy = all(r.messages == expected and r.order_intact for r in results)
    print(f"\nresult: {'every read stream holds every message' if healthy else 'MISMATCH'}")
    return 0 if healthy else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--regions", default="west,central,east")
    parser.add_argument("--messages", type=int, default=3000, help="published per region")
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    configure_logging("console", "warning")
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    try:
        if args.dir is not None:
            return asyncio.run(run(regions, args.messages, args.dir))
        with tempfile.TemporaryDirectory(prefix="rsub-demo-") as tmp:
            return asyncio.run(run(regions, args.messages, Path(tmp)))
    except KeyboardInterrupt:
        print("\ninterrupted: everything was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
