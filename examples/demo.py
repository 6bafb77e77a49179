"""The main job: fail a global durable consumer over from a lost region (`make demo`).

On a local three-region NATS super-cluster (west, central, east) on 127.0.0.1:

1. replication check: publish from every region at once and wait until every read stream of
   the virtual stream `orders` holds every message, in per-origin order;
2. act 1, failover: one rsub sidecar per region; replicated durables `billing` and
   `billing-exact` on west's read stream, consumed in step in west while producers publish in
   every region; ALL of west (servers and sidecar) is killed; once east's sidecar settled,
   `billing` continues natively in east and `billing-exact` through the exact client
   (`sidecar.exact.ExactConsumer`, with the progress vector read from east's sidecar), until
   both have every message east can hold;
3. act 2, outage (`--outage-s`, skipped with `--no-outage`): the same on a fresh cluster, but
   central is lost first and west consumes without it for a while before west is lost too;
4. act 3, failback (`--failback-away-s`, skipped with `--no-failback`): west lost, its
   application continues in east for a while, then west's servers restart from their store
   with its sidecar, and the application in west reconnects as soon as west's JetStream
   answers (`rsub_dev.failback`); once with the failback guard and once without
   (`failback.hold_s: 0`), each on a fresh cluster. JetStream resumes sourcing into west's
   read stream only 30-45 s after the restart, so this act takes about two minutes.

Per act it prints what was published, consumed, lost and delivered twice, the snapshot bound
(act 1), snapshot completion times, the time from the loss of west to the first message in
east, and a table of duplicates: native against east's exposure plus what west consumed that
east's progress does not cover, exact against the latter alone (docs/protocol.md §6). It
exits 1 when a message was lost or duplicates exceed a bound. Act 3 prints the duplicates
in west with and without the guard, how long consumption in west was held, and what was
lost; it fails when a message was lost, the hold did not end caught up, or west delivered
again the covered run right after its position with the guard. `--pip33` runs the sidecars
with progress vectors off, for comparison. Everything is torn down at the end, also on Ctrl-C.
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

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.failback import FailbackRun, failback, table
from rsub_dev.sidecars import (
    RegionSidecars,
    durable_config,
    in_flight_count,
    percentile,
    read_stored,
    wait_until,
)
from rsub_dev.workload import (
    ReadStreamLedger,
    Workload,
    close_quietly,
    lose_region,
    quiet_connect,
    wait_settled,
)
from sidecar.exact import covered, progress_of
from sidecar.logs import configure_logging
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.topology import apply_topology
from sidecar.runtime.errors import NotFound
from sidecar.runtime.views import SnapshotView

STREAM = "orders"
DURABLE = "billing"
EXACT_DURABLE = "billing-exact"
DURABLES = (DURABLE, EXACT_DURABLE)
OUTAGE_REGION = "central"
FAILED_REGION = "west"
TAKEOVER_REGION = "east"
PUBLISH_BATCH = 500
_STEP_TIMEOUT_S = 60.0
# East's view counts as settled after this many snapshot intervals without a change.
_SETTLED_INTERVALS = 5


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


# ---- phase 2: failover, phase 3: outage -------------------------------------------------


@dataclass(frozen=True)
class Duplicates:
    """Duplicates after the loss of west against what east's sidecar knew (docs/protocol.md
    §6): a native durable receives again at most east's exposure plus what west consumed
    that no vector received by east covers; the exact client only the latter. The exposure
    checked is counted in east's read stream: the sidecar's own counts only what its origin
    index has read."""

    lost_exact: int
    native: int
    exact: int
    exposure_before: int | None
    """East's `failover_exposure` of `billing` at its last read before the loss."""
    exposure: int | None
    """The same once east settled after the loss (None: no progress, PIP-33 only)."""
    exposure_held: int | None
    """Messages in east's read stream above the settled position that east's progress
    covers (None: no progress)."""
    uncovered_native: int
    uncovered_exact: int
    """Messages of each durable consumed in west that east's progress does not cover."""
    outage_consumed: int | None
    """Messages `billing` consumed in west while central was lost (None: no outage)."""

    @property
    def native_bound(self) -> int | None:
        if self.exposure_held is None:
            return None
        return self.exposure_held + self.uncovered_native

    @property
    def ok(self) -> bool:
        if self.lost_exact:
            return False
        if self.native_bound is None:
            return True
        return self.exact <= self.uncovered_exact and self.native <= self.native_bound


