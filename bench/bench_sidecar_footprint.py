"""CPU and memory of one sidecar with many streams and replicated subscriptions, with
progress vectors on and off.

Usage: .venv/bin/python bench/bench_sidecar_footprint.py [--streams 100] [--durables 10]
       [--seconds 30] [--progress on,off] [--replicas 1,3] [--backlog 100000]
       [--backlog-seconds 10] [--baseline /tmp/scale-base]

On a local two-region super-cluster, `--streams` virtual streams each get `--durables`
replicated durables in west, never consumed. For each `--progress` setting in turn, west's
and east's sidecars run as `rsub run` processes (1 s snapshot interval, `progress.enabled` as
given) and west's is measured: CPU seconds (user + system, from /proc) over a window, its
resident memory, snapshots completed per second against those wanted (one per stream per
interval while loaded, none idle) and its CPU per completed snapshot, the CPU of the
nats-server processes, of east's sidecar and of this bench (the publisher) in the same
window (where the rest of the machine went: are the servers the limit?), how long the
sidecar was ready to run but waited for a CPU (/proc/<pid>/schedstat: is the machine the
limit?), and its origin index
(`rsub_origin_index_bytes` summed over the streams) against the data messages west's read
streams hold. First idle (no new data: no snapshot starts), then with one message per
stream per second published in west (every stream snapshots every second). The idle window
starts once no snapshot started, completed or timed out for longer than the snapshot
timeout (30 s): a first attempt that started before east's sidecar was up times out and is
retried, which an idle window must not count. Lease TTL: the sidecar's default, 10 s.

With `--replicas 1,3` each setting also runs, in turn, with that many replicas of west's
sidecar sharing its streams (`lease.shards`): the CPU figures are their sum (each
replica's in brackets), the snapshots those all of them completed.

Then `--backlog` messages are published over the streams, half in west and half in east at
the same time (west's read streams interleave them as sourcing delivers them), the durables
still at their start; for each setting in turn both sidecars start again, and west's time to
rebuild every stream (with progress on, that replays the origins of the whole backlog), the
data messages it replayed (both from its `runtime_started`, `runtime_ready` and
`stream_rebuilt` logs), its memory and index, and one idle window are measured.

With `--baseline DIR` (a checkout of another version, e.g. `git worktree add /tmp/scale-base
main`), each setting runs twice in turn, first with the sidecars of DIR (`PYTHONPATH`), then
with this checkout's, on the same cluster and streams: before and after side by side.

The settings take turns on one cluster and one set of streams, never at once: the cores are
shared, so sidecars (or clusters) measured side by side would take CPU from each other, and
a cluster per setting would add its start-up noise. Both regions run the setting (east's
vectors reach west only from a sidecar with progress on). A later setting finds the few
thousand messages and markers the earlier loaded window left, which only its rebuild reads;
the backlog passes all find the same streams (nothing is published between them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from prometheus_client.parser import text_string_to_metric_families

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import SidecarProcess, durable_config, sidecar_settings, wait_until
from sidecar.logs import configure_logging
from sidecar.naming import VirtualStream
from sidecar.nats.topology import TopologyError, apply_topology

REGIONS = ("west", "east")
CONCURRENCY = 20
SETUP_ATTEMPTS = 5
IN_FLIGHT = 200
READY_TIMEOUT_S = 600.0
SCRAPE_TIMEOUT_S = 120.0
_TICKS = os.sysconf("SC_CLK_TCK")
_THIS = Path(__file__).resolve().parent.parent
_SETTINGS = {"on": True, "off": False}
_COUNTED = (
    "rsub_snapshots_started_total",
    "rsub_snapshots_completed_total",
    "rsub_snapshots_timed_out_total",
)
SNAPSHOT_TIMEOUT_S = 30
LEASE_TTL_S = 10.0  # the sidecar's default; the test suites' 3 s is for quick takeovers

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    streams: int
    durables: int
    seconds: float
    progress: list[str]
    backlog: int
    backlog_seconds: float
    baseline: Path | None
    sweep_intervals: int | None
    replicas: list[int]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def cpu_wait_seconds(pid: int) -> float:
    """Time `pid` was ready to run but waited for a CPU (/proc/<pid>/schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def memory_mib(pid: int) -> dict[str, float]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def server_pids(cluster_dir: Path) -> list[int]:
    """The nats-server processes whose command line names `cluster_dir` (this bench's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"nats-server" in argv[0] and str(cluster_dir).encode() in b" ".join(argv):
                    pids.append(int(entry.name))
    return sorted(pids)


@contextlib.contextmanager
def code_of(checkout: Path | None) -> Iterator[str]:
    """Sidecars spawned inside run the code of `checkout` (None: this one, whichever checkout
    the venv was installed from); its label."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONSAFEPATH")}
    code = checkout if checkout is not None else _THIS
    os.environ["PYTHONPATH"] = f"{code}:{code / 'devtools'}"
    # `python -m` puts the working directory first on sys.path, before PYTHONPATH: run from
    # a checkout, the sidecars would import that checkout's code, whatever `checkout` says.
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield "baseline" if checkout is not None else "this"
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


