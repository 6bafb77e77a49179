"""Time to ready of one sidecar at many streams: from its process start to `/readyz` 200, and
from its `runtime_started` to its `runtime_ready` log, with figures per stage of the rebuild.

Usage: .venv/bin/python bench/bench_startup.py [--streams 1000,3000] [--durables 10]
       [--markers 0,100] [--baseline /tmp/startup-base] [--in-flight 8,16,64]

For each `--streams` count in turn, a fresh local two-region super-cluster gets that many
virtual streams, each with `--durables` replicated durables in west (never consumed). For
each `--markers` count in turn (ascending: markers only accumulate), both regions' sidecars
(this checkout's) first run with one message published per stream per second until every
west read stream holds at least that many markers (snapshots completed, requested and
answered by both regions), and are stopped; then one replica of west's sidecar is started
alone and timed until ready, and stopped. With `--baseline DIR` (a checkout of another
version, e.g. `git worktree add /tmp/startup-base main`), DIR's sidecar is timed first, then
this checkout's, on the same cluster and streams: before and after side by side. With
`--in-flight`, this checkout's sidecar is timed again with each of those numbers of streams
rebuilding at once (`REBUILDS_IN_FLIGHT`, set in the sidecar's process by a `sitecustomize`
module put first on its path).

Before each timed start the bench waits until the account holds only the streams' durables
(the tails and replays a sidecar stopped before left ephemeral consumers that the servers
drop after their inactivity threshold), so every start finds the servers in the same state.

Printed per start: process start -> /readyz 200; runtime_started -> runtime_ready; when the
topology of every stream was checked (`topology_applied`), and when a quarter, half, three
quarters and all of the streams were rebuilt (from `stream_rebuilt` log stamps); the rebuild time per stream of the first and the last tenth of the streams to
be rebuilt (a sequential rebuild whose cost grows with the streams already running shows it
here); the CPU seconds the sidecar and the nats-servers used until ready (and the servers' CPU per
second over `_IDLE_S` with no sidecar just before, their own upkeep); and, from the
sidecar's logs where it writes them (`stream_rebuilt` `replay_ms`/`positions_ms`/
`restore_ms`, `stream_running` `signals_ms`/`tails_ms`), the total and the p99 per stream of each
stage: the replay of the markers (and origins), the positions read (stream info and consumer
listing), the consumer signals subscribed, and the wait after that until both live tails
are open (they are opened by tasks of their own, started with the signals; a stream counts
as rebuilt once they are).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import bench_sidecar_footprint as footprint
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from rsub_dev.cluster import ClusterError, LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, wait_until
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream

_STAGES = (
    ("replay", "stream_rebuilt", "replay_ms"),
    ("positions read", "stream_rebuilt", "positions_ms"),
    ("restore", "stream_rebuilt", "restore_ms"),
    ("signals subscribed", "stream_running", "signals_ms"),
    ("tails opened", "stream_running", "tails_ms"),
)
_EPHEMERAL_GONE_S = 180.0
_IDLE_S = 10.0
_THIS = Path(__file__).resolve().parent.parent
T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    streams: list[int]
    durables: int
    markers: list[int]
    baseline: Path | None
    in_flight: list[int]


async def fewest_markers(js: JetStreamContext, streams: Sequence[VirtualStream]) -> int:
    """The fewest markers any of west's read streams holds."""

    async def one(vs: VirtualStream) -> int:
        info = await js.stream_info(vs.read_stream("west"), subjects_filter=vs.marker_filter())
        return sum((info.state.subjects or {}).values())

    return min(await footprint.bounded(one(vs) for vs in streams))


