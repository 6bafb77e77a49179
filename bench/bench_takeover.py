"""Time for the other replicas to take over a replica's streams, after SIGKILL or SIGTERM.

Usage: .venv/bin/python bench/bench_takeover.py [--streams 30] [--ttl-s 3,10] [--runs 3]

On a local super-cluster (west, east), west runs three sidecar replicas sharing the streams
(32 shards): two in-process runtimes that stay, and one `rsub run` child that is started,
waited on until the three share the streams (each leads some), then SIGKILLed (a crash: its
leases expire) or SIGTERMed (a clean stop: it releases them), run after run. The figure is
the time from the signal until the two survivors lead every stream the child led, polled
every 20 ms from the survivors' own view (what their machines act on). The lease rules give
the expectation: after a kill, one TTL after the child's last renewal plus up to one round
(TTL/3); after a stop, up to one round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, SidecarProcess, sidecar_settings, wait_until
from sidecar.logs import configure_logging
from sidecar.runtime import Runtime

REGIONS = ("west", "east")
_POLL_S = 0.02
_DEADLINE_S = 120.0


def led(runtime: Runtime, streams: tuple[str, ...]) -> set[str]:
    return {s for s in streams if runtime.leadership(s).leader}


async def one_run(
    cluster: LocalSuperCluster,
    survivors: tuple[Runtime, Runtime],
    streams: tuple[str, ...],
    ttl_s: float,
    kill: bool,
    workdir: Path,
) -> tuple[int, float]:
    """(streams the child led, seconds from the signal until the survivors led them all)."""
    settings = sidecar_settings(cluster, "west", streams=streams, lease_ttl_s=ttl_s)
    child = SidecarProcess(settings, workdir)
    a, b = survivors
    try:
        await child.start()
        await child.wait_ready()

        async def shared() -> bool:
            mine = led(a, streams) | led(b, streams)
            theirs = {s for s in streams if a.leadership(s).holder not in (a.holder, b.holder)}
            return bool(theirs) and mine | theirs == set(streams) and not mine & theirs

        await wait_until(shared, "the child to take its share", _DEADLINE_S)
        # Settled: the child's share no longer changes for a round.
        await asyncio.sleep(ttl_s / 3)
        await wait_until(shared, "the child to keep its share", _DEADLINE_S)
        childs = {s for s in streams if not a.leadership(s).leader and not b.leadership(s).leader}
        signalled = time.monotonic()
        if kill:
            await child.kill()
        else:
            await child.stop()
        while not childs <= led(a, streams) | led(b, streams):
            if time.monotonic() - signalled > _DEADLINE_S:
                raise TimeoutError("the survivors never took the child's streams over")
            await asyncio.sleep(_POLL_S)
        return len(childs), time.monotonic() - signalled
    finally:
        await child.kill()


async def run(streams: int, ttls: list[float], runs: int, directory: Path) -> None:
    names = tuple(f"tenant-{i:03d}" for i in range(streams))
    print(f"west: 3 replicas, {streams} streams, 32 shards; takeover of the third replica's")
    print(f"{'ttl':>6} {'signal':>7} {'streams':>8} {'takeover s':>11}")
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        for ttl_s in ttls:
            async with contextlib.AsyncExitStack() as stack:
                sidecars = RegionSidecars(
                    cluster, streams=names, regions=["west"], lease_ttl_s=ttl_s, serve=False
                )
                a = await stack.enter_async_context(sidecars.replica("west"))
                b = await stack.enter_async_context(sidecars.replica("west"))
                for n in range(runs):
                    for kill in (True, False):
                        moved, seconds = await one_run(
                            cluster, (a, b), names, ttl_s, kill, directory / f"run-{ttl_s}-{n}"
                        )
                        signal = "KILL" if kill else "TERM"
                        print(f"{ttl_s:>5.0f}s {signal:>7} {moved:>8} {seconds:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--ttl-s", default="3,10")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    ttls = [float(t) for t in args.ttl_s.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-takeover-") as tmp:
        asyncio.run(run(args.streams, ttls, args.runs, Path(tmp)))


if __name__ == "__main__":
    main()
