"""CPU per message of a stream tail (`sidecar.nats.stream_reader.tail`), this checkout's and
optionally another's, side by side, and of the same tail through the port the runtime reads
it by (`NatsPort.read(..., live=True)`).

Usage: .venv/bin/python bench/bench_tail.py [--messages 20000] [--rounds 3] [--baseline DIR]

On a local two-region super-cluster, `--messages` messages of 64 bytes are stored in one
stream; then, in turn for each version and `--rounds` times, a tail from the first message
takes them all: this process's CPU time per message and the messages per second. A tail is
what a sidecar runs per stream for its markers and for its data's origins, so this is the
per-message cost of both; the `port` row adds what the port costs on top (a `StoredMessage`
per message, one more generator).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from types import ModuleType

import nats
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.nats.nats_port import NatsPort

_THIS = Path(__file__).resolve().parent.parent
_READER = Path("sidecar/nats/stream_reader.py")


def reader_of(checkout: Path, label: str) -> ModuleType:
    """`stream_reader` as `checkout` has it (it imports nothing else of rsub)."""
    spec = importlib.util.spec_from_file_location(f"stream_reader_{label}", checkout / _READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Tail = Callable[[Client], AsyncGenerator[object, None]]
"""A tail of every message of stream `T` from the first, over a client."""


def reader_tail(reader: ModuleType) -> Tail:
    return lambda nc: reader.tail(nc.jetstream(), "T", "t.>", 1)


def port_tail(nc: Client) -> AsyncGenerator[object, None]:
    return NatsPort(nc).read("T", "t.>", 1, live=True)


async def take_all(tail: AsyncGenerator[object, None], count: int) -> None:
    async with contextlib.aclosing(tail):
        taken = 0
        async for _ in tail:
            taken += 1
            if taken == count:
                return


async def run(count: int, rounds: int, versions: dict[str, Tail], directory: Path) -> None:
    async with LocalSuperCluster(("west", "east"), directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t.>"])
            for first in range(0, count, 500):
                n = min(500, count - first)
                await asyncio.gather(*(js.publish("t.a", b"x" * 64) for _ in range(n)))
            for _ in range(rounds):
                for label, tail in versions.items():
                    cpu, wall = time.process_time(), time.monotonic()
                    await take_all(tail(nc), count)
                    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                    print(
                        f"{label:>8}: {1e6 * cpu / count:5.1f} us of CPU per message, "
                        f"{count / wall:8,.0f} messages/s",
                        flush=True,
                    )
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout to compare")
    args = parser.parse_args()
    versions: dict[str, Tail] = {}
    if args.baseline is not None:
        versions["baseline"] = reader_tail(reader_of(args.baseline, "baseline"))
    versions["this"] = reader_tail(reader_of(_THIS, "this"))
    versions["port"] = port_tail
    configure_logging("console", "error", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-tail-") as tmp:
        asyncio.run(run(args.messages, args.rounds, versions, Path(tmp)))


if __name__ == "__main__":
    main()
