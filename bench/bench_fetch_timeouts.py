"""How nats-py's `PullSubscription.fetch` times out, on an idle and on a busy event loop.

Usage: .venv/bin/python bench/bench_fetch_timeouts.py [--fetches 200] [--timeout 0.02]

On a local two-region super-cluster, an empty read stream in west and a durable on it: `--fetches` fetches of
a batch of 1 and of 2, each with `--timeout`, first with the event loop idle, then with a
task holding it for up to 2 ms at a time (`rsub_dev.workload.busy_event_loop`). Prints per
case how many fetches raised `nats.errors.TimeoutError`, a bare `asyncio.TimeoutError`
(what docs/exact-client.md's loop would not catch), or returned no message without raising;
and the same through `sidecar.exact.ExactConsumer.fetch`, which must raise only the first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
import nats.errors
from nats.aio.msg import Msg

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import durable_config
from rsub_dev.workload import busy_event_loop
from sidecar.exact import ExactConsumer
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology

VS = VirtualStream("bench", ("west", "east"))
READ = VS.read_stream("west")
BUSY_S = 0.002


async def outcomes(fetch: Callable[[], Awaitable[list[Msg]]], fetches: int) -> Counter[str]:
    counts: Counter[str] = Counter()
    for _ in range(fetches):
        try:
            counts["returned nothing" if not await fetch() else "returned messages"] += 1
        except nats.errors.TimeoutError:
            counts["nats.errors.TimeoutError"] += 1
        except TimeoutError:
            counts["bare asyncio.TimeoutError"] += 1
    return counts


async def run(fetches: int, timeout: float, directory: Path) -> None:  # noqa: ASYNC109
    async with LocalSuperCluster(VS.regions, directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            js = nc.jetstream()
            await apply_topology(nc, VS)
            await js.add_consumer(READ, durable_config(VS, "bench"))
            sub = await js.pull_subscribe_bind("bench", READ)
            exact = ExactConsumer(sub, {}, VS)
            for loop in ("idle", "busy"):
                busy = busy_event_loop(1, BUSY_S) if loop == "busy" else contextlib.nullcontext()
                async with busy:
                    for batch in (1, 2):
                        for who, fetch in (
                            ("nats-py fetch", lambda b=batch: sub.fetch(b, timeout)),
                            ("ExactConsumer.fetch", lambda b=batch: exact.fetch(b, timeout)),
                        ):
                            counts = await outcomes(fetch, fetches)
                            print(
                                f"{loop} loop, {who}({batch}, timeout={timeout}): "
                                + ", ".join(f"{n} {what}" for what, n in sorted(counts.items())),
                                flush=True,
                            )
        finally:
            await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetches", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=0.02)
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="rsub-bench-fetch-") as directory:
        asyncio.run(run(args.fetches, args.timeout, Path(directory)))


if __name__ == "__main__":
    main()