async def bounded(jobs: Iterable[Awaitable[T]]) -> list[T]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Awaitable[T]) -> T:
        async with limit:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


async def metric_totals(proc: SidecarProcess, samples: Sequence[str]) -> list[float]:
    """The sum of each of `samples` over all its label sets in `proc`'s /metrics (one scrape:
    at 1,000 streams one costs the sidecar about a second of CPU, so a saturated one at 3,000
    takes many seconds to answer)."""
    totals = dict.fromkeys(samples, 0.0)
    for family in text_string_to_metric_families(await proc.metrics_text(SCRAPE_TIMEOUT_S)):
        for s in family.samples:
            if s.name in totals:
                totals[s.name] += s.value
    return [totals[name] for name in samples]


async def metric_total(proc: SidecarProcess, sample: str) -> float:
    """The sum of `sample` over all its label sets in `proc`'s /metrics."""
    return (await metric_totals(proc, [sample]))[0]


async def data_messages(
    js: JetStreamContext, streams: Sequence[VirtualStream], region: str = "west"
) -> int:
    """The data messages (markers left out) that `region`'s read streams hold."""

    async def one(vs: VirtualStream) -> int:
        info = await js.stream_info(vs.read_stream(region), subjects_filter=vs.data_filter())
        return sum((info.state.subjects or {}).values())

    return sum(await bounded(one(vs) for vs in streams))


async def index_figures(
    proc: SidecarProcess, js: JetStreamContext, streams: Sequence[VirtualStream]
) -> str:
    size = await metric_total(proc, "rsub_origin_index_bytes")
    messages = await data_messages(js, streams)
    per_message = f"{size / messages:.2f} B/msg" if messages else "no data"
    return (
        f"origin index {size / 1024:,.1f} KiB ({size / 24:,.0f} runs) "
        f"for {messages:,} data msgs ({per_message})"
    )


async def completed(procs: Sequence[SidecarProcess]) -> float:
    """Snapshots completed so far by `procs` (each counts those of the streams it leads)."""
    return sum([await metric_total(p, "rsub_snapshots_completed_total") for p in procs])


async def window(
    procs: Sequence[SidecarProcess],
    east: SidecarProcess,
    js: JetStreamContext,
    streams: Sequence[VirtualStream],
    seconds: float,
    label: str,
    servers: Sequence[int],
    load: Awaitable[None] | None = None,
) -> None:
    task = asyncio.ensure_future(load) if load is not None else None
    if task is not None:
        await asyncio.sleep(2)  # the first round of messages and snapshots under way
    # The scrapes stay out of the CPU figures (one costs a second of CPU at 1,000 streams).
    snaps = await completed(procs)
    pids = [p.pid for p in procs]
    cpu, waited, started = (
        [cpu_seconds(p) for p in pids],
        cpu_wait_seconds(pids[0]),
        time.monotonic(),
    )
    # Where the rest of the machine went: the servers, east's sidecar, this bench (publisher).
    rest = [*servers, east.pid, os.getpid()]
    rest_cpu = [cpu_seconds(pid) for pid in rest]
    await asyncio.sleep(seconds)
    cpu = [cpu_seconds(p) - before for p, before in zip(pids, cpu, strict=True)]
    waited = cpu_wait_seconds(pids[0]) - waited
    rest_cpu = [cpu_seconds(p) - before for p, before in zip(rest, rest_cpu, strict=True)]
    *servers_cpu, east_cpu, bench_cpu = rest_cpu
    elapsed = time.monotonic() - started
    snaps = await completed(procs) - snaps
    wanted = len(streams) if task is not None else 0
    servers_pct = " + ".join(f"{100 * c / elapsed:.0f}" for c in servers_cpu)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    mems = [memory_mib(p) for p in pids]
    each = ""
    if len(pids) > 1:
        each = " [" + " + ".join(f"{100 * c / elapsed:.1f}" for c in cpu) + "]"
    per_snapshot = f", {1000 * sum(cpu) / snaps:.2f} ms per snapshot" if snaps else ""
    rss = " + ".join(f"{m['VmRSS']:.0f}" for m in mems)
    peak = " + ".join(f"{m['VmHWM']:.0f}" for m in mems)
    print(
        f"{label:>20}: CPU {sum(cpu):6.2f} s in {elapsed:.0f} s ({100 * sum(cpu) / elapsed:5.1f} "
        f"% of a core{each}), RSS {rss} MiB (peak {peak} MiB), "
        f"{snaps / elapsed:.1f} snapshots/s completed (of {wanted} wanted{per_snapshot}), "
        f"servers CPU {servers_pct} % of a core, east's sidecar {100 * east_cpu / elapsed:.0f} "
        f"%, this bench {100 * bench_cpu / elapsed:.0f} %; west's (first) sidecar waited for a CPU "
        f"{100 * waited / elapsed:.0f} % of the time (load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores), {await index_figures(procs[0], js, streams)}",
        flush=True,
    )


