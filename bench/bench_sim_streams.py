"""The runtime's CPU per stream at many streams, in the simulation: the real sidecar runtime
(`rsub_dev.sim.scale`) over the simulated JetStream on virtual time, idle and loaded.

    .venv/bin/python bench/bench_sim_streams.py --streams 1000,3000,10000 --seconds 10

Per stream count, one world: two regions, one sidecar each, `--streams` virtual streams with
10 replicated durables each in the first region (never consumed), the sidecar's default
settings (1 s interval) and `rsub run`'s GC settings (`--gc`: other thresholds, or `off`: the
collector disabled in the measured windows, to compare side by side what it costs). After the bring-up, before each mode,
a warm-up of `--warmup` simulated seconds and then until no positions read has waited in
either sidecar's queue for a whole interval (at most `--drain-limit` more; the loaded
mode's first data makes every stream read its positions once, which takes 16 readers
seconds at thousands of streams), then two windows of `--seconds` simulated seconds each,
idle (no data) then loaded (one message per stream per simulated second in the first
region, spread over the second):

- CPU: the process's CPU seconds per stream per simulated second (both sidecars and the
  simulator, no profiler);
- split: the same schedule again under cProfile, its time attributed to the product
  (`sidecar.*`), the simulator (`rsub_dev.*`: simjs, the port), the event loop (asyncio's
  scheduling, looptime) or the bench; a library function's time (json, structlog, asyncio's
  queues, ...) goes to the package of its callers, in the shares of their calls. The product's
  figure is its share of the first window's CPU.

`--profile-top N` prints the product's N costliest functions (own time) of each window, per
stream count, and the N product functions whose calls per stream per simulated second grow
the most from the fewest streams to the most (counted, not timed: what grows with the
streams there is work that does, whatever the noise of a shared machine; cProfile counts
each resumption of a coroutine as a call, so for `async` functions these are wake-ups).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import resource
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rsub_dev.sim.scale import ScaleParams, ScaleWorld
from sidecar.cli.run import _GC_THRESHOLDS
from sidecar.config.schema import SnapshotConfig
from sidecar.logs import configure_logging

_PARTS = ("product", "simulator", "event loop", "bench")
_LOOP_FILES = ("asyncio/base_events.py", "asyncio/events.py", "selectors.py", "/looptime/")

Func = tuple[str, int, str]

# The sidecars' interval (the scale world runs the default), and how often the warm-up looks
# at their reads.
_INTERVAL_S = SnapshotConfig().interval_ms / 1000
_POLL_S = 0.1


def _part(func: Func) -> str | None:
    """The part a function is of, None for a library's (attributed to its callers)."""
    path = func[0]
    if "/rsub_dev/" in path:
        return "simulator"
    if "/sidecar/" in path:
        return "product"
    if path.endswith("bench_sim_streams.py"):
        return "bench"
    if any(part in path for part in _LOOP_FILES):
        return "event loop"
    return None


def attribute(
    stats: pstats.Stats,
) -> tuple[dict[str, float], dict[Func, float], dict[Func, int]]:
    """Own time per part (`_part`), a library function's shared out over its callers in the
    shares of their calls' cumulative time; each product function's own time with the
    library time attributed to it; and each product function's calls."""
    table = stats.stats  # type: ignore[attr-defined]
    shares: dict[Func, dict[Func | str, float]] = {}

    def share(func: Func, visiting: frozenset[Func]) -> dict[Func | str, float]:
        """Where `func`'s time goes: a part's function (1.0), or its callers'."""
        if func in shares:
            return shares[func]
        part = _part(func)
        out: dict[Func | str, float] = defaultdict(float)
        callers = table[func][4] if func in table else {}
        total = sum(edge[3] for edge in callers.values())
        if part == "product" and func not in visiting and total > 0:
            # The product's helpers the simulator calls too (subject matching): the
            # simulator's when it calls them.
            for caller, edge in callers.items():
                simulator = share(caller, visiting | {func}).get("simulator", 0.0)
                out["simulator"] += simulator * edge[3] / total
                out[func] += (1.0 - simulator) * edge[3] / total
        elif part is not None:
            out[func if part == "product" else part] = 1.0
        elif func in visiting or not callers or total <= 0:
            out["event loop"] = 1.0
        else:
            for caller, edge in callers.items():
                for owner, fraction in share(caller, visiting | {func}).items():
                    out[owner] += fraction * edge[3] / total
        shares[func] = out
        return out

    parts: dict[str, float] = defaultdict(float)
    product: dict[Func, float] = defaultdict(float)
    sys.setrecursionlimit(100_000)
    for func, (_, _, own, _, _) in table.items():
        for owner, fraction in share(func, frozenset()).items():
            if isinstance(owner, str):
                parts[owner] += own * fraction
            else:
                parts["product"] += own * fraction
                product[owner] += own * fraction
    calls = {func: row[1] for func, row in table.items() if _part(func) == "product"}
    return parts, product, calls