async def store_markers(
    cluster: LocalSuperCluster,
    nc: Client,
    streams: Sequence[VirtualStream],
    wanted: int,
    workdir: Path,
) -> None:
    """Run both regions' sidecars with data in every stream until each west read stream
    holds `wanted` markers."""
    js = nc.jetstream()
    if wanted == 0 or await footprint.patiently(partial(fewest_markers, js, streams)) >= wanted:
        return
    started = time.monotonic()
    names = [vs.name for vs in streams]
    with footprint.code_of(None):
        async with footprint.sidecars(cluster, names, True, workdir):
            load = asyncio.ensure_future(footprint.publish_each_stream(nc, streams))
            try:

                async def enough() -> bool:
                    return await footprint.patiently(partial(fewest_markers, js, streams)) >= wanted

                await wait_until(enough, f"{wanted} markers per stream", 1800.0, poll_s=5)
            finally:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
    print(
        f"  at least {wanted} markers in every west read stream after "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )


async def only_durables(js: JetStreamContext, durables: int) -> None:
    """Wait until the account's consumers are the durables alone (stopped sidecars' ephemeral
    consumers gone)."""

    async def settled() -> bool:
        return (await js.account_info()).consumers <= durables

    await wait_until(settled, "stopped sidecars' consumers gone", _EPHEMERAL_GONE_S, poll_s=2)


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"]).timestamp()


def stage_figures(events: Sequence[dict[str, Any]]) -> str:
    figures = []
    for name, event_name, field in _STAGES:
        values = sorted(
            int(e[field]) for e in events if e.get("event") == event_name and field in e
        )
        if values:
            p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
            figures.append(f"{name} {sum(values) / 1000:.1f} s in all (p99 {p99} ms)")
    return "; ".join(figures) if figures else "no stage figures in this version's logs"


def progress_figures(events: Sequence[dict[str, Any]], count: int) -> str:
    """When a quarter, half, ... of the streams were rebuilt, and the time per stream of the
    first and last tenth."""
    begun = next(stamp(e) for e in events if e.get("event") == "runtime_started")
    rebuilt = sorted(stamp(e) - begun for e in events if e.get("event") == "stream_rebuilt")
    checked = [stamp(e) - begun for e in events if e.get("event") == "topology_applied"]
    topology = f"topology checked at {max(checked):.1f} s; " if checked else ""
    if len(rebuilt) < count:
        return f"only {len(rebuilt)} of {count} streams rebuilt"
    quarters = " / ".join(f"{rebuilt[max(0, q * count // 4 - 1)]:.1f}" for q in (1, 2, 3, 4))
    tenth = max(1, count // 10)
    first = (rebuilt[tenth - 1] - rebuilt[0]) / max(1, tenth - 1)
    last = (rebuilt[-1] - rebuilt[-tenth]) / max(1, tenth - 1)
    return (
        f"{topology}rebuilt 1/4, 1/2, 3/4, all at {quarters} s; "
        f"{1000 * first:.1f} ms per stream in the first tenth, {1000 * last:.1f} ms in the last"
    )


async def timed_start(
    cluster: LocalSuperCluster,
    names: Sequence[str],
    workdir: Path,
    label: str,
    servers: Sequence[int],
) -> None:
    settings = footprint.bench_settings(cluster, "west", names)
    proc = SidecarProcess(settings, workdir)
    # What the servers burn with no sidecar (their streams' and durables' own upkeep): the
    # share of their CPU until ready that the start does not cause.
    idle_from = sum(footprint.cpu_seconds(p) for p in servers)
    await asyncio.sleep(_IDLE_S)
    servers_cpu = sum(footprint.cpu_seconds(p) for p in servers)
    idle = (servers_cpu - idle_from) / _IDLE_S
    started = time.monotonic()
    try:
        await proc.start(footprint.READY_TIMEOUT_S)
        try:
            await proc.wait_ready(footprint.READY_TIMEOUT_S)
        except ClusterError:  # not ready in time: how far it got, and the next start goes on
            events = footprint.log_events(proc.log_path)
            running = sum(e.get("event") == "stream_running" for e in events)
            failed = sum(str(e.get("event")).endswith("_tail_failed") for e in events)
            print(
                f"  {label:>8}: NOT READY after {footprint.READY_TIMEOUT_S:.0f} s: {running} of "
                f"{len(names)} streams running, {failed} tail failures logged",
                flush=True,
            )
            return
        ready = time.monotonic() - started
        sidecar_cpu = footprint.cpu_seconds(proc.pid)
        servers_cpu = sum(footprint.cpu_seconds(p) for p in servers) - servers_cpu
        bring_up = await footprint.brought_up(proc)
        events = footprint.log_events(proc.log_path)
    finally:
        await proc.stop()
    print(
        f"  {label:>8}: /readyz 200 {ready:.1f} s after the process started, runtime_ready "
        f"{bring_up.rebuilt_s:.1f} s after runtime_started; CPU until ready: sidecar "
        f"{sidecar_cpu:.1f} s, servers {servers_cpu:.1f} s (idle before the start: "
        f"{idle:.2f} CPU s per s, {idle * ready:.1f} s over that time)\n"
        f"            {progress_figures(events, len(names))}\n"
        f"            {stage_figures(events)}",
        flush=True,
    )


@contextlib.contextmanager
def rebuilds_in_flight(count: int | None, directory: Path) -> Iterator[str]:
    """Sidecars spawned inside (after `footprint.code_of`) rebuild `count` streams at once
    (None: as many as their code says); the label's suffix."""
    if count is None:
        yield ""
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        f"import sidecar.runtime.root\nsidecar.runtime.root.REBUILDS_IN_FLIGHT = {count}\n"
    )
    saved = os.environ["PYTHONPATH"]
    os.environ["PYTHONPATH"] = f"{directory}:{saved}"
    try:
        yield f"/{count}"
    finally:
        os.environ["PYTHONPATH"] = saved


