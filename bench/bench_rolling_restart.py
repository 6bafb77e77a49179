"""Three replicas of a region's sidecar: started in parallel, then restarted one after the
other as a Deployment's rolling update does; how long each stream went without a leader.

Usage: .venv/bin/python bench/bench_rolling_restart.py [--streams 1000,3000] [--durables 10]
       [--baseline /tmp/rolling-base]

On a local two-region super-cluster (the topology in place, `--durables` replicated
durables per stream in west, never consumed, no traffic), for each `--streams` count in
turn (the first N of the streams: one cluster, set up once for the largest count):

1. **Parallel start.** Three `rsub run` processes of west's sidecar (lease TTL 10 s, the
   sidecar's default; 32 shards) are spawned at once; the time until each, and all three,
   answer `/readyz` 200 (which needs every stream rebuilt).
2. **Rolling restart.** Once every stream has a valid leader, three times: start a new
   replica, wait for its `/readyz` 200, stop the oldest one with SIGTERM (what a
   Deployment does with `maxSurge: 1`, `maxUnavailable: 0`). Then until every stream has a
   valid leader again (or 3 TTLs).

All along a watcher follows the shard leases in west's lease bucket (a subscription to the
KV subjects `$KV.<bucket>.shards.>`: every acquisition, renewal and release). A stream has
a **valid leader** at a time when its shard's key names a running replica, that replica
wrote the key less than `0.8 x TTL` before (a holder's own validity), and that replica had
rebuilt the stream by then (its `stream_rebuilt` log line for that stream: a replica leading
a stream it has not rebuilt runs no snapshot for it). For the rolling restart's window, the
bench prints per stream count the longest time any stream had no valid leader (and which),
how many streams went without one for longer than the TTL, against the TTL, and how many
shard leases their holders lost meanwhile (`lease_lost` in their logs: a renewal later than
the lease's validity, on an overloaded machine; such a shard is taken over a TTL later, so
its streams go leaderless for longer than the TTL whatever the join and stop rules).

With `--baseline DIR` (a checkout of another version, e.g. `git archive main | tar -x -C
DIR`), each stream count runs first with the sidecars of DIR (`PYTHONPATH`), then with this
checkout's, on the same cluster and streams: before and after side by side. Passes take
turns, never at once (the cores are shared). East's sidecar is not run: nothing is
published, so no snapshot starts, and leadership is west's own.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nats
from bench_sidecar_footprint import (
    LEASE_TTL_S,
    REGIONS,
    bench_settings,
    code_of,
    lay_out,
    log_events,
)
from nats.aio.client import Client
from nats.aio.msg import Msg

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess
from sidecar.config.schema import LeaseConfig
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.protocol.leases import VALID_FRACTION
from sidecar.protocol.shards import shard_of

REPLICAS = 3
READY_TIMEOUT_S = 1800.0
SETTLE_TTLS = 3
_SHARDS = LeaseConfig().shards
_BUCKET = f"{LeaseConfig().bucket}-west"


@dataclass(frozen=True)
class Options:
    streams: list[int]
    durables: int
    baseline: Path | None


@dataclass
class Replica:
    """One `rsub run` of west's sidecar, and when (bench clock, `time.time()`) it was
    spawned, answered `/readyz` 200 and was sent SIGTERM."""

    proc: SidecarProcess
    spawned: float = 0.0
    ready: float = 0.0
    stopped: float = float("inf")
    rebuilt: dict[str, float] = field(default_factory=dict)
    lost: list[float] = field(default_factory=list)

    async def start(self) -> None:
        self.spawned = time.time()
        await self.proc.start(READY_TIMEOUT_S)
        await self.proc.wait_ready(READY_TIMEOUT_S)
        self.ready = time.time()

    async def stop(self) -> None:
        self.stopped = time.time()
        await self.proc.stop()

    def read_log(self) -> None:
        """When each stream was rebuilt (its `stream_rebuilt` line), and when it lost a
        shard's lease (`lease_lost`: a renewal too late, the machine overloaded)."""
        for event in log_events(self.proc.log_path):
            if event.get("event") in ("stream_rebuilt", "lease_lost"):
                stamp = datetime.fromisoformat(event["timestamp"]).timestamp()
                if event["event"] == "lease_lost":
                    self.lost.append(stamp)
                else:
                    self.rebuilt.setdefault(event["stream"], stamp)