@dataclass
class Window:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    snapshots: int = 0
    parts: dict[str, float] = field(default_factory=dict)
    product: dict[Func, float] = field(default_factory=dict)
    calls: dict[Func, int] = field(default_factory=dict)


async def _window(world: ScaleWorld, seconds: float, profiled: bool) -> Window:
    window = Window()
    profile = cProfile.Profile() if profiled else None
    completed = world.snapshots_completed()
    wall, cpu = time.perf_counter(), time.process_time()
    if profile is not None:
        profile.enable()
    await asyncio.sleep(seconds)
    if profile is not None:
        profile.disable()
    window.cpu_s = time.process_time() - cpu
    window.wall_s = time.perf_counter() - wall
    window.snapshots = world.snapshots_completed() - completed
    if profile is not None:
        window.parts, window.product, window.calls = attribute(pstats.Stats(profile))
    return window


async def _warm_up(world: ScaleWorld, warmup: float, limit: float, mode: str) -> None:
    """`warmup` simulated seconds, then until no sidecar has had a positions read waiting
    (`IntervalLoop.reads_waiting`) for one whole interval, the time it took printed (at most
    `limit` simulated seconds more: then it says so)."""
    await asyncio.sleep(warmup)
    loop = asyncio.get_running_loop()
    started = loop.time()
    quiet_since = started
    while loop.time() - quiet_since < _INTERVAL_S:
        if loop.time() - started >= limit:
            print(f"  {mode}: reads still waiting after {limit:g} s more", file=sys.stderr)
            return
        await asyncio.sleep(_POLL_S)
        if any(s.intervals is not None and s.intervals.reads_waiting for s in world.sidecars):
            quiet_since = loop.time()
    waited = quiet_since - started
    print(f"  {mode}: reads drained {waited:.1f} s after the warm-up", file=sys.stderr)


async def _producer(world: ScaleWorld) -> None:
    """One message per stream per simulated second in the first region, a tenth of the
    streams every 100 ms."""
    region = world.streams[0].regions[0]
    for step in range(sys.maxsize):
        world.publish(region, world.streams[step % 10 :: 10])
        await asyncio.sleep(0.1)