async def one_count(args: Options, count: int, directory: Path) -> None:
    names = [f"s{i:04d}" for i in range(count)]
    streams = [VirtualStream(n, footprint.REGIONS) for n in names]
    async with LocalSuperCluster(footprint.REGIONS, directory / "cluster") as cluster:
        nc = await nats.connect(cluster.servers("west"))
        try:
            js = nc.jetstream()
            started = time.monotonic()
            await footprint.lay_out(nc, streams, args.durables)
            print(
                f"{count} streams x {args.durables} replicated durables in west set up in "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
            servers = footprint.server_pids(directory / "cluster")
            checkouts: list[tuple[Path | None, int | None]] = [(None, None)]
            checkouts += [(None, n) for n in args.in_flight]
            if args.baseline is not None:
                checkouts.insert(0, (args.baseline, None))
            for markers in args.markers:
                await store_markers(cluster, nc, streams, markers, directory / f"markers-{markers}")
                print(f"{count} streams, {markers} stored markers per stream:", flush=True)
                for checkout, in_flight in checkouts:
                    await only_durables(js, count * args.durables)
                    # `python -m` puts its working directory first on the path: the checkout's.
                    with (
                        footprint.code_of(checkout) as code,
                        rebuilds_in_flight(in_flight, directory / f"in-flight-{in_flight}") as n,
                        contextlib.chdir(checkout or _THIS),
                    ):
                        workdir = directory / f"{markers}-{code}{n}"
                        await timed_start(cluster, names, workdir, f"{code}{n}", servers)
        finally:
            await nc.close()


async def run(args: Options, directory: Path) -> None:
    for count in args.streams:
        await one_count(args, count, directory / f"streams-{count}")


def counts(text: str) -> list[int]:
    try:
        chosen = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts such as 1000 or 1000,3000")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=counts, default=[1000, 3000])
    parser.add_argument("--durables", type=int, default=10)
    parser.add_argument("--markers", type=counts, default=[0, 100], help="ascending, e.g. 0,100")
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a checkout to time first, side by side"
    )
    parser.add_argument(
        "--in-flight",
        type=counts,
        default=[],
        help="also time this checkout with these numbers of rebuilds at once, e.g. 8,16,64",
    )
    args = Options(**vars(parser.parse_args()))
    args.markers.sort()
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
