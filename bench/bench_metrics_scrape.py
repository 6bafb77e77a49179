"""The event loop's longest stall while /metrics is scraped, at thousands of streams' series:
the exposition encoded on the loop (before) against the sidecar's HTTP server, which encodes
and compresses it in a thread of its own (after), side by side in one run.

Usage: .venv/bin/python bench/bench_metrics_scrape.py [--streams 3000] [--durables 10]
       [--regions west,east] [--scrapes 5]

One `SidecarMetrics` registry holds, per stream, the series a leading sidecar of `--regions`
exports once its `--durables` replicated durables have sent updates and received progress:
the stream's counters, one snapshot's duration histogram, each origin's last marker age and
updates applied, each durable's replay gap towards every other region and its failover
exposure (the bench builds them through `SidecarMetrics`' own methods; it runs no NATS).
Two HTTP servers on the uvloop event loop the sidecar runs on serve that one registry:
`before`, a /metrics handler encoding on the loop as the sidecar did up to this bench's
commit (text or OpenMetrics, never compressed), and `after`, the sidecar's own
(`sidecar.api.http_server.start_http_server`). Each is scraped `--scrapes` times in turn by
another process, with Prometheus' Accept and Accept-Encoding headers, while a task on the loop
wakes every millisecond and notes the longest time between two wake-ups (the stall a lease
renewal, a marker or /healthz would have waited).

Printed first: what generate_latest's last step takes (one join, one encoding: C calls that
hold the GIL throughout, so the least an encoding thread stops the loop), and the longest
stall in a few idle seconds (the machine's own noise, with its load average). Then per
scrape: the longest stall, the scrape's time as the scraper saw it, the bytes sent and this
process's CPU during the scrape (the loop and the scrape thread).
The process runs as `rsub run` does: uvloop, the sidecar's GC thresholds, and the registry
built before `gc.freeze()` (the sidecar freezes what its bring-up built).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import choose_encoder

# Run as a script (bench/ is sys.path[0]): the repository root makes `tests.support` importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.api.http_server import start_http_server
from sidecar.cli.run import _GC_THRESHOLDS
from sidecar.metrics import SidecarMetrics
from sidecar.protocol import IgnoreReason, RejectReason
from tests.support.api_fakes import MemoryBackend

# What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
TICK_S = 0.001
IDLE_S = 5.0
# One scrape in another process, once told to go (its start-up stays out of the figures):
# prints the bytes received (compressed, as sent) and the seconds the scrape took.
SCRAPER = """
import sys, time, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Accept": sys.argv[2],
                                                       "Accept-Encoding": "gzip"})
print("ready", flush=True)
sys.stdin.readline()
started = time.perf_counter()
with urllib.request.urlopen(request, timeout=600) as response:
    body = response.read()
print(len(body), time.perf_counter() - started)
"""


def fill(metrics: SidecarMetrics, streams: int, durables: int, regions: Sequence[str]) -> None:
    """The series of `streams` streams led here (`regions[0]`) with `durables` durables each."""
    here, others = regions[0], regions[1:]
    reasons = [*(r.value for r in RejectReason), IgnoreReason.STALE_EPOCH.value]
    for i in range(streams):
        stream = f"stream-{i:05d}"
        metrics.stream_added(stream, reasons)
        metrics.snapshot_started(stream)
        metrics.snapshot_completed(stream, 0.02)
        metrics.update_sent(stream)
        metrics.position_read(stream)
        metrics.set_leader(stream, True, 1)
        metrics.set_origin_index_bytes(stream, 24)
        metrics.marker_seen(stream, here)
        for origin in others:
            metrics.marker_seen(stream, origin)
            metrics.update_applied(stream, origin)
        for d in range(durables):
            durable = f"durable-{d}"
            metrics.set_failover_exposure(stream, durable, 0)
            for region in others:
                metrics.set_replay_gap(stream, durable, region, 0)
    metrics.set_nats_connected(True)
    metrics.track_readiness(lambda: True)


def encoded_on_the_loop(metrics: SidecarMetrics) -> web.Application:
    """/metrics as the sidecar served it before: encoded on the event loop, uncompressed."""

    async def endpoint(request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(metrics.registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", endpoint)
    return app


class StallWatch:
    """A task waking every `TICK_S`: the longest time between two wake-ups since `reset`."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def reset(self) -> None:
        self.longest = 0.0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