def measure(
    streams: int, seconds: float, warmup: float, drain_limit: float, *, collect: bool = True
) -> dict[str, tuple[Window, Window]]:
    """Per mode (idle, loaded): its unprofiled and its profiled window (`collect=False`: the
    collector disabled in the windows, enabled again between them)."""
    windows: dict[str, tuple[Window, Window]] = {}

    async def window(world: ScaleWorld, profiled: bool) -> Window:
        if not collect:
            gc.disable()
        try:
            return await _window(world, seconds, profiled)
        finally:
            gc.enable()

    async def phases(world: ScaleWorld) -> None:
        gc.freeze()  # what the bring-up built, as `rsub run` does once ready
        print(
            f"  {streams} streams brought up in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
        await _warm_up(world, warmup, drain_limit, "idle")
        windows["idle"] = (await window(world, False), await window(world, True))
        producer = asyncio.create_task(_producer(world))
        await _warm_up(world, warmup, drain_limit, "loaded")
        windows["loaded"] = (await window(world, False), await window(world, True))
        producer.cancel()

    started = time.perf_counter()
    ScaleWorld(1, ScaleParams(streams), phases).run_quiet()
    return windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="1000,3000,10000")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated, per window")
    parser.add_argument("--warmup", type=float, default=5.0, help="simulated, before each mode")
    parser.add_argument(
        "--drain-limit", type=float, default=60.0, help="simulated, the most waited for reads"
    )
    parser.add_argument("--profile-top", type=int, default=0)
    parser.add_argument(
        "--gc",
        default=",".join(map(str, _GC_THRESHOLDS)),
        help="the collector's thresholds (default: rsub run's), or 'off' in the windows",
    )
    args = parser.parse_args()
    collect = args.gc != "off"
    thresholds = _GC_THRESHOLDS if not collect else tuple(int(t) for t in args.gc.split(","))
    if len(thresholds) != 3:
        parser.error(f"--gc takes three thresholds or 'off', got {args.gc!r}")
    # The product logs as `rsub run` does (JSON, info), to nowhere, with its GC settings.
    gc.set_threshold(*thresholds)
    print(f"collector: {'off in the windows' if not collect else thresholds}", file=sys.stderr)
    configure_logging("json", "info", stream=open(os.devnull, "w"))  # noqa: SIM115
    counts = [int(n) for n in args.streams.split(",")]
    results = {
        n: measure(n, args.seconds, args.warmup, args.drain_limit, collect=collect) for n in counts
    }
    us = 1e6 / args.seconds
    print(
        f"CPU per stream per simulated second (us), {args.seconds:g} simulated s per window; "
        "split from the same schedule under cProfile"
    )
    print(
        f"{'streams':>8} {'mode':>7} {'CPU':>7} {'product':>8} {'simulator':>10} "
        f"{'loop':>6} {'bench':>6} {'snapshots/s':>12} {'sim s/wall s':>13}"
    )
    for n, modes in results.items():
        for mode, (plain, profiled) in modes.items():
            total = sum(profiled.parts.values()) or 1.0
            shares = {p: profiled.parts.get(p, 0.0) / total for p in _PARTS}
            per = plain.cpu_s * us / n
            print(
                f"{n:>8} {mode:>7} {per:>7.1f} {per * shares['product']:>8.1f} "
                f"{per * shares['simulator']:>10.1f} {per * shares['event loop']:>6.1f} "
                f"{per * shares['bench']:>6.1f} {plain.snapshots / args.seconds:>12.1f} "
                f"{args.seconds / plain.wall_s:>13.2f}"
            )
    # The process's peak resident size: the largest world's, with whatever the collector
    # left uncollected (`--gc`).
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident size {peak_mib:.0f} MiB")
    if args.profile_top:
        for n, modes in results.items():
            for mode, (plain, profiled) in modes.items():
                # Scaled to the unprofiled window's CPU (cProfile slows everything down).
                scale = plain.cpu_s / (sum(profiled.parts.values()) or 1.0)
                print(f"\nproduct, {n} streams, {mode}: own time per stream per simulated s (us)")
                top = sorted(profiled.product.items(), key=lambda kv: -kv[1])[: args.profile_top]
                for (path, line, name), own in top:
                    where = path.split("/sidecar/", 1)[-1]
                    print(f"  {own * scale * us / n:>8.2f}  {where}:{line} {name}")
        if len(results) > 1:
            for mode in ("idle", "loaded"):
                _growth(mode, results, args.seconds, args.profile_top)


def _growth(
    mode: str, results: dict[int, dict[str, tuple[Window, Window]]], seconds: float, top: int
) -> None:
    """The product functions whose calls per stream per simulated second grow the most
    between the fewest streams and the most (called at least once per 100 streams a second)."""
    low, high = min(results), max(results)
    counts = {n: results[n][mode][1].calls for n in results}

    def per(n: int, func: Func) -> float:
        return counts[n].get(func, 0) / n / seconds

    rows = [
        (per(high, f) / per(low, f) if per(low, f) else float("inf"), f)
        for f in set(counts[low]) | set(counts[high])
        if max(per(low, f), per(high, f)) >= 0.01
    ]
    print(f"\nproduct, {mode}: calls per stream per simulated s, by growth ({low} to {high})")
    print("  " + " ".join(f"{n:>9}" for n in sorted(results)) + "   growth  function")
    for growth, (path, line, name) in sorted(rows, key=lambda r: -r[0])[:top]:
        figures = " ".join(f"{per(n, (path, line, name)):>9.3f}" for n in sorted(results))
        where = path.split("/sidecar/", 1)[-1]
        print(f"  {figures}   {growth:>6.2f}  {where}:{line} {name}")


if __name__ == "__main__":
    main()
