"""Startup time of the local super-cluster (3 regions; 1 and 3 servers per region).

Usage: .venv/bin/python bench/bench_dev_cluster.py [--runs N]
Prints, per layout, the seconds from start until `wait_ready` succeeds (every server
JetStream-enabled, meta leader known everywhere, all gateways connected) and the stop time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

import structlog

from rsub_dev.cluster import LocalSuperCluster

REGIONS = ("west", "central", "east")


async def measure(servers_per_region: int, directory: Path) -> tuple[float, float]:
    cluster = LocalSuperCluster(REGIONS, directory, servers_per_region=servers_per_region)
    started = time.monotonic()
    await cluster.start()
    ready_s = time.monotonic() - started
    started = time.monotonic()
    await cluster.stop()
    return ready_s, time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(prefix="bench-dev-cluster-") as tmp:
        for servers in (1, 3):
            ready, stop = [], []
            for run in range(args.runs):
                ready_s, stop_s = await measure(servers, Path(tmp) / f"{servers}-{run}")
                ready.append(ready_s)
                stop.append(stop_s)
            print(
                f"3 regions x {servers} server(s), {args.runs} runs: ready in "
                f"min {min(ready):.2f}s / median {statistics.median(ready):.2f}s / "
                f"max {max(ready):.2f}s; stop median {statistics.median(stop):.2f}s"
            )


if __name__ == "__main__":
    asyncio.run(main())