@dataclass(frozen=True)
class FailoverReport:
    published: dict[str, int]
    unconfirmed: dict[str, int]
    consumed: dict[str, int]
    distinct: int
    lost: list[bytes]
    stranded: int
    stranded_consumed: int
    stranded_in_central: int | None
    duplicates: int
    bound: int | None
    """The snapshot bound on `duplicates` (-1: unknown snapshot; None: not stated)."""
    bound_text: str
    snapshot_used: str
    snapshot_positions: str
    snapshot_durations_ms: list[int]
    loss_to_first_s: float
    vectors: Duplicates

    @property
    def ok(self) -> bool:
        snapshot_ok = self.bound is None or self.duplicates <= self.bound
        return not self.lost and snapshot_ok and self.vectors.ok


def snapshot_start_ms(snapshot: SnapshotView) -> int:
    return snapshot.completed_unix_ms - snapshot.duration_ms


async def failover(
    cluster: LocalSuperCluster,
    vs: VirtualStream,
    progress: Progress,
    *,
    rate_per_s: float,
    west_s: float,
    outage_s: float,
    after_s: float,
    interval_ms: int,
    vectors: bool,
) -> FailoverReport:
    """Consume both durables in west (with central lost for the last `outage_s`, if any),
    lose west suddenly, continue in east until everything east holds is consumed."""
    ncs = {r: await quiet_connect(cluster.servers(r)) for r in vs.regions}
    try:
        async with (
            RegionSidecars(
                cluster, streams=[vs.name], interval_ms=interval_ms, progress=vectors
            ) as sidecars,
            Workload(ncs, vs, rate_per_s, DURABLES) as work,
        ):
            west, east = sidecars[FAILED_REGION], sidecars[TAKEOVER_REGION]
            progress.show("sidecars ready and leading in every region")
            progress.done()
            for durable in DURABLES:
                await (
                    ncs[FAILED_REGION]
                    .jetstream()
                    .add_consumer(vs.read_stream(FAILED_REGION), durable_config(vs, durable))
                )
            ledger = await ReadStreamLedger.open(ncs[TAKEOVER_REGION], vs, TAKEOVER_REGION)
            producers, consumer = work.producers, work.consumers[DURABLE]
            work.consume_in(ncs[FAILED_REGION], FAILED_REGION)
            status = work.status

            started = time.monotonic()

            async def ready_to_fail() -> bool:
                progress.show(status(f"consuming in {FAILED_REGION}"))
                if time.monotonic() - started < west_s:
                    return False
                try:
                    views = [await east.get_subscription(vs.name, d) for d in DURABLES]
                except NotFound:
                    return False
                return any(a.from_region == FAILED_REGION for a in views[0].applied)

            await wait_until(
                ready_to_fail,
                f"updates for {DURABLES} applied in {TAKEOVER_REGION}",
                west_s + _STEP_TIMEOUT_S,
            )
            progress.done()
            survivors = [r for r in vs.regions if r != FAILED_REGION]
            outage_consumed = None
            if outage_s > 0:
                await lose_region(cluster, sidecars, work, ncs, OUTAGE_REGION)
                survivors.remove(OUTAGE_REGION)
                before = len(consumer.deliveries)
                outage_end = time.monotonic() + outage_s
                while time.monotonic() < outage_end:
                    progress.show(status(f"{OUTAGE_REGION} lost, consuming in {FAILED_REGION}"))
                    await asyncio.sleep(0.5)
                progress.done()
                outage_consumed = len(consumer.deliveries) - before
            before_loss = await east.get_subscription(vs.name, DURABLE)

            # ---- the loss of west: servers SIGKILLed, its sidecar and producer gone ----
            lost_at = time.monotonic()
            await cluster.stop_region(FAILED_REGION)
            work.stop_producer(FAILED_REGION)
            # The sidecar's state outlives its region: it tells which snapshots it took.
            west_snapshots = {s.id: s for s in await west.list_snapshots(vs.name)}
            await sidecars.stop(FAILED_REGION)
            await close_quietly(ncs.pop(FAILED_REGION))
            # East applies the updates that left west before the loss, then both continue
            # there: `billing` natively, `billing-exact` skipping what east's progress covers.
            views = await wait_settled(
                east, vs.name, DURABLES, _SETTLED_INTERVALS * interval_ms / 1000
            )
            east_view = views[DURABLE]
            used = next(a for a in east_view.applied if a.from_region == FAILED_REGION)
            vector = await progress_of(f"127.0.0.1:{east.grpc_port}", vs.name, EXACT_DURABLE)
            work.consume_in(ncs[TAKEOVER_REGION], TAKEOVER_REGION, {EXACT_DURABLE: vector})
            progress.show(
                f"{FAILED_REGION} killed; consuming {DURABLE!r} natively and "
                f"{EXACT_DURABLE!r} exactly in {TAKEOVER_REGION}"
            )
            progress.done()
            await asyncio.sleep(after_s)
            for region in survivors:
                work.stop_producer(region)
            # What east can ever hold: all survivors' data, and west's data that left west.
            progress.show(status(f"waiting for {TAKEOVER_REGION}'s read stream"))
            survivors_data = {p for r in survivors for p in producers[r].confirmed}
            expected = await ledger.holding(
                survivors_data,
                f"{TAKEOVER_REGION} to hold every survivor's message",
                _STEP_TIMEOUT_S,
            )
            central_data: set[bytes] | None = None

            async def read_central() -> bool:
                nonlocal central_data
                try:
                    stored = await read_data(ncs[OUTAGE_REGION], vs, OUTAGE_REGION)
                except (NatsError, TimeoutError):
                    # Reading creates an ordered consumer: that waits for a new meta leader.
                    return False
                central_data = {s.payload for s in stored}
                return True

            if OUTAGE_REGION in survivors:
                await wait_until(
                    read_central, f"{OUTAGE_REGION}'s read stream", _STEP_TIMEOUT_S, poll_s=0.5
                )

            async def all_consumed() -> bool:
                progress.show(status(f"consuming in {TAKEOVER_REGION}"))
                return all(not c.missing(expected) for c in work.consumers.values())

            with contextlib.suppress(TimeoutError):
                await wait_until(
                    all_consumed, "the consumers to receive everything", _STEP_TIMEOUT_S
                )
            progress.done()

            snapshot = west_snapshots.get(used.snapshot_id)
            in_flight = None
            if snapshot is not None and OUTAGE_REGION in survivors:
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

    exact = work.consumers[EXACT_DURABLE]
    delivered = Counter(d.payload for d in consumer.deliveries)
    west_deliveries = consumer.in_region(FAILED_REGION)
    west_consumed = {d.payload for d in west_deliveries}
    stranded = [p for p in producers[FAILED_REGION].confirmed if p not in expected]
    bound: int | None
    if snapshot is None:
        # The snapshot used is not in west's history: no bound can be stated, so none holds.
        bound, used_text = -1, f"{used.snapshot_id} (unknown to {FAILED_REGION}'s history)"
        bound_text = "no bound: the snapshot used is unknown"
    else:
        start_ms = snapshot_start_ms(snapshot)
        after_start = sum(1 for d in west_deliveries if d.stored_unix_ms >= start_ms)
        used_text = f"{used.snapshot_id} (local position {snapshot.local_position})"
        if in_flight is None:
            bound = None
            bound_text = (
                f"no snapshot bound: it counts messages in flight from {OUTAGE_REGION}, lost"
            )
        else:
            bound = after_start + in_flight
            bound_text = (
                f"{after_start} consumed in {FAILED_REGION} that reached its read stream after "
                f"the snapshot used started + {in_flight} then still in flight from "
                f"{'/'.join(survivors)} to {TAKEOVER_REGION}"
            )
    return FailoverReport(
        published={r: len(p.confirmed) for r, p in producers.items()},
        unconfirmed={r: len(p.unconfirmed) for r, p in producers.items()},
        consumed=dict(Counter(d.region for d in consumer.deliveries)),
        distinct=len(delivered),
        lost=consumer.missing(expected),
        stranded=len(stranded),
        stranded_consumed=sum(1 for p in stranded if p in west_consumed),
        stranded_in_central=(
            None if central_data is None else sum(1 for p in stranded if p in central_data)
        ),
        duplicates=consumer.duplicates(),
        bound=bound,
        bound_text=bound_text,
        snapshot_used=used_text,
        snapshot_positions=f"{TAKEOVER_REGION} resumed after position {used.position}",
        snapshot_durations_ms=durations,
        loss_to_first_s=first_east - lost_at,
        vectors=Duplicates(
            lost_exact=len(exact.missing(expected)),
            native=consumer.duplicates(),
            exact=exact.duplicates(),
            exposure_before=before_loss.failover_exposure,
            exposure=east_view.failover_exposure,
            exposure_held=(
                None
                if east_view.failover_exposure is None
                else sum(
                    1
                    for h in ledger.held
                    if h.seq > east_view.mark_delete and covered(h.origin, east_view.progress)
                )
            ),
            uncovered_native=consumer.uncovered(FAILED_REGION, east_view.progress),
            uncovered_exact=exact.uncovered(FAILED_REGION, vector),
            outage_consumed=outage_consumed,
        ),
    )


