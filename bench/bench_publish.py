"""CPU per acknowledged marker publish: nats-py's `js.publish` against rsub's
`MarkerPublisher`, on asyncio's event loop and on uvloop's, side by side.

Usage: .venv/bin/python bench/bench_publish.py [--publishes 20000] [--concurrency 100]
       [--rounds 3]

On a local two-region super-cluster without gateway proxies (its servers then need no event
loop of this process between the runs), one stream in west takes the markers. Each round runs,
in turn, every (event loop, publish path) pair on a fresh client: `--concurrency` tasks
(streams, in a sidecar) each publish markers one after the other, each awaited until
acknowledged, `--publishes` in all, each with its own `Nats-Msg-Id`. Printed: this process's
CPU time per publish and the publishes per second. The pairs take turns within a round, so
a slow moment of this shared machine falls on one pair of one round, not on one pair.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
import uvloop
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.nats.nats_port import MSG_ID_HEADER, MarkerPublisher

STREAM = "M"
SUBJECT = "_rsub.M.marker.west"
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
Publish = Callable[[Client, str], Awaitable[object]]


def js_publish(nc: Client, msg_id: str) -> Awaitable[object]:
    return nc.jetstream().publish(
        SUBJECT, b"m" * 60, stream=STREAM, headers={MSG_ID_HEADER: msg_id}
    )


def marker_publisher() -> Publish:
    publisher = MarkerPublisher()
    return lambda nc, msg_id: publisher.publish(nc, STREAM, SUBJECT, b"m" * 60, msg_id)


async def measure(url: str, publish: Publish, count: int, concurrency: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `count` publishes by `concurrency` tasks."""
    nc = await nats.connect(url)
    run = uuid.uuid4().hex
    ids = itertools.count()
    try:
        await publish(nc, f"{run}-warm-up")  # a first publish sets up subscriptions

        async def worker() -> None:
            for _ in range(count // concurrency):
                await publish(nc, f"{run}-{next(ids)}")

        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.process_time() - cpu, time.monotonic() - wall
    finally:
        await nc.close()


async def prepare(url: str) -> None:
    nc = await nats.connect(url)
    try:
        # A duplicate window of 1 s keeps the stream's id table small across the rounds.
        await nc.jetstream().add_stream(name=STREAM, subjects=["_rsub.M.>"], duplicate_window=1)
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("console", "warning")
    paths: dict[str, Callable[[], Publish]] = {
        "js.publish": lambda: js_publish,
        "MarkerPublisher": marker_publisher,
    }
    count = args.publishes - args.publishes % args.concurrency
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:

        async def cluster_up() -> LocalSuperCluster:
            cluster = LocalSuperCluster(
                ("west", "east"), Path(tmp) / "cluster", proxy_gateways=False
            )
            return await cluster.__aenter__()

        runner = asyncio.Runner()
        cluster = runner.run(cluster_up())
        try:
            url = cluster.servers("west")[0]
            runner.run(prepare(url))
            print(
                f"{count:,} publishes per run by {args.concurrency} tasks, each awaited until "
                "acknowledged; CPU of this process",
                flush=True,
            )
            for round_ in range(1, args.rounds + 1):
                for (loop_name, factory), (path_name, make) in itertools.product(
                    LOOPS.items(), paths.items()
                ):
                    with asyncio.Runner(loop_factory=factory) as loop:
                        cpu, wall = loop.run(measure(url, make(), count, args.concurrency))
                    print(
                        f"round {round_}: {loop_name:>7}, {path_name:>15}: "
                        f"{1e6 * cpu / count:6.1f} us CPU per publish, {count / wall:8,.0f}/s",
                        flush=True,
                    )
        finally:
            runner.run(cluster.__aexit__(None, None, None))
            runner.close()


if __name__ == "__main__":
    main()
