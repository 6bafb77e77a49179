"""Throughput of the JetStream requests that reading positions makes, each kind alone.

Usage: .venv/bin/python bench/bench_position_requests.py [--streams 300] [--seconds 4]
       [--concurrency 1,50]

On a local two-region super-cluster (one server per region), `--streams` virtual streams
each get 10 replicated durables in west. Then each kind of request a position read makes
(`STREAM.INFO` of a read stream, `CONSUMER.LIST` of its 10 durables, `CONSUMER.INFO` of one
durable, a KV get of a cursor key), and `STREAM.LIST` (one page of up to 256 stream infos,
a candidate for batched stream state), runs alone for `--seconds` from one client with the
given number of requests in flight: requests per second and the servers' CPU (from /proc)
in that time. It shows which request limits how many streams can be read per second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import nats
from bench_sidecar_footprint import cpu_seconds, lay_out, server_pids
from nats.aio.client import Client
from nats.js.kv import KeyValue

from rsub_dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.nats import jsapi

REGIONS = ("west", "east")
DURABLES = 10


async def measure(
    label: str,
    request: Callable[[int], Awaitable[Any]],
    concurrency: int,
    seconds: float,
    servers: Sequence[int],
) -> None:
    before = [cpu_seconds(p) for p in servers]
    started = time.monotonic()
    done = errors = 0

    async def worker(first: int) -> None:
        nonlocal done, errors
        i = first
        while time.monotonic() - started < seconds:
            try:
                await request(i)
                done += 1
            except (TimeoutError, nats.errors.Error):
                errors += 1
            i += concurrency

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.monotonic() - started
    cpu = " + ".join(
        f"{100 * (cpu_seconds(p) - b) / elapsed:.0f}" for p, b in zip(servers, before, strict=True)
    )
    print(
        f"{concurrency:>5} in flight {label:>22}: {done / elapsed:7.0f} requests/s, "
        f"{errors} errors, servers CPU {cpu} % of a core",
        flush=True,
    )


def kinds(
    nc: Client, streams: Sequence[VirtualStream], kv: KeyValue
) -> dict[str, Callable[[int], Awaitable[Any]]]:
    def read_stream(i: int) -> str:
        return streams[i % len(streams)].read_stream("west")

    return {
        "STREAM.INFO": lambda i: jsapi.request(nc, f"STREAM.INFO.{read_stream(i)}", timeout_s=10),
        f"CONSUMER.LIST ({DURABLES})": lambda i: jsapi.request(
            nc, f"CONSUMER.LIST.{read_stream(i)}", {"offset": 0}, timeout_s=10
        ),
        "CONSUMER.INFO": lambda i: jsapi.request(
            nc, f"CONSUMER.INFO.{read_stream(i)}.d{i % DURABLES}", timeout_s=10
        ),
        "KV get": lambda i: kv.get("cursors.s000"),
        "STREAM.LIST (256/page)": lambda i: jsapi.request(
            nc, "STREAM.LIST", {"offset": (i * 256) % (2 * len(streams))}, timeout_s=30
        ),
    }


async def run(streams_n: int, seconds: float, concurrency: Sequence[int], directory: Path) -> None:
    streams = [VirtualStream(f"s{i:03d}", REGIONS) for i in range(streams_n)]
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            js = nc.jetstream()
            await lay_out(nc, streams, DURABLES)
            kv = await js.create_key_value(bucket="bench")
            await kv.put("cursors.s000", b'{"spark": 1}')
            servers = server_pids(directory / "cluster")
            print(f"{streams_n} streams x {DURABLES} durables in west; 2 servers", flush=True)
            for n in concurrency:
                for label, request in kinds(nc, streams, kv).items():
                    await measure(label, request, n, seconds, servers)
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--concurrency", default="1,50")
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    concurrency = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp:
        asyncio.run(run(args.streams, args.seconds, concurrency, Path(tmp)))


if __name__ == "__main__":
    main()