@dataclass(frozen=True)
class Write:
    """A write of a shard's key seen by the watcher: at `at`, by `pid` (None: deleted)."""

    at: float
    pid: int | None


class LeaseWatch:
    """Every write of west's shard keys, as it comes (a core subscription to the bucket's
    subjects: the bucket need not exist yet)."""

    def __init__(self) -> None:
        self.writes: dict[int, list[Write]] = {shard: [] for shard in range(_SHARDS)}

    def seen(self, msg: Msg) -> None:
        shard = int(msg.subject.rsplit(".", 1)[1])
        deleted = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
        self.writes[shard].append(Write(time.time(), None if deleted else _pid_of(msg.data)))

    def holder(self, shard: int, at: float) -> int | None:
        """The pid whose write of `shard` is still valid at `at` (None: none)."""
        writes = self.writes[shard]
        i = bisect.bisect_right(writes, at, key=lambda w: w.at)
        if i == 0:
            return None
        last = writes[i - 1]
        if last.pid is None or at - last.at >= VALID_FRACTION * LEASE_TTL_S:
            return None
        return last.pid


def _pid_of(value: bytes) -> int | None:
    """The process id in a lease's holder name (`host-pid-suffix`)."""
    try:
        return int(json.loads(value)["holder"].rsplit("-", 2)[1])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def longest_gaps(
    watch: LeaseWatch, replicas: Sequence[Replica], names: Sequence[str], start: float, end: float
) -> dict[str, float]:
    """Per stream, the longest stretch within [start, end] without a valid leader."""
    by_pid = {r.proc.pid: r for r in replicas}
    gaps: dict[str, float] = {}
    for name in names:
        shard = shard_of(name, _SHARDS)
        # The stream's leadership can only change at a write of its shard, at a lease's
        # expiry, at a rebuild of the stream or at a stop: those instants bound the pieces.
        edges = {start, end}
        for write in watch.writes[shard]:
            edges |= {write.at, write.at + VALID_FRACTION * LEASE_TTL_S}
        for replica in replicas:
            edges |= {replica.rebuilt.get(name, end), replica.stopped}
        times = sorted(t for t in edges if start <= t <= end)
        longest = unled_since = 0.0
        unled = False
        for at, after in itertools.pairwise(times):
            pid = watch.holder(shard, at)
            leader = by_pid.get(pid) if pid is not None else None
            led = leader is not None and leader.rebuilt.get(name, end) <= at < leader.stopped
            if not led and not unled:
                unled, unled_since = True, at
            elif led and unled:
                unled = False
                longest = max(longest, at - unled_since)
            if after == end and unled:
                longest = max(longest, end - unled_since)
        gaps[name] = longest
    return gaps


def all_led(watch: LeaseWatch, replicas: Sequence[Replica], at: float) -> bool:
    """Every shard's key valid and held by a running replica that is ready (a cheap check
    while the bench runs; the per-stream figures come from the logs afterwards)."""
    ready = {r.proc.pid for r in replicas if r.ready and r.stopped > at}
    return all(watch.holder(shard, at) in ready for shard in range(_SHARDS))