async def settled(procs: Sequence[SidecarProcess]) -> None:
    """Wait until no snapshot of `procs` started, completed or timed out for longer than the
    snapshot timeout: then none is in flight (each ends within the timeout, or with the
    leadership), and the idle window measures idle sidecars."""
    last: tuple[float, ...] = ()
    since = time.monotonic()
    quiet_s = SNAPSHOT_TIMEOUT_S + 1

    async def quiet() -> bool:
        nonlocal last, since
        each = [await metric_totals(p, _COUNTED) for p in procs]
        counts = tuple(sum(column) for column in zip(*each, strict=True))
        if counts != last:
            last, since = counts, time.monotonic()
        return time.monotonic() - since >= quiet_s

    await wait_until(quiet, f"no snapshot activity for {quiet_s} s", READY_TIMEOUT_S, poll_s=5)


async def warm_up(conns: dict[str, Client], streams: Sequence[VirtualStream]) -> None:
    """One message per stream from every region, waited for in every read stream: the first
    message sourced from a new write stream takes most of a second (docs/benchmarks.md,
    snapshot latency), which no pass should pay for the others."""
    for region in REGIONS:
        js = conns[region].jetstream()
        await bounded(
            patiently(
                partial(
                    js.publish,
                    vs.publish_subject(region, "warm-up"),
                    b"w",
                    headers={"Nats-Msg-Id": f"warm-up-{region}-{vs.name}"},  # a retry: deduplicated
                )
            )
            for vs in streams
        )

    async def sourced() -> bool:
        for region in REGIONS:
            js = conns[region].jetstream()
            if await data_messages(js, streams, region) < len(REGIONS) * len(streams):
                return False
        return True

    await wait_until(sourced, "the warm-up messages in every read stream", READY_TIMEOUT_S)


async def publish_each_stream(nc: Client, streams: Sequence[VirtualStream]) -> None:
    js = nc.jetstream()
    while True:
        started = time.monotonic()
        await asyncio.gather(
            *(js.publish(vs.publish_subject("west", "tick"), b"x") for vs in streams)
        )
        await asyncio.sleep(max(0.0, 1 - (time.monotonic() - started)))


