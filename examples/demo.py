"""The main job: fail a global durable consumer over from a lost region (`make demo`).

On a local three-region NATS super-cluster (west, central, east) on 127.0.0.1:

1. replication check: publish from every region at once and wait until every read stream of
   the virtual stream `orders` holds every message, in per-origin order;
2. failover: one rsub sidecar per region; a replicated durable `billing` on west's read
   stream; producers in every region throughout; `billing` consumes and acks in west; ALL of
   west (servers and sidecar) is killed; the consumer continues in east with the same
   durable name (created there by the sidecars' updates) until it has every message east can
   hold; producers keep going in central and east.

It prints what was published, consumed, lost and delivered twice, the bound on duplicates,
snapshot completion times and the time from the loss of west to the first message consumed
in east, and exits 1 when a message was lost or duplicates exceed the bound. Everything is
torn down at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import (
    RegionSidecars,
    durable_config,
    in_flight_count,
    percentile,
    read_stored,
    wait_until,
)
from rsub_dev.workload import Workload
from sidecar.api.backend import SnapshotView
from sidecar.api.errors import NotFound
from sidecar.config import NatsConfig
from sidecar.logs import configure_logging
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.connection import connect_options
from sidecar.nats.topology import apply_topology

STREAM = "orders"
DURABLE = "billing"
FAILED_REGION = "west"
TAKEOVER_REGION = "east"
PUBLISH_BATCH = 500
_STEP_TIMEOUT_S = 60.0


class Progress:
    """One rewritten status line on a terminal, plain lines otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()

    def show(self, text: str) -> None:
        if self._tty:
            sys.stderr.write(f"\r\x1b[K{text}")
        else:
            sys.stderr.write(f"{text}\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self._tty:
            sys.stderr.write("\n")


async def quiet_connect(servers: Sequence[str]) -> NATS:
    """A client whose connection troubles (expected once a region is killed) are not logged."""

    async def ignore(_error: Exception) -> None:
        return None

    options = connect_options(NatsConfig(servers=tuple(servers)))
    return await nats.connect(**options, error_cb=ignore)


async def close_quietly(nc: NATS) -> None:
    """Close a client; nats-py can raise ConnectionResetError closing one that is reconnecting."""
    with contextlib.suppress(OSError):
        await nc.close()


# ---- phase 1: replication check ---------------------------------------------------------


@dataclass(frozen=True)
class StoredData:
    """One data message of a read stream: where it came from and its payload."""

    origin: str
    origin_seq: int
    payload: bytes


@dataclass(frozen=True)
class RegionResult:
    region: str
    messages: int
    per_origin: dict[str, int]
    order_intact: bool
    converge_s: float


async def publish_region(nc: NATS, vs: VirtualStream, region: str, count: int) -> list[bytes]:
    """Publish `count` messages in `region`, acknowledged by its write stream, in batches."""
    js = nc.jetstream()
    subject = vs.publish_subject(region, "created")
    payloads = [f"{region}-check-{n}".encode() for n in range(count)]
    for start in range(0, count, PUBLISH_BATCH):
        await asyncio.gather(
            *(js.publish(subject, p) for p in payloads[start : start + PUBLISH_BATCH])
        )
    return payloads


async def read_data(nc: NATS, vs: VirtualStream, region: str) -> list[StoredData]:
    """Every data message of `region`'s read stream, in stream order."""
    stored = await read_stored(nc, vs.read_stream(region), vs.data_filter())
    data = []
    for item in stored:
        origin = vs.origin_of(item.headers.get(SOURCE_HEADER, ""))
        if origin is not None:
            data.append(StoredData(origin[0], origin[1], item.data))
    return data


def order_intact(stored: Sequence[StoredData]) -> bool:
    """True when every origin's sequences appear strictly increasing."""
    last: dict[str, int] = {}
    for item in stored:
        if item.origin_seq <= last.get(item.origin, 0):
            return False
        last[item.origin] = item.origin_seq
    return True


async def wait_converged(
    ncs: dict[str, NATS], vs: VirtualStream, expected: int, started: float, progress: Progress
) -> dict[str, float]:
    """Seconds from the start of publishing until each read stream held `expected` messages."""
    converged: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(converged) < len(vs.regions):
        counts = {}
        for region in vs.regions:
            info = await ncs[region].jetstream().stream_info(vs.read_stream(region))
            counts[region] = info.state.messages
            if region not in converged and info.state.messages >= expected:
                converged[region] = time.monotonic() - started
        progress.show("converging: " + "  ".join(f"{r} {counts[r]}/{expected}" for r in vs.regions))
        if time.monotonic() > deadline:
            raise TimeoutError(f"read streams did not converge: {counts}")
        await asyncio.sleep(0.1)
    return converged


async def replication_check(
    cluster: LocalSuperCluster, vs: VirtualStream, per_region: int, progress: Progress
) -> tuple[list[RegionResult], list[bytes]]:
    """Publish in every region at once; per region, what its read stream holds, and the
    payloads published."""
    ncs = {r: await quiet_connect(cluster.servers(r)) for r in vs.regions}
    try:
        report = await apply_topology(ncs[vs.regions[0]], vs)
        created = sum(1 for s in report.streams if s.action == "created")
        progress.show(f"topology applied: {created} streams created")
        progress.done()
        started = time.monotonic()
        published = await asyncio.gather(
            *(publish_region(ncs[r], vs, r, per_region) for r in vs.regions)
        )
        converge = await wait_converged(ncs, vs, per_region * len(vs.regions), started, progress)
        progress.done()
        results = []
        for region in vs.regions:
            stored = await read_data(ncs[region], vs, region)
            per_origin = {r: sum(1 for s in stored if s.origin == r) for r in vs.regions}
            results.append(
                RegionResult(
                    region, len(stored), per_origin, order_intact(stored), converge[region]
                )
            )
        return results, [p for payloads in published for p in payloads]
    finally:
        for nc in ncs.values():
            await nc.close()


def print_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for line in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def print_table(results: Sequence[RegionResult], regions: Sequence[str]) -> None:
    header = ["region", "messages", *(f"from {r}" for r in regions), "order intact", "converged"]
    rows = [
        [
            r.region,
            str(r.messages),
            *(str(r.per_origin[o]) for o in regions),
            "yes" if r.order_intact else "NO",
            f"{r.converge_s:.2f} s",
        ]
        for r in results
    ]
    print_rows(header, rows)


# ---- phase 2: failover ------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverReport:
    published: dict[str, int]
    unconfirmed: dict[str, int]
    consumed: dict[str, int]
    distinct: int
    lost: list[bytes]
    stranded: int
    stranded_consumed: int
    stranded_in_central: int
    duplicates: int
    bound: int
    bound_text: str
    snapshot_used: str
    snapshot_positions: str
    snapshot_durations_ms: list[int]
    loss_to_first_s: float

    @property
    def ok(self) -> bool:
        return not self.lost and self.duplicates <= self.bound


async def create_billing(nc: NATS, vs: VirtualStream, region: str) -> None:
    await nc.jetstream().add_consumer(
        vs.read_stream(region),
        durable_config(vs, DURABLE),
    )


def snapshot_start_ms(snapshot: SnapshotView) -> int:
    return snapshot.completed_unix_ms - snapshot.duration_ms


async def failover(
    cluster: LocalSuperCluster,
    vs: VirtualStream,
    progress: Progress,
    checked: Sequence[bytes],
    *,
    rate_per_s: float,
    west_s: float,
    after_s: float,
    interval_ms: int,
) -> FailoverReport:
    ncs = {r: await quiet_connect(cluster.servers(r)) for r in vs.regions}
    try:
        async with (
            RegionSidecars(cluster, streams=[vs.name], interval_ms=interval_ms) as sidecars,
            Workload(ncs, vs, rate_per_s, (DURABLE,)) as work,
        ):
            west, east = sidecars[FAILED_REGION], sidecars[TAKEOVER_REGION]
            progress.show("sidecars ready and leading in every region")
            progress.done()
            await create_billing(ncs[FAILED_REGION], vs, FAILED_REGION)
            producers, consumer = work.producers, work.consumers[DURABLE]
            work.consume_in(ncs[FAILED_REGION], FAILED_REGION)
            status = work.status

            started = time.monotonic()

            async def ready_to_fail() -> bool:
                progress.show(status(f"consuming in {FAILED_REGION}"))
                if time.monotonic() - started < west_s:
                    return False
                try:
                    view = await east.get_subscription(vs.name, DURABLE)
                except NotFound:
                    return False
                return any(a.from_region == FAILED_REGION for a in view.applied)

            await wait_until(
                ready_to_fail,
                f"an update for {DURABLE!r} applied in {TAKEOVER_REGION}",
                west_s + _STEP_TIMEOUT_S,
            )
            progress.done()

            # ---- the loss of west: servers SIGKILLed, its sidecar and producer gone ----
            lost_at = time.monotonic()
            await cluster.stop_region(FAILED_REGION)
            work.stop_producer(FAILED_REGION)
            # Where east's durable starts: updates still on their way can only move it further.
            east_view = await east.get_subscription(vs.name, DURABLE)
            used = next(a for a in east_view.applied if a.from_region == FAILED_REGION)
            work.consume_in(ncs[TAKEOVER_REGION], TAKEOVER_REGION)
            # The sidecar's state outlives its region: it tells which snapshots it took.
            west_snapshots = {s.id: s for s in await west.list_snapshots(vs.name)}
            await sidecars.stop(FAILED_REGION)
            await close_quietly(ncs.pop(FAILED_REGION))
            progress.show(f"{FAILED_REGION} killed; consuming {DURABLE!r} in {TAKEOVER_REGION}")
            progress.done()
            await asyncio.sleep(after_s)
            survivors = [r for r in vs.regions if r != FAILED_REGION]
            for region in survivors:
                work.stop_producer(region)

            # What east can ever hold: all survivors' data, and west's data that left west.
            async def east_has_survivors() -> bool:
                try:
                    stored = await read_data(ncs[TAKEOVER_REGION], vs, TAKEOVER_REGION)
                except (NatsError, TimeoutError):
                    # Reading creates an ordered consumer: that waits for a new meta leader.
                    return False
                have = {s.payload for s in stored}
                progress.show(status(f"waiting for {TAKEOVER_REGION}'s read stream"))
                return all(p in have for r in survivors for p in producers[r].confirmed)

            await wait_until(
                east_has_survivors, "east to hold every survivor's message", poll_s=0.5
            )
            east_data = {
                s.payload for s in await read_data(ncs[TAKEOVER_REGION], vs, TAKEOVER_REGION)
            }
            central_data = {s.payload for s in await read_data(ncs["central"], vs, "central")}
            expected = set(checked) | {p for r in survivors for p in producers[r].confirmed}
            expected |= {p for p in producers[FAILED_REGION].confirmed if p in east_data}
            expected |= {p for p in producers[FAILED_REGION].unconfirmed if p in east_data}

            async def all_consumed() -> bool:
                progress.show(status(f"consuming in {TAKEOVER_REGION}"))
                return expected <= {d.payload for d in consumer.deliveries}

            with contextlib.suppress(TimeoutError):
                await wait_until(
                    all_consumed, "the consumer to receive everything", _STEP_TIMEOUT_S
                )
            progress.done()

            snapshot = west_snapshots.get(used.snapshot_id)
            in_flight = 0
            if snapshot is not None:
                in_flight = await in_flight_count(
                    ncs,
                    vs,
                    TAKEOVER_REGION,
                    used.position,
                    snapshot_start_ms(snapshot),
                    survivors,
                )
            first_east = min(
                (d.at for d in consumer.in_region(TAKEOVER_REGION)), default=float("nan")
            )
            durations = [s.duration_ms for s in west_snapshots.values()]
            for region in survivors:
                durations += [s.duration_ms for s in await sidecars[region].list_snapshots(vs.name)]
    finally:
        for nc in ncs.values():
            await close_quietly(nc)

    delivered = Counter(d.payload for d in consumer.deliveries)
    west_deliveries = consumer.in_region(FAILED_REGION)
    west_consumed = {d.payload for d in west_deliveries}
    stranded = [p for p in producers[FAILED_REGION].confirmed if p not in east_data]
    if snapshot is None:
        # The snapshot used is not in west's history: no bound can be stated, so none holds.
        bound, used_text = -1, f"{used.snapshot_id} (unknown to {FAILED_REGION}'s history)"
        bound_text = "no bound: the snapshot used is unknown"
    else:
        start_ms = snapshot_start_ms(snapshot)
        after_start = sum(1 for d in west_deliveries if d.stored_unix_ms >= start_ms)
        bound = after_start + in_flight
        used_text = f"{used.snapshot_id} (local position {snapshot.local_position})"
        bound_text = (
            f"{after_start} consumed in {FAILED_REGION} that reached its read stream after the "
            f"snapshot used started + {in_flight} then still in flight from "
            f"{'/'.join(survivors)} to {TAKEOVER_REGION}"
        )
    return FailoverReport(
        published={r: len(p.confirmed) for r, p in producers.items()},
        unconfirmed={r: len(p.unconfirmed) for r, p in producers.items()},
        consumed=dict(Counter(d.region for d in consumer.deliveries)),
        distinct=len(delivered),
        lost=sorted(expected - set(delivered)),
        stranded=len(stranded),
        stranded_consumed=sum(1 for p in stranded if p in west_consumed),
        stranded_in_central=sum(1 for p in stranded if p in central_data),
        duplicates=sum(n - 1 for n in delivered.values()),
        bound=bound,
        bound_text=bound_text,
        snapshot_used=used_text,
        snapshot_positions=f"{TAKEOVER_REGION} resumed after position {used.position}",
        snapshot_durations_ms=durations,
        loss_to_first_s=first_east - lost_at,
    )


def print_failover(report: FailoverReport, regions: Sequence[str]) -> None:
    def per_region(counts: dict[str, int], where: Sequence[str] = regions) -> str:
        return "  ".join(f"{r} {counts.get(r, 0)}" for r in where)

    durations = report.snapshot_durations_ms
    print(f"\nfailover of durable {DURABLE!r} from {FAILED_REGION} to {TAKEOVER_REGION}")
    print(f"published (acknowledged):  {per_region(report.published)} (+ the check's messages)")
    if any(report.unconfirmed.values()):
        print(f"  cut off unacknowledged:  {per_region(report.unconfirmed)}")
    print(
        f"never left {FAILED_REGION}:           {report.stranded} acknowledged {FAILED_REGION} "
        f"messages never reached {TAKEOVER_REGION} ({report.stranded_consumed} consumed in "
        f"{FAILED_REGION} before the loss, {report.stranded_in_central} held by central only): "
        f"no consumer in {TAKEOVER_REGION} can read them, so they are not counted as lost"
    )
    consumed = per_region(report.consumed, (FAILED_REGION, TAKEOVER_REGION))
    print(f"consumed:                  {consumed} ({report.distinct} distinct messages)")
    print(f"lost:                      {len(report.lost)}")
    print(
        f"delivered twice:           {report.duplicates} (must stay <= {report.bound}: "
        f"{report.bound_text})"
    )
    print(f"snapshot used:             {report.snapshot_used}; {report.snapshot_positions}")
    if durations:
        print(
            f"snapshot completion:       p50 {percentile(durations, 50):.0f} ms, "
            f"p99 {percentile(durations, 99):.0f} ms over {len(durations)} snapshots of all "
            "regions (ListSnapshots of the sidecars)"
        )
    print(
        f"loss of {FAILED_REGION} -> first message consumed in {TAKEOVER_REGION}: "
        f"{report.loss_to_first_s:.2f} s"
    )
    if report.lost:
        shown = b", ".join(report.lost[:10]).decode()
        print(f"LOST: {shown}{' ...' if len(report.lost) > 10 else ''}")
    print(f"\nresult: {'OK' if report.ok else 'FAILED'}")


async def run(args: argparse.Namespace, regions: Sequence[str], directory: Path) -> int:
    progress = Progress()
    progress.show(f"starting {len(regions)} regions in {directory} ...")
    started = time.monotonic()
    async with LocalSuperCluster(regions, directory) as cluster:
        progress.show(f"cluster ready in {time.monotonic() - started:.1f} s")
        progress.done()
        vs = VirtualStream(STREAM, tuple(regions))
        results, checked = await replication_check(cluster, vs, args.messages, progress)
        expected = args.messages * len(regions)
        print(f"\nreplication check: {args.messages} messages published in each region")
        print_table(results, regions)
        replicated = all(r.messages == expected and r.order_intact for r in results)
        print(f"every read stream holds every message: {'yes' if replicated else 'NO'}\n")
        report = await failover(
            cluster,
            vs,
            progress,
            checked,
            rate_per_s=args.rate,
            west_s=args.west_seconds,
            after_s=args.after_seconds,
            interval_ms=args.interval_ms,
        )
    print_failover(report, regions)
    print(f"total time {time.monotonic() - started:.1f} s")
    return 0 if replicated and report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300, help="replication check, per region")
    parser.add_argument("--rate", type=float, default=100, help="messages/s per producer")
    parser.add_argument("--west-seconds", type=float, default=4, help="consuming in west")
    parser.add_argument("--after-seconds", type=float, default=3, help="publishing after the loss")
    parser.add_argument("--interval-ms", type=int, default=250, help="snapshot interval")
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    configure_logging("console", "error", stream=sys.stderr)
    regions = (FAILED_REGION, "central", TAKEOVER_REGION)
    try:
        if args.dir is not None:
            return asyncio.run(run(args, regions, args.dir))
        with tempfile.TemporaryDirectory(prefix="rsub-demo-") as tmp:
            return asyncio.run(run(args, regions, Path(tmp)))
    except KeyboardInterrupt:
        print("\ninterrupted: everything was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