@dataclass
class Scrape:
    stall_s: float
    seconds: float
    sent_bytes: int
    cpu_s: float


async def scrape(url: str, watch: StallWatch) -> Scrape:
    scraper = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRAPER,
        url,
        PROMETHEUS_ACCEPT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert scraper.stdout is not None
    await scraper.stdout.readline()  # ready
    watch.reset()
    cpu = time.process_time()
    out, _ = await scraper.communicate(b"go\n")
    cpu = time.process_time() - cpu
    if scraper.returncode != 0:
        raise RuntimeError(f"the scrape of {url} failed ({scraper.returncode})")
    sent, seconds = out.split()
    return Scrape(watch.longest, float(seconds), int(sent), cpu)


def show(label: str, scrapes: Sequence[Scrape]) -> None:
    for n, s in enumerate(scrapes, 1):
        print(
            f"{label:>7} #{n}: longest loop stall {1000 * s.stall_s:8.1f} ms, scrape "
            f"{s.seconds:5.2f} s, {s.sent_bytes / 1e6:5.2f} MB sent, CPU {s.cpu_s:5.2f} s"
        )
    stalls = [s.stall_s for s in scrapes]
    print(
        f"{label:>7}: longest stall median {1000 * statistics.median(stalls):.1f} ms, "
        f"max {1000 * max(stalls):.1f} ms"
    )


async def main(args: argparse.Namespace) -> None:
    metrics = SidecarMetrics()
    started = time.perf_counter()
    fill(metrics, args.streams, args.durables, args.regions)
    # The sidecar's process: its GC thresholds, and what the bring-up built frozen.
    gc.set_threshold(*_GC_THRESHOLDS)
    gc.freeze()
    text = generate_latest(metrics.registry)
    lines = text.decode().splitlines(keepends=True)
    print(
        f"{args.streams:,} streams x {args.durables} durables, regions {','.join(args.regions)}: "
        f"{len(lines):,} lines, {len(text) / 1e6:.1f} MB of text format "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    # generate_latest ends with one join of its lines and one encoding: C calls that hold the
    # GIL throughout, so a thread encoding a scrape stops the loop that long at least.
    joins = []
    for _ in range(5):
        join_started = time.perf_counter()
        "".join(lines).encode()
        joins.append(time.perf_counter() - join_started)
    print(f"   the exposition's final join and encoding: {1000 * min(joins):.1f} ms (best of 5)")
    before = web.AppRunner(encoded_on_the_loop(metrics), access_log=None)
    await before.setup()
    site = web.TCPSite(before, "127.0.0.1", 0)
    await site.start()
    before_url = f"http://127.0.0.1:{before.addresses[0][1]}/metrics"
    after = await start_http_server(MemoryBackend(), metrics, "127.0.0.1:0")
    after_url = f"http://127.0.0.1:{after.port}/metrics"
    watch = StallWatch()
    watch.start()
    results: dict[str, list[Scrape]] = {"before": [], "after": []}
    try:
        # The machine's own noise: the longest stall with nothing to do.
        watch.reset()
        await asyncio.sleep(IDLE_S)
        print(
            f"   idle: longest loop stall {1000 * watch.longest:8.1f} ms in {IDLE_S:.0f} s "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )
        for _ in range(args.scrapes):
            results["before"].append(await scrape(before_url, watch))
            results["after"].append(await scrape(after_url, watch))
    finally:
        await watch.stop()
        await after.stop()
        await before.cleanup()
    for label, scrapes in results.items():
        show(label, scrapes)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=3000)
    parser.add_argument("--durables", type=int, default=10)
    parser.add_argument(
        "--regions", type=lambda s: s.split(","), default=["west", "east"], help="here first"
    )
    parser.add_argument("--scrapes", type=int, default=5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main(arguments))
