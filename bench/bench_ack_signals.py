"""What an acknowledgement costs the sidecar: the CPU of one consumer signal.

Usage: .venv/bin/python bench/bench_ack_signals.py [--acks 50000] [--rounds 3]

The sidecar reads a stream's positions only when they may have moved, and an ack is one of
its signals: `sidecar.nats.signals.follow_consumers` subscribes to `$JS.ACK.<read stream>.>`,
so every ack a client sends also reaches the sidecar, one core NATS message each. On a
local two-region super-cluster, `--acks` acks (as a client sends them, to a stream that has
no such delivery: the server drops them) are published from one connection, first with
nothing following them, then with `follow_consumers` of that stream on a second connection
in the same process; the difference of this process's CPU time per ack is what the signal
costs. A third pass follows the acks with a bare listener that only counts them (the signal
as it was before each ack was also parsed for its consumer and sequence, the consumption
sign of docs/protocol.md §8), so the parse's cost shows side by side. Each round prints all
three.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.signals import follow_consumers

STREAM = "orders-read-west"


async def publish_acks(nc: Client, count: int) -> None:
    for i in range(count):
        await nc.publish(f"$JS.ACK.{STREAM}.app.1.{i + 1}.{i + 1}.0.0", b"+ACK")
    await nc.flush()


async def followed_cpu(nc: Client, sidecar: Client, acks: int, parse: bool) -> float:
    """CPU seconds to publish `acks` acks and hear each on `sidecar`: through
    `follow_consumers` (parsed), or a listener that only counts."""
    heard = 0
    every = asyncio.Event()

    def moved() -> None:
        nonlocal heard
        heard += 1
        if heard == acks:
            every.set()

    port = NatsPort(sidecar)
    if parse:
        listeners = await follow_consumers(port, STREAM, moved, lambda consumer, seq: None)
    else:
        listeners = [await port.listen(f"$JS.ACK.{STREAM}.>", lambda subject, data: moved())]
    await sidecar.flush()
    started = time.process_time()
    await publish_acks(nc, acks)
    await asyncio.wait_for(every.wait(), 120)
    cpu = time.process_time() - started
    for listener in listeners:
        await listener.stop()
    return cpu


async def run(acks: int, rounds: int, directory: Path) -> None:
    async with LocalSuperCluster(("west", "east"), directory / "cluster") as cluster:
        client = await nats.connect(cluster.servers("west"))
        sidecar = await nats.connect(cluster.servers("west"))
        try:
            for _ in range(rounds):
                started = time.process_time()
                await publish_acks(client, acks)
                alone = time.process_time() - started
                counted = await followed_cpu(client, sidecar, acks, parse=False)
                parsed = await followed_cpu(client, sidecar, acks, parse=True)
                per = 1e6 / acks
                print(
                    f"{acks:,} acks: {per * alone:.1f} us of CPU each to send; the signal "
                    f"costs {per * (counted - alone):.1f} us per ack counted, "
                    f"{per * (parsed - alone):.1f} us parsed (consumer and sequence)",
                    flush=True,
                )
        finally:
            await client.close()
            await sidecar.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acks", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-acks-") as tmp:
        asyncio.run(run(args.acks, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