def print_duplicates(dup: Duplicates, lost_native: int) -> None:
    def shown(value: int | None) -> str:
        return "-" if value is None else str(value)

    print_rows(
        ["after the loss of west", f"{DURABLE} (native)", f"{EXACT_DURABLE} (exact client)"],
        [
            ["lost", str(lost_native), str(dup.lost_exact)],
            ["delivered twice", str(dup.native), str(dup.exact)],
            [
                f"{TAKEOVER_REGION}'s failover_exposure before the loss / settled",
                f"{shown(dup.exposure_before)} / {shown(dup.exposure)}",
                "-",
            ],
            [
                f"covered above {TAKEOVER_REGION}'s position in its read stream",
                shown(dup.exposure_held),
                "-",
            ],
            [
                f"consumed in {FAILED_REGION}, not covered by {TAKEOVER_REGION}'s progress",
                str(dup.uncovered_native),
                str(dup.uncovered_exact),
            ],
            [
                "bound (covered above + not covered / not covered)",
                shown(dup.native_bound),
                "-" if dup.native_bound is None else str(dup.uncovered_exact),
            ],
        ],
    )
    reported, held = dup.exposure, dup.exposure_held
    if reported is not None and held is not None and held > reported:
        print(
            f"note: {TAKEOVER_REGION}'s sidecar reported an exposure of {reported}, but {held} "
            "covered messages lay above its position: its origin index had not read them all "
            "when its view settled"
        )
    if dup.outage_consumed is not None:
        print(f"consumed in {FAILED_REGION} while {OUTAGE_REGION} was lost: {dup.outage_consumed}")
    if dup.native_bound is None:
        print("PIP-33 only (progress.enabled=false): no vector, so no vector bound is checked")


