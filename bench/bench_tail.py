"""CPU per message of a stream tail (`sidecar.nats.stream_reader.tail`), this checkout's and
optionally another's, side by side, and of the same tail through the port the runtime reads
it by (`NatsPort.read(..., live=True)`); then of every reader of a stored range there is.

Usage: .venv/bin/python bench/bench_tail.py [--messages 20000] [--rounds 3] [--baseline DIR]

On a local two-region super-cluster, `--messages` messages of 64 bytes are stored in one
stream; then, in turn for each version and `--rounds` times, a tail from the first message
takes them all: this process's CPU time per message and the messages per second. A tail is
what a sidecar runs per stream for its markers and for its data's origins, so this is the
per-message cost of both; the `port` row adds what the port costs on top (a `StoredMessage`
per message, one more generator).

The same messages, sourced into a stream `R` as a read stream's are (each then carries a
`Nats-Stream-Source` header), are then read as a stored range, first to last, by each reader
in turn: `tail` (as above), `replay` (the sidecar's rebuild: `tail`'s consumer, ended
after what was stored), and the Spark source's reads through the one range reader
(`stream_reader.read_range`): `direct` (batched direct gets) and `consumer` (`replay`'s
consumer, over a mirror of `R` that does not allow direct gets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from types import ModuleType

import nats
from nats.aio.client import Client
from nats.js.api import StreamSource

from rsub_dev.cluster import LocalSuperCluster
from sidecar.logs import configure_logging
from sidecar.nats import stream_reader
from sidecar.nats.nats_port import NatsPort
from spark_jobs.rsub_spark.nats_read import read_chunks
from spark_jobs.rsub_spark.options import parse_options

_THIS = Path(__file__).resolve().parent.parent
_READER = Path("sidecar/nats/stream_reader.py")


def reader_of(checkout: Path, label: str) -> ModuleType:
    """`stream_reader` as `checkout` has it (what it imports of rsub comes from this one)."""
    spec = importlib.util.spec_from_file_location(f"stream_reader_{label}", checkout / _READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Tail = Callable[[Client], AsyncIterator[object]]
"""A read of stream `T` from its first message, over a client: messages, or lists of them."""


def reader_tail(reader: ModuleType) -> Tail:
    return lambda nc: reader.tail(nc.jetstream(), "T", "t.>", 1)


def port_tail(nc: Client) -> AsyncGenerator[object, None]:
    return NatsPort(nc).read("T", "t.>", 1, live=True)


def replay(nc: Client) -> AsyncGenerator[object, None]:
    return stream_reader.replay(nc.jetstream(), "R", "t.>")


def spark_range(stream: str, count: int) -> Tail:
    """The Spark source's read of sequences 1..count of `stream` (virtual stream `t`)."""
    opts = parse_options({"servers": "nats://unused", "stream": "t", "readStream": stream})

    async def chunks(nc: Client) -> AsyncGenerator[object, None]:
        async with contextlib.aclosing(read_chunks(nc, opts, 0, count)) as read:
            async for chunk, _ in read:
                yield chunk

    return chunks


async def take_all(tail: AsyncIterator[object], count: int) -> None:
    async with contextlib.aclosing(tail):  # type: ignore[type-var]
        taken = 0
        async for item in tail:
            taken += len(item) if isinstance(item, list) else 1
            if taken == count:
                return
        raise AssertionError(f"read {taken} of {count} messages")


async def timed(versions: dict[str, Tail], nc: Client, count: int) -> None:
    for label, tail in versions.items():
        cpu, wall = time.process_time(), time.monotonic()
        await take_all(tail(nc), count)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        print(
            f"{label:>8}: {1e6 * cpu / count:5.1f} us of CPU per message, "
            f"{count / wall:8,.0f} messages/s",
            flush=True,
        )


async def run(count: int, rounds: int, versions: dict[str, Tail], directory: Path) -> None:
    async with LocalSuperCluster(("west", "east"), directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t.>"], allow_direct=True)
            for first in range(0, count, 500):
                n = min(500, count - first)
                await asyncio.gather(*(js.publish("t.a", b"x" * 64) for _ in range(n)))
            # A read stream's data messages are sourced: each carries `Nats-Stream-Source`.
            await js.add_stream(name="R", sources=[StreamSource(name="T")], allow_direct=True)
            await js.add_stream(name="U", mirror=StreamSource(name="R"), allow_direct=False)
            # The streams catching up: a server's state, no event to wait on.
            while (await js.stream_info("U")).state.last_seq < count:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            for _ in range(rounds):
                await timed(versions, nc, count)
            print("a stored range of a stream sourcing T, each reader:", flush=True)
            readers: dict[str, Tail] = {
                "tail": lambda nc: stream_reader.tail(nc.jetstream(), "R", "t.>", 1),
                "replay": replay,
                "direct": spark_range("R", count),
                "consumer": spark_range("U", count),
            }
            for _ in range(rounds):
                await timed(readers, nc, count)
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
