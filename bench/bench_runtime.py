"""Failover through real sidecars: `.venv/bin/python bench/bench_runtime.py [--seconds 8]`.

Two regions (a local super-cluster), one in-process `Runtime` each (snapshot interval
200 ms and 1000 ms). A producer publishes in `west` at ~200 msg/s while a replicated durable
consumes and acks there; then the west consumer stops (the "failover"), the producer goes on
for a second, and the same durable name is consumed in `east` until everything arrived.
Prints snapshots completed and their durations, messages lost (must be 0) and duplicates
(bounded by about one snapshot interval of traffic).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import nats
import structlog
from nats.js import JetStreamContext, api

from rsub_dev.cluster import LocalSuperCluster
from sidecar.config.loading import config_from_mapping
from sidecar.logs import configure_logging
from sidecar.runtime import Runtime

STREAM, DURABLE = "bench", "app"
RATE_PER_S = 200


async def produce(js: JetStreamContext, stop: asyncio.Event, sent: list[bytes]) -> None:
    while not stop.is_set():
        data = f"m{len(sent)}".encode()
        await js.publish(f"{STREAM}.west.item", data, stream=f"{STREAM}-write-west")
        sent.append(data)
        await asyncio.sleep(1 / RATE_PER_S)


async def consume(sub: JetStreamContext.PullSubscription, stop: asyncio.Event) -> list[bytes]:
    got: list[bytes] = []
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):  # nats-py raises its own or the plain one
            for msg in await sub.fetch(50, timeout=0.2):
                await msg.ack()
                got.append(msg.data)
    return got


async def run(interval_ms: int, seconds: float, directory: Path) -> None:
    async with LocalSuperCluster(["west", "east"], directory) as cluster:
        runtimes = {
            r: Runtime(
                config_from_mapping(
                    {
                        "region": r,
                        "regions": ["west", "east"],
                        "nats": {"servers": cluster.servers(r)},
                        "streams": [{"name": STREAM}],
                        "snapshot": {"interval_ms": interval_ms},
                    }
                ),
            )
            for r in cluster.regions
        }
        for runtime in runtimes.values():
            await runtime.start()
            await runtime.wait_ready(60)
        west_nc = await nats.connect(cluster.servers("west"))
        east_nc = await nats.connect(cluster.servers("east"))
        try:
            west, east = west_nc.jetstream(), east_nc.jetstream()
            await west.add_consumer(
                f"{STREAM}-read-west",
                durable_name=DURABLE,
                filter_subject=f"{STREAM}.>",
                ack_policy=api.AckPolicy.EXPLICIT,
                metadata={"rsub.replicate": "true"},
            )
            sub = await west.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-west")
            stop_producer, stop_consumer = asyncio.Event(), asyncio.Event()
            sent: list[bytes] = []
            producer = asyncio.create_task(produce(west, stop_producer, sent))
            consumer = asyncio.create_task(consume(sub, stop_consumer))
            await asyncio.sleep(seconds)
            stop_consumer.set()
            west_got = await consumer
            await asyncio.sleep(1.0)
            stop_producer.set()
            await producer

            started = time.monotonic()
            east_sub = await east.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-east")
            east_got: list[bytes] = []
            while set(west_got + east_got) != set(sent) and time.monotonic() - started < 60:
                with contextlib.suppress(TimeoutError):  # nats-py raises its own or the plain one
                    for msg in await east_sub.fetch(200, timeout=0.5):
                        await msg.ack()
                        east_got.append(msg.data)
            snapshots = await runtimes["west"].list_snapshots(STREAM)
            durations = [s.duration_ms for s in snapshots] or [0]
            lost = len(set(sent) - set(west_got + east_got))
            duplicates = len(west_got) + len(east_got) - len(set(west_got + east_got))
            print(
                f"interval {interval_ms:5d} ms: sent {len(sent)}, consumed west {len(west_got)}"
                f" / east {len(east_got)}; lost {lost}, duplicates {duplicates}"
                f" (~{RATE_PER_S * interval_ms // 1000} msg per interval); snapshots kept "
                f"{len(snapshots)}, duration ms median {statistics.median(durations):.0f}"
                f" max {max(durations)}"
            )
        finally:
            await west_nc.close()
            await east_nc.close()
            for runtime in runtimes.values():
                await runtime.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="consumption time in west")
    args = parser.parse_args()
    configure_logging("console", "warning")
    structlog.get_logger(__name__).info("bench_runtime_start")
    for interval_ms in (200, 1000):
        with tempfile.TemporaryDirectory(prefix="rsub-bench-") as tmp:
            await run(interval_ms, args.seconds, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