def print_failover(report: FailoverReport, regions: Sequence[str], title: str) -> None:
    def per_region(counts: dict[str, int], where: Sequence[str] = regions) -> str:
        return "  ".join(f"{r} {counts.get(r, 0)}" for r in where)

    durations = report.snapshot_durations_ms
    print(f"\n{title}")
    print(f"published (acknowledged):  {per_region(report.published)}")
    if any(report.unconfirmed.values()):
        print(f"  cut off unacknowledged:  {per_region(report.unconfirmed)}")
    central = (
        ""
        if report.stranded_in_central is None
        else f", {report.stranded_in_central} held by central only"
    )
    print(
        f"never left {FAILED_REGION}:           {report.stranded} acknowledged {FAILED_REGION} "
        f"messages never reached {TAKEOVER_REGION} ({report.stranded_consumed} consumed in "
        f"{FAILED_REGION} before the loss{central}): "
        f"no consumer in {TAKEOVER_REGION} can read them, so they are not counted as lost"
    )
    consumed = per_region(report.consumed, (FAILED_REGION, TAKEOVER_REGION))
    print(f"consumed ({DURABLE}):        {consumed} ({report.distinct} distinct messages)")
    limit = "" if report.bound is None else f"must stay <= {report.bound}: "
    print(f"delivered twice ({DURABLE}): {report.duplicates} ({limit}{report.bound_text})")
    print(f"snapshot used:             {report.snapshot_used}; {report.snapshot_positions}")
    if durations:
        print(
            f"snapshot completion:       p50 {percentile(durations, 50):.0f} ms, "
            f"p99 {percentile(durations, 99):.0f} ms over {len(durations)} snapshots of all "
            "regions (ListSnapshots of the sidecars)"
        )
    print(
        f"loss of {FAILED_REGION} -> first message consumed in {TAKEOVER_REGION}: "
        f"{report.loss_to_first_s:.2f} s (after {TAKEOVER_REGION}'s sidecar settled)"
    )
    print_duplicates(report.vectors, len(report.lost))
    if report.lost:
        shown = b", ".join(report.lost[:10]).decode()
        print(f"LOST: {shown}{' ...' if len(report.lost) > 10 else ''}")
    print(f"result: {'OK' if report.ok else 'FAILED'}")