async def publish_backlog(
    conns: dict[str, Client], streams: Sequence[VirtualStream], count: int
) -> None:
    """`count` messages, stream after stream in turn, from every region at the same time."""

    async def region(name: str, share: int) -> None:
        js = conns[name].jetstream()
        payload = b"x" * 128
        for first in range(0, share, IN_FLIGHT):
            await asyncio.gather(
                *(
                    js.publish(streams[i % len(streams)].publish_subject(name, "backlog"), payload)
                    for i in range(first, min(share, first + IN_FLIGHT))
                )
            )

    shares = [count // len(REGIONS) + (i < count % len(REGIONS)) for i in range(len(REGIONS))]
    await asyncio.gather(*(region(r, n) for r, n in zip(REGIONS, shares, strict=True)))


@dataclass(frozen=True)
class BringUp:
    """A sidecar's start as its own log tells it."""

    rebuilt_s: float
    """`runtime_started` -> `runtime_ready`: connected, topology checked, every stream rebuilt
    (its /readyz answers 200 before the rebuilds, once the lease is known)."""
    replayed: int
    """Data messages replayed by the rebuilds (`stream_rebuilt` `data=`)."""


def log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


async def brought_up(proc: SidecarProcess) -> BringUp:
    """Wait until `proc` logs `runtime_ready`; what its log says of the start."""

    async def rebuilt() -> bool:
        return any(e.get("event") == "runtime_ready" for e in log_events(proc.log_path))

    await wait_until(rebuilt, f"runtime_ready of {proc.region}", READY_TIMEOUT_S, poll_s=0.2)
    events = log_events(proc.log_path)
    stamps = {
        e["event"]: datetime.fromisoformat(e["timestamp"])
        for e in events
        if e.get("event") in ("runtime_started", "runtime_ready")
    }
    return BringUp(
        (stamps["runtime_ready"] - stamps["runtime_started"]).total_seconds(),
        sum(int(e["data"]) for e in events if e.get("event") == "stream_rebuilt"),
    )


async def patiently(attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt` (idempotent) again after a timeout or a refusal (a loaded machine's servers
    answer late, or "JetStream system temporarily unavailable", while thousands of streams
    are set up)."""
    for _ in range(SETUP_ATTEMPTS - 1):
        with contextlib.suppress(TimeoutError, NatsError, TopologyError):
            return await attempt()
        await asyncio.sleep(1)
    return await attempt()


async def lay_out(
    nc: Client, streams: Sequence[VirtualStream], durables: int | Sequence[str]
) -> None:
    """Every stream's topology, and replicated durables on each of west's read streams
    (`durables` names them, or counts them: d0, d1, ...), `bounded` requests in flight,
    each one `patiently`."""
    js = nc.jetstream()
    names = [f"d{d}" for d in range(durables)] if isinstance(durables, int) else durables
    await bounded(patiently(partial(apply_topology, nc, vs)) for vs in streams)
    await bounded(
        patiently(partial(js.add_consumer, vs.read_stream("west"), durable_config(vs, name)))
        for vs in streams
        for name in names
    )


def bench_settings(
    cluster: LocalSuperCluster, region: str, names: Sequence[str], **extra: Any
) -> dict[str, Any]:
    """A sidecar's settings in the many-stream benches: a 1 s interval, the bench's snapshot
    timeout and lease TTL, logs at info (`runtime_started`, `stream_rebuilt`,
    `runtime_ready`; none per message)."""
    return sidecar_settings(
        cluster,
        region,
        streams=names,
        interval_ms=1000,
        timeout_s=SNAPSHOT_TIMEOUT_S,
        lease_ttl_s=LEASE_TTL_S,
        log_level="info",
        **extra,
    )


@contextlib.asynccontextmanager
async def sidecars(
    cluster: LocalSuperCluster,
    names: Sequence[str],
    progress: bool,
    workdir: Path,
    sweep_intervals: int | None = None,
    replicas: int = 1,
) -> AsyncIterator[tuple[list[SidecarProcess], SidecarProcess, BringUp]]:
    """Both regions' sidecars with `progress` (and `sweep_intervals` when given), `replicas`
    of west's, each started once the one before has rebuilt every stream, west first; yields
    west's, east's and how the first one's start went."""

    def settings(region: str) -> dict[str, Any]:
        values = bench_settings(cluster, region, names, progress=progress)
        if sweep_intervals is not None:
            values["snapshot"]["sweep_intervals"] = sweep_intervals
        return values

    wests = [SidecarProcess(settings("west"), workdir / f"west-{i}") for i in range(replicas)]
    procs = [*wests, SidecarProcess(settings("east"), workdir / "east")]
    try:
        started = []
        for proc in procs:
            await proc.start()
            started.append(await brought_up(proc))
        yield wests, procs[-1], started[0]
    finally:
        await asyncio.gather(*(p.stop() for p in procs))


def started_line(setting: str, west: SidecarProcess, start: BringUp, context: str = "") -> str:
    mem = memory_mib(west.pid)
    return (
        f"{setting}{context}: west rebuilt every stream {start.rebuilt_s:.1f} s after "
        f"it started, replaying {start.replayed:,} data msgs; RSS {mem['VmRSS']:.0f} MiB "
        f"(peak {mem['VmHWM']:.0f} MiB)"
    )


async def run(args: Options, directory: Path) -> None:
    names = [f"s{i:03d}" for i in range(args.streams)]
    streams = [VirtualStream(n, REGIONS) for n in names]
    bench_started = time.monotonic()
    async with LocalSuperCluster(REGIONS, directory / "cluster") as cluster:
        conns = {r: await nats.connect(cluster.servers(r)) for r in REGIONS}
        js = conns["west"].jetstream()
        try:
            started = time.monotonic()
            await lay_out(conns["west"], streams, args.durables)
            print(
                f"{args.streams} streams x {args.durables} replicated durables in west set up "
                f"in {time.monotonic() - started:.0f} s",
                flush=True,
            )
            await warm_up(conns, streams)
            servers = server_pids(directory / "cluster")
            checkouts = [args.baseline, None] if args.baseline is not None else [None]
            passes = itertools.product(args.progress, args.replicas, checkouts)
            for setting, replicas, checkout in passes:
                with code_of(checkout) as code:
                    workdir = directory / f"{setting}-{replicas}-{code}"
                    sweep = args.sweep_intervals if checkout is None else None
                    enabled = _SETTINGS[setting]
                    async with sidecars(cluster, names, enabled, workdir, sweep, replicas) as (
                        wests,
                        east,
                        start,
                    ):
                        label = f"{code}, {setting}" + (f", x{replicas}" if replicas > 1 else "")
                        print(started_line(label, wests[0], start), flush=True)
                        await settled(wests)
                        await window(
                            wests, east, js, streams, args.seconds, f"{label}, idle", servers
                        )
                        load = publish_each_stream(conns["west"], streams)
                        await window(
                            wests,
                            east,
                            js,
                            streams,
                            args.seconds,
                            f"{label}, loaded",
                            servers,
                            load,
                        )
            if args.backlog > 0:
                await backlog_passes(args, cluster, conns, streams, directory)
        finally:
            await asyncio.gather(*(nc.close() for nc in conns.values()))
    print(f"bench done in {time.monotonic() - bench_started:.0f} s", flush=True)


async def backlog_passes(
    args: Options,
    cluster: LocalSuperCluster,
    conns: dict[str, Client],
    streams: Sequence[VirtualStream],
    directory: Path,
) -> None:
    js = conns["west"].jetstream()
    expected = await data_messages(js, streams) + args.backlog
    started = time.monotonic()
    await publish_backlog(conns, streams, args.backlog)

    async def arrived() -> bool:
        return await data_messages(js, streams) >= expected

    await wait_until(arrived, "the backlog in west's read streams", READY_TIMEOUT_S, poll_s=1)
    print(
        f"backlog: {args.backlog:,} messages published in west and east and in west's read "
        f"streams after {time.monotonic() - started:.0f} s; durables still at their start",
        flush=True,
    )
    names = [vs.name for vs in streams]
    for setting in args.progress:
        workdir = directory / f"backlog-{setting}"
        with code_of(None):
            async with sidecars(cluster, names, _SETTINGS[setting], workdir) as (
                wests,
                east,
                start,
            ):
                print(started_line(f"progress {setting}", wests[0], start, ", backlog"), flush=True)
                label = f"{setting}, backlog, idle"
                servers = server_pids(directory / "cluster")
                await window(wests, east, js, streams, args.backlog_seconds, label, servers)


def counts(text: str) -> list[int]:
    try:
        chosen = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected replica counts such as 1 or 1,3")
    return chosen


def settings(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if not chosen or any(s not in _SETTINGS for s in chosen):
        raise argparse.ArgumentTypeError(f"{text!r}: expected on, off or on,off")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--durables", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30, help="idle and loaded windows")
    parser.add_argument(
        "--progress", type=settings, default=["on", "off"], help="on, off or on,off (in turn)"
    )
    parser.add_argument("--backlog", type=int, default=100_000, help="0: no backlog passes")
    parser.add_argument("--backlog-seconds", type=float, default=10)
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a checkout to measure first, side by side"
    )
    parser.add_argument(
        "--sweep-intervals", type=int, default=None, help="snapshot.sweep_intervals (not baseline)"
    )
    parser.add_argument(
        "--replicas",
        type=counts,
        default=[1],
        help="replicas of west's sidecar, e.g. 1,3 (in turn)",
    )
    args = Options(**vars(parser.parse_args()))
    configure_logging("console", "error", stream=sys.stderr)  # figures alone on stdout
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