async def wait_all_led(watch: LeaseWatch, replicas: Sequence[Replica], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all_led(watch, replicas, time.time()):
            return True
        await asyncio.sleep(0.2)
    return False


@contextlib.asynccontextmanager
async def watching(nc: Client) -> AsyncIterator[LeaseWatch]:
    watch = LeaseWatch()

    async def seen(msg: Msg) -> None:
        watch.seen(msg)

    sub = await nc.subscribe(f"$KV.{_BUCKET}.shards.>", cb=seen)
    try:
        yield watch
    finally:
        await sub.unsubscribe()


async def one_pass(
    cluster: LocalSuperCluster, nc: Client, names: Sequence[str], workdir: Path, label: str
) -> None:
    settings = bench_settings(cluster, "west", names)
    made = itertools.count()

    def replica() -> Replica:
        return Replica(SidecarProcess(settings, workdir / f"west-{next(made)}"))

    running: list[Replica] = []
    everyone: list[Replica] = []
    try:
        async with watching(nc) as watch:
            first = [replica() for _ in range(REPLICAS)]
            running += first
            everyone += first
            await asyncio.gather(*(r.start() for r in first))
            spawned = min(r.spawned for r in first)
            each = " / ".join(f"{r.ready - spawned:.1f}" for r in first)
            print(
                f"{label}: three replicas started in parallel, all ready after "
                f"{max(r.ready for r in first) - spawned:.1f} s (each: {each} s)",
                flush=True,
            )
            if not await wait_all_led(watch, running, READY_TIMEOUT_S):
                print(f"{label}: not every shard led by a ready replica; pass skipped")
                return
            start = time.time()
            for _ in range(REPLICAS):
                new = replica()
                everyone.append(new)
                await new.start()
                running.append(new)
                old = running.pop(0)
                await old.stop()
            rolled = time.time() - start
            settled = await wait_all_led(watch, running, SETTLE_TTLS * LEASE_TTL_S)
            end = time.time()
        for r in everyone:
            r.read_log()
        gaps = longest_gaps(watch, everyone, names, start, end)
        worst = max(gaps, key=lambda n: gaps[n])
        over = sum(1 for g in gaps.values() if g > LEASE_TTL_S)
        lost = sum(1 for r in everyone for at in r.lost if start <= at <= end)
        median = statistics.median(gaps.values())
        readies = " / ".join(f"{r.ready - r.spawned:.1f}" for r in everyone[REPLICAS:])
        print(
            f"{label}: rolling restart of three in {rolled:.1f} s (each new one ready after "
            f"{readies} s){'' if settled else ', NOT every shard led 3 TTLs after it'}; "
            f"longest time a stream had no valid leader **{gaps[worst]:.1f} s** ({worst}, "
            f"shard {shard_of(worst, _SHARDS)}; median over the streams {median:.1f} s) against "
            f"the lease TTL {LEASE_TTL_S:.0f} s; "
            f"{over} of {len(names)} streams leaderless longer than the TTL; {lost} shard "
            "leases lost by their holders meanwhile (renewed too late: each is taken over a "
            "TTL later)",
            flush=True,
        )
    finally:
        await asyncio.gather(*(r.proc.stop() for r in running))


async def run(args: Options, directory: Path) -> None:
    streams = [VirtualStream(f"s{i:04d}", REGIONS) for i in range(max(args.streams))]
    bench_started = time.monotonic()
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            started = time.monotonic()
            await lay_out(nc, streams, args.durables)
            print(
                f"{len(streams)} streams x {args.durables} replicated durables in west set up "
                f"in {time.monotonic() - started:.0f} s",
                flush=True,
            )
            checkouts = [args.baseline, None] if args.baseline is not None else [None]
            for count, checkout in itertools.product(args.streams, checkouts):
                names = [vs.name for vs in streams[:count]]
                with code_of(checkout) as code:
                    workdir = directory / f"{count}-{code}"
                    await one_pass(cluster, nc, names, workdir, f"{code}, {count:,} streams")
        finally:
            await nc.close()
    print(f"bench done in {time.monotonic() - bench_started:.0f} s", flush=True)


def stream_counts(text: str) -> list[int]:
    chosen = [int(s) for s in text.split(",") if s.strip().isdigit()]
    if not chosen or len(chosen) != len(text.split(",")) or min(chosen) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected stream counts such as 1000,3000")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streams", type=stream_counts, default=[1000, 3000], help="stream counts, e.g. 1000,3000"
    )
    parser.add_argument("--durables", type=int, default=10)
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a checkout to measure first, side by side"
    )
    args = Options(**vars(parser.parse_args()))
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    with tempfile.TemporaryDirectory(prefix="bench-rolling-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