async def run(args: argparse.Namespace, regions: Sequence[str], directory: Path) -> int:
    progress = Progress()
    progress.show(f"starting {len(regions)} regions in {directory} ...")
    started = time.monotonic()
    vs = VirtualStream(STREAM, tuple(regions))
    phases = {
        "rate_per_s": args.rate,
        "west_s": args.west_seconds,
        "after_s": args.after_seconds,
        "interval_ms": args.interval_ms,
        "vectors": not args.pip33,
    }
    mode = "PIP-33 only" if args.pip33 else "with progress vectors"
    async with LocalSuperCluster(regions, directory / "failover") as cluster:
        progress.show(f"cluster ready in {time.monotonic() - started:.1f} s")
        progress.done()
        results, _ = await replication_check(cluster, vs, args.messages, progress)
        expected = args.messages * len(regions)
        print(f"\nreplication check: {args.messages} messages published in each region")
        print_table(results, regions)
        replicated = all(r.messages == expected and r.order_intact for r in results)
        print(f"every read stream holds every message: {'yes' if replicated else 'NO'}\n")
        report = await failover(cluster, vs, progress, outage_s=0, **phases)
    print_failover(
        report, regions, f"act 1: failover from {FAILED_REGION} to {TAKEOVER_REGION} ({mode})"
    )
    ok = replicated and report.ok
    if args.outage_s > 0:
        async with LocalSuperCluster(regions, directory / "outage") as cluster:
            nc = await quiet_connect(cluster.servers(regions[0]))
            try:
                await apply_topology(nc, vs)
            finally:
                await close_quietly(nc)
            outage = await failover(cluster, vs, progress, outage_s=args.outage_s, **phases)
        print_failover(
            outage,
            regions,
            f"act 2: {OUTAGE_REGION} lost for {args.outage_s:g} s while consuming in "
            f"{FAILED_REGION}, then {FAILED_REGION} lost ({mode})",
        )
        ok = ok and outage.ok
    if args.failback_away_s > 0:
        ok = await failback_act(args, regions, directory, progress) and ok
    print(f"\nresult: {'OK' if ok else 'FAILED'}; total time {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


# ---- act 3: failback --------------------------------------------------------------------


async def failback_act(
    args: argparse.Namespace, regions: Sequence[str], directory: Path, progress: Progress
) -> bool:
    """West lost, consumption continued in east, west back with its application at once:
    with the guard and without, each on a fresh cluster."""
    started = time.monotonic()
    outcomes = []
    for hold_s in (None, 0.0):
        run = FailbackRun(
            home=FAILED_REGION,
            away=TAKEOVER_REGION,
            rate_per_s=args.rate,
            warm_s=args.west_seconds,
            away_s=args.failback_away_s,
            after_s=args.after_seconds,
            hold_s=hold_s,
            interval_ms=args.interval_ms,
        )
        where = directory / f"failback-{'guard' if run.guard else 'off'}"
        async with LocalSuperCluster(regions, where) as cluster:
            outcomes.append(await failback(cluster, run, progress.show))
        progress.done()
    guarded, unguarded = outcomes
    print(
        f"\nact 3: {FAILED_REGION} lost, consumed in {TAKEOVER_REGION} for "
        f"{args.failback_away_s:g} s, {FAILED_REGION} back with its application reconnecting "
        "at once (with the failback guard / without)"
    )
    print("\n".join(table(outcomes)))
    caught_up = guarded.holds["caught_up"]
    print(
        f"duplicates in {FAILED_REGION}: {guarded.duplicates} with the guard, "
        f"{unguarded.duplicates} without; lost: {guarded.lost} / {unguarded.lost}"
    )
    print(
        f"consumption in {FAILED_REGION} held {caught_up.seconds:.1f} s by its sidecar "
        f"(released caught up {caught_up.count}x); new data first delivered "
        f"{guarded.first_new_delivery_s or float('nan'):.1f} s after its servers restarted"
    )
    if not caught_up.count and not guarded.holds["expired"].count:
        early = [r for r, t in guarded.sources_heard_s.items() if t is not None and t < 20]
        print(
            f"the guard did not hold: {FAILED_REGION}'s read stream had heard from "
            f"{', '.join(early) or 'another region'} again before its sidecar first read "
            "positions, and the guard holds only a region that has heard from none "
            "(docs/protocol.md §7, detection)"
        )
    if guarded.duplicates > guarded.stale_duplicates + guarded.leading_duplicates:
        print(
            "note: what the guard leaves are messages another region consumed that lie in "
            f"{FAILED_REGION}'s read stream after one consumed nowhere: a native durable "
            "cannot skip them (docs/protocol.md §7, what it does not cover)"
        )
    ok = (
        guarded.lost == 0
        and unguarded.lost == 0
        and caught_up.count >= 1
        and guarded.holds["expired"].count == 0
        and guarded.leading_duplicates == 0
    )
    print(f"act 3: {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=300, help="replication check, per region")
    parser.add_argument("--rate", type=float, default=100, help="messages/s per producer")
    parser.add_argument("--west-seconds", type=float, default=4, help="consuming in west")
    parser.add_argument("--after-seconds", type=float, default=3, help="publishing after the loss")
    parser.add_argument("--interval-ms", type=int, default=250, help="snapshot interval")
    parser.add_argument(
        "--outage-s", type=float, default=10, help="act 2: central lost while consuming in west"
    )
    parser.add_argument("--no-outage", action="store_true", help="skip act 2")
    parser.add_argument(
        "--failback-away-s",
        type=float,
        default=8,
        help="act 3: consumed in east while west is lost",
    )
    parser.add_argument("--no-failback", action="store_true", help="skip act 3")
    parser.add_argument(
        "--pip33", action="store_true", help="sidecars with progress.enabled=false, for comparison"
    )
    parser.add_argument("--dir", type=Path, help="working directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.no_outage:
        args.outage_s = 0
    if args.no_failback:
        args.failback_away_s = 0
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
