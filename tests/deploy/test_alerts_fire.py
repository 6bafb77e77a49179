"""Every alert of the chart's PrometheusRule on real sidecars: quiet while all is well, firing
in its fault, as Prometheus evaluates the rules (`promtool test rules` on the recorded
scrapes, tests/support/promtool_alerts.py), `for:` included.

Two scenarios on real super-clusters, each recording every sidecar's /metrics from a healthy
stretch (steady traffic, cursor commits) through its faults:

- links (three regions): the durable consumed in west and east at once (consumed in two
  regions), a slow link between west and east (slow snapshots; a message of
  east before a burst of west in east's read stream, after it in west's, and west consuming
  the burst only: an exposure in east), a read stream
  sourcing a stream of no region (data of unknown origin), then central cut off (an origin
  silent, snapshots stalled and timing out);
- writers, a lost sidecar, NATS (two regions, two west replicas and a third one with
  discovery on): a malformed marker, a second west sidecar on a mistyped lease bucket (two
  leaders); east's sidecar stopped while west consumes a burst (an origin silent, snapshots
  stalled and timing out, west's mark-delete past the last snapshot it sent: the replay
  gap); west's NATS stopped (NATS down, not ready, no leader, cursor commits failing,
  discovery stale).

Both also watch for a region with no sidecar scraped (`up`, as Prometheus records it per
target): in the links scenario central, cut off, still answers (not down); east's sidecar
stopped while still a target (every scrape failing: the region down, its replica down), then
gone from the targets (no `up` of east at all: still down).

The replay gap was once reported as not growing in that fault (3 with progress, 0 PIP-33
only); re-measured at that commit (b4760cf) and on this branch, it grows with what west
consumes (106 to 110 after 100 messages, both modes). The scenario as committed then ran
no consumer while east's sidecar was stopped, so west's mark-delete stayed where it was;
and a consumer cancelled in the middle of a fetch leaves what it fetched unacked, which
holds the ack floor (the mark-delete) back for the 30 s ack wait: with the consumer
restarted here that way, 56 to 58 scrapes (28 s) passed from the writers' fault to the
gap above the threshold; with it stopped between fetches (`running_task`), 7 (3.5 s).

The exposure was once reported as out of reach here: with a delayed gateway link (0.3 s,
0.6 s) the sidecars logged `positions_read_failed` to the end of the run. On this branch
the links scenario logs none (0 in six runs, 0.6 s delay), and the exposure in east
passes the threshold while the link is slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.config.schema import Config
from sidecar.naming import VirtualStream
from tests.support.promtool_alerts import Expect, ScrapeRecorder, Target, promtool_check
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    LEASE_TTL_S,
    NOTHING_YET,
    TIMEOUT_S,
    ack_floor,
    clients,
    consume,
    create_durable,
    publish,
    publish_paced,
)

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "helm" / "rsub-sidecar"
STREAM = "orders"
DURABLE = "app"
# A durable consumed in west only to make an exposure in east (links scenario).
EXPOSED = "exposed"
EXPOSURE_BURST = 10
# The chart's thresholds at the scenarios' scale (snapshots every 0.2 s, timeout 3 s; the
# links scenario's 10 s). A snapshot of three regions on a loaded machine takes over 1 s now
# and then (two of central's 53 in one healthy stretch here, with two busy loops beside the
# test; one more under CI's load made the p99 of a window fire RsubSnapshotsSlow): the slow
# threshold is the bucket bound 2.5 s, so the p99 passes it only with a snapshot over 2.5 s.
THRESHOLDS = {
    "snapshotStalledSeconds": 2,
    "slowSnapshotSeconds": 2.5,
    "originSilentSeconds": 2,
    "replayGapMessages": 60,
    "exposureMessages": 5,
    "cursorCommitFailureRatio": 0.5,
    "discoveryStaleSeconds": 2,
}
DISCOVERY_INTERVAL_S = 0.5
# Scrapes of a healthy stretch: the longest window evaluated then (increase[15m]) is 30.
HEALTHY_SCRAPES = 32
# Messages west consumes with east's sidecar stopped: more than replayGapMessages.
BURST = 100
# The links scenario's slow link, each way, and its snapshot timeout: a snapshot of west
# crossing a delayed link takes several delays (1 to 5 s with 0.6 s; none completed within 6 s
# with 1.5 s), so 1 s puts it above the slow threshold and below the timeout.
SLOW_LINK_S = 1.0
LINKS_TIMEOUT_S = 10.0


def rules(helm_tool: ModuleType, regions: list[str]) -> Any:
    """The chart's rules for a super-cluster of `regions` (RsubRegionDown names each)."""
    values = helm_tool.load_values([CHART / "ci" / "minimal-values.yaml"])
    values["region"] = regions[0]
    values["config"]["regions"] = regions
    values["prometheusRule"] = {"enabled": True, **THRESHOLDS}
    return helm_tool.prometheus_rules(helm_tool.render(CHART, values))


def target(runtime: Service, pod: str) -> Target:
    url = f"http://127.0.0.1:{runtime.http_port}/metrics"
    return Target(f"rsub-{runtime.region}", pod, url, runtime.region)


def sidecars(cluster: LocalSuperCluster, timeout_s: float = TIMEOUT_S) -> RegionSidecars:
    # One shard: the first replica of a region leads the stream, the others stand by.
    return RegionSidecars(
        cluster,
        streams=[STREAM],
        interval_ms=INTERVAL_MS,
        timeout_s=timeout_s,
        lease_ttl_s=LEASE_TTL_S,
        lease_shards=1,
    )


@contextlib.asynccontextmanager
async def discovering(config: Config) -> AsyncIterator[Service]:
    """Another replica of the region with discovery on (matching nothing more)."""
    discovery = dataclasses.replace(
        config.discovery, enabled=True, interval_s=DISCOVERY_INTERVAL_S, match=("none-*",)
    )
    runtime = Service(dataclasses.replace(config, discovery=discovery))
    await runtime.start()
    try:
        await runtime.wait_ready(DEADLINE_S)
        yield runtime
    finally:
        await runtime.stop()


async def until(recorder: ScrapeRecorder, what: str, condition: Callable[[], bool]) -> int:
    """Wait until `condition` holds on the last scrape; that scrape's index."""

    async def holds() -> bool:
        await recorder.wait_scrapes(1)
        return condition()

    try:
        await wait_until(holds, what, DEADLINE_S)
    except TimeoutError:
        print(
            "recorded:",
            *(f"{s['series']} {s['values']}" for s in recorder.input_series()),
            sep="\n",
        )
        raise
    print(f"{what}: scrape {recorder.now}", flush=True)
    return recorder.now


def above(recorder: ScrapeRecorder, name: str, limit: float, **labels: str) -> bool:
    value = recorder.value(name, **labels)
    return value is not None and value > limit


def check(
    helm_tool: ModuleType,
    cluster: LocalSuperCluster,
    recorder: ScrapeRecorder,
    expects: list[Expect],
    tmp_path: Path,
) -> None:
    code, output = promtool_check(
        rules(helm_tool, list(cluster.regions)), recorder, expects, tmp_path
    )
    print(output)
    assert code == 0, output


@contextlib.asynccontextmanager
async def running_task(
    work: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
) -> AsyncIterator[None]:
    """Run `work` until the block ends, then ask it to stop (the event) and wait for it: never
    cancelled in the middle of a fetch, which would leave the fetched messages unacked and
    the durable's ack floor (its mark-delete) behind them until their ack wait (30 s)
    passes."""
    stop = asyncio.Event()
    task = asyncio.create_task(work(stop))
    try:
        yield
    finally:
        stop.set()
        await task


def producing(js: JetStreamContext, vs: VirtualStream) -> AbstractAsyncContextManager[None]:
    """A steady producer in west, 4 messages a second (snapshots start on new data only)."""

    async def produce(stop: asyncio.Event) -> None:
        while not stop.is_set():
            await publish(js, vs, "west", [b"steady"])
            await asyncio.sleep(0.25)

    return running_task(produce)


def consuming(
    js: JetStreamContext, vs: VirtualStream, region: str = "west"
) -> AbstractAsyncContextManager[None]:
    """A steady consumer of the durable in `region`; each fetch is acked in full: an ack
    whose confirmation times out (a loaded server) was still sent, and the rest of its fetch
    is acked after it, not left to hold the ack floor (the mark-delete) for the ack wait."""

    async def consume_steadily(stop: asyncio.Event) -> None:
        sub = await js.pull_subscribe_bind(DURABLE, stream=vs.read_stream(region))
        try:
            while not stop.is_set():
                fetched = []
                with contextlib.suppress(*NOTHING_YET):
                    fetched = await sub.fetch(10, timeout=0.5)
                for msg in fetched:
                    with contextlib.suppress(TimeoutError):
                        await msg.ack_sync(timeout=5)
        finally:
            await sub.unsubscribe()

    return running_task(consume_steadily)


async def test_alerts_of_slow_and_cut_links(
    make_cluster: ClusterFactory, helm_tool: ModuleType, tmp_path: Path
) -> None:
    cluster = await make_cluster(["west", "central", "east"])
    vs = VirtualStream(STREAM, tuple(cluster.regions))
    async with sidecars(cluster, LINKS_TIMEOUT_S) as running, clients(cluster) as nc:
        js = {r: c.jetstream() for r, c in nc.items()}
        for durable in (DURABLE, EXPOSED):
            await create_durable(js["west"], vs, "west", durable)
        await publish_paced(nc["west"], running["west"], vs, [b"w-0", b"w-1"], batch=2)
        for durable in (DURABLE, EXPOSED):
            await consume(js["west"], vs, "west", durable, 2)

        async def in_east() -> bool:
            floors = [await ack_floor(js["east"], vs, "east", d) for d in (DURABLE, EXPOSED)]
            return min(floors) >= 0

        await wait_until(in_east, "the durables to reach east", DEADLINE_S)
        recorder = ScrapeRecorder([target(running[r], f"{r}-0") for r in cluster.regions])
        async with recorder.recording(), producing(js["west"], vs):
            async with consuming(js["west"], vs):
                healthy = await recorder.wait_scrapes(HEALTHY_SCRAPES)
                # The application started in east as well: the durable consumed in two
                # regions at once, for longer than the alert's `for:` (4 scrapes).
                async with consuming(js["east"], vs, "east"):
                    await until(
                        recorder,
                        "the durable consumed in two regions",
                        lambda: all(
                            above(
                                recorder,
                                "rsub_subscription_consumed_in_regions",
                                1,
                                job=f"rsub-{region}",
                                subscription=DURABLE,
                            )
                            for region in ("west", "east")
                        ),
                    )
                    two = await recorder.wait_scrapes(6)

            # Slow link between west and east: each snapshot waits for delayed trips.
            await cluster.set_link_delay("west", "east", SLOW_LINK_S)
            duration = "rsub_snapshot_duration_seconds"

            def slow_ones() -> float:
                """West's snapshots that took over the slow threshold (2.5 s) so far. Counted,
                not told apart from a count of fast ones taken earlier: the last scrape may
                precede a fast snapshot still completing as the delay comes in (which once
                made this wait in vain)."""
                count = recorder.value(f"{duration}_count", job="rsub-west") or 0
                return count - (
                    recorder.value(f"{duration}_bucket", job="rsub-west", le="2.5") or 0
                )

            slow_before = slow_ones()
            slow = await until(
                recorder, "slow snapshots in west", lambda: slow_ones() > slow_before + 2
            )
            # Still slow: e-0 lies before a burst of west in east's read stream, after it in
            # west's; west consumes the burst (not e-0), so east's EXPOSED cannot pass e-0 and
            # the burst, covered by west's vector, lies above it (the exposure).
            await publish(js["east"], vs, "east", [b"e-0"])
            burst = [b"exposed-%d" % i for i in range(EXPOSURE_BURST)]
            await publish(js["west"], vs, "west", burst)
            await consume_through(js["west"], vs, EXPOSED, burst[-1])
            exposed = await until(
                recorder,
                "an exposure in east",
                lambda: above(
                    recorder,
                    "rsub_failover_exposure_messages",
                    THRESHOLDS["exposureMessages"],
                    job="rsub-east",
                    subscription=EXPOSED,
                ),
            )
            await cluster.set_link_delay("west", "east", 0)

            # Data of no region in west's read stream.
            await add_rogue_source(nc["west"], vs)
            rogue = await until(
                recorder,
                "data of no region in west",
                lambda: above(recorder, "rsub_data_unknown_origin_total", 0, job="rsub-west"),
            )

            # Central cut off: no snapshot of west completes.
            for other in ("west", "east"):
                await cluster.cut_link("central", other)
            timed_out = recorder.value("rsub_snapshots_timed_out_total", job="rsub-west") or 0
            await until(
                recorder,
                "west to see the cut",
                lambda: (
                    above(recorder, "rsub_snapshots_timed_out_total", timed_out, job="rsub-west")
                    and above(recorder, "rsub_origin_last_marker_age_seconds", 2, job="rsub-west")
                    and above(recorder, "rsub_last_snapshot_age_seconds", 2, job="rsub-west")
                ),
            )
            cut = await recorder.wait_scrapes(2)

    west = {"job": "rsub-west", "stream": STREAM}
    check(
        helm_tool,
        cluster,
        recorder,
        [
            Expect(healthy),  # no alert at all, not even pending
            *(
                Expect(two, "RsubConsumedInTwoRegions", {**labels, "subscription": DURABLE})
                for labels in (west, {"job": "rsub-east", "stream": STREAM})
            ),
            # East stopped: it no longer counts ten intervals after its last ack.
            Expect(
                slow,
                "RsubConsumedInTwoRegions",
                {**west, "subscription": DURABLE},
                fires=False,
            ),
            Expect(slow, "RsubSnapshotsSlow", west),
            Expect(
                exposed,
                "RsubFailoverExposureHigh",
                {"job": "rsub-east", "stream": STREAM, "subscription": EXPOSED},
            ),
            Expect(rogue, "RsubDataOfUnknownOrigin", west),
            Expect(cut, "RsubOriginSilent", {**west, "origin": "central"}),
            Expect(cut, "RsubSnapshotsStalled", west),
            Expect(cut, "RsubSnapshotsTimingOut", west),
            # Only central is silent: east's markers still reach west, slowly.
            Expect(cut, "RsubOriginSilent", {**west, "origin": "east"}, fires=False),
            # Cut off, not down: Prometheus still scrapes central's sidecar.
            Expect(cut, "RsubRegionDown", {"rsub_region": "central"}, fires=False),
        ],
        tmp_path,
    )


async def consume_through(
    js: JetStreamContext, vs: VirtualStream, durable: str, last: bytes
) -> None:
    """Fetch and ack `durable`'s messages in west up to the one carrying `last`; those after
    it in a fetch are left unacked (the ack floor stays on `last`)."""
    sub = await js.pull_subscribe_bind(durable, stream=vs.read_stream("west"))
    done: list[bool] = []

    async def reached() -> bool:
        with contextlib.suppress(*NOTHING_YET):
            for msg in await sub.fetch(10, timeout=0.5):
                if done:
                    break
                await msg.ack_sync(timeout=5)
                if msg.data == last:
                    done.append(True)
        return bool(done)

    await wait_until(reached, f"{durable} in west through {last!r}", DEADLINE_S)
    await sub.unsubscribe()


async def add_rogue_source(nc: Client, vs: VirtualStream) -> None:
    """West's read stream also sources `rogue`, a stream of no region, into the data subjects
    (a misconfiguration by hand, through the JetStream API)."""
    js = nc.jetstream()
    await js.add_stream(name="rogue", subjects=["rogue.>"])
    read = vs.read_stream("west")
    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{read}", b"", timeout=5)).data)
    config = info["config"]
    config["sources"].append(
        {"name": "rogue", "subject_transforms": [{"src": "rogue.>", "dest": f"{STREAM}.>"}]}
    )
    answer = await nc.request(f"$JS.API.STREAM.UPDATE.{read}", json.dumps(config).encode(), 5)
    assert "error" not in json.loads(answer.data), answer.data
    await js.publish("rogue.item", b"from nowhere", stream="rogue")


@contextlib.asynccontextmanager
async def committing(runtime: Service) -> AsyncIterator[list[grpc.StatusCode]]:
    """Commits the external cursor `spark` (at 0) through `runtime`'s gRPC API, as a Spark
    query would, twice a second until the block ends; yields their outcomes."""
    outcomes: list[grpc.StatusCode] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runtime.grpc_port}") as channel:
        stub = api_pb2_grpc.CursorServiceStub(channel)

        async def commit() -> None:
            try:
                await stub.CommitCursor(
                    api_pb2.CommitCursorRequest(stream=STREAM, subscription="spark"), timeout=2
                )
                outcomes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as error:
                outcomes.append(error.code())

        async def loop() -> None:
            while True:
                await commit()
                await asyncio.sleep(0.5)

        task = asyncio.create_task(loop())
        try:
            yield outcomes
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_alerts_of_bad_writers_a_lost_sidecar_and_nats_down(
    make_cluster: ClusterFactory, helm_tool: ModuleType, tmp_path: Path
) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream(STREAM, ("west", "east"))
    running = sidecars(cluster)
    async with (
        running,
        running.replica("west", serve=True) as follower,
        discovering(running.config("west")) as watcher,
        clients(cluster) as nc,
        committing(running["west"]) as commits,
    ):
        west, js = running["west"], nc["west"].jetstream()
        await create_durable(js, vs, "west", DURABLE)

        async def committed() -> bool:
            return grpc.StatusCode.OK in commits

        await wait_until(committed, "a first cursor commit", DEADLINE_S)
        recorder = ScrapeRecorder(
            [
                target(west, "west-0"),
                target(follower, "west-1"),
                target(watcher, "west-3"),
                target(running["east"], "east-0"),
            ]
        )
        async with recorder.recording():
            async with producing(js, vs):
                async with consuming(js, vs):
                    healthy = await recorder.wait_scrapes(HEALTHY_SCRAPES)

                # Bad writers: a second leader (a sidecar on a mistyped lease bucket), a
                # malformed marker.
                config = running.config("west")
                typo = dataclasses.replace(config.lease, bucket=f"{config.lease.bucket}-typo")
                rogue = Service(dataclasses.replace(config, lease=typo))
                await rogue.start()
                try:
                    await rogue.wait_ready(DEADLINE_S)
                    recorder.add(target(rogue, "west-2"))
                    await js.publish(
                        vs.marker_subject("west"), b"not a marker", stream=vs.write_stream("west")
                    )
                    await until(
                        recorder,
                        "the rejected marker and two leaders in west",
                        lambda: (
                            above(recorder, "rsub_markers_rejected_total", 0, reason="malformed")
                            and above(recorder, "rsub_leader", 1, job="rsub-west")
                        ),
                    )
                    writers = await recorder.wait_scrapes(3)  # two leaders for 1m
                finally:
                    recorder.remove("west-2")
                    await rogue.stop()

                # East's sidecar is gone, its pod still a target whose scrapes fail (a killed
                # sidecar; the region down): no snapshot of west completes, so no update with
                # a snapshot part is sent while west consumes a burst (the replay gap grows).
                await running.stop("east")
                east_stopped = recorder.now
                timed_out = recorder.value("rsub_snapshots_timed_out_total", job="rsub-west") or 0
                gap = "rsub_subscription_replay_gap_messages"
                async with consuming(js, vs):
                    await publish(js, vs, "west", [b"burst"] * BURST)
                    await until(
                        recorder,
                        "west's snapshots to time out and its replay gap to grow",
                        lambda: (
                            above(
                                recorder, "rsub_snapshots_timed_out_total", timed_out, pod="west-0"
                            )
                            and above(
                                recorder, "rsub_origin_last_marker_age_seconds", 2, pod="west-0"
                            )
                            and above(recorder, "rsub_last_snapshot_age_seconds", 2, pod="west-0")
                            and above(recorder, gap, THRESHOLDS["replayGapMessages"], pod="west-0")
                        ),
                    )
                    # RsubSidecarDown's 5m: 10 scrapes after the first failed one.
                    alone = await recorder.wait_scrapes(max(2, east_stopped + 12 - recorder.now))

            # East's pod is gone from the targets too: no `up` series of east at all.
            recorder.remove("east-0")
            # West's NATS is down: both west replicas stay up, disconnected.
            await cluster.stop_region("west")
            try:
                unready = await until(
                    recorder,
                    "west's replicas to lose readiness",
                    lambda: recorder.value("rsub_ready", job="rsub-west") == 0,
                )
                await until(
                    recorder,
                    "west's replicas to lose NATS and the lead",
                    lambda: (
                        recorder.value("rsub_nats_connected", job="rsub-west") == 0
                        and recorder.value("rsub_leader", job="rsub-west") == 0
                        and above(recorder, "rsub_discovery_last_round_age_seconds", 2)
                    ),
                )
                nats_down = await recorder.wait_scrapes(12)  # not ready for 5m, and more
            finally:
                await cluster.start_region("west")
    assert grpc.StatusCode.UNAVAILABLE in commits[-5:], commits[-5:]

    west_job = {"job": "rsub-west"}
    replicas = [{**west_job, "pod": pod} for pod in ("west-0", "west-1")]
    check(
        helm_tool,
        cluster,
        recorder,
        [
            Expect(healthy),
            *(
                Expect(writers, "RsubMarkersRejected", {"job": job, "reason": "malformed"})
                for job in ("rsub-west", "rsub-east")
            ),
            Expect(writers, "RsubTwoLeaders", west_job),
            Expect(alone, "RsubOriginSilent", {"pod": "west-0", "origin": "east"}),
            Expect(alone, "RsubSnapshotsStalled", {"pod": "west-0"}),
            Expect(alone, "RsubSnapshotsTimingOut", {"pod": "west-0"}),
            Expect(
                alone,
                "RsubReplayGapHigh",
                {"pod": "west-0", "subscription": DURABLE, "region": "east"},
            ),
            # The follower reads the same markers: the origin is silent there too.
            Expect(alone, "RsubOriginSilent", {"pod": "west-1", "origin": "east"}),
            # East's one sidecar does not answer: the region is down.
            Expect(alone, "RsubRegionDown", {"rsub_region": "east"}),
            Expect(alone, "RsubSidecarDown", {"job": "rsub-east", "pod": "east-0"}),
            Expect(alone, "RsubRegionDown", {"rsub_region": "west"}, fires=False),
            # Then no target of east is left: still down; no replica of it to report.
            Expect(nats_down, "RsubRegionDown", {"rsub_region": "east"}),
            Expect(nats_down, "RsubSidecarDown", {"job": "rsub-east"}, fires=False),
            # West's replicas answer scrapes while their NATS is down.
            Expect(nats_down, "RsubRegionDown", {"rsub_region": "west"}, fires=False),
            *(Expect(nats_down, "RsubNatsDown", labels) for labels in replicas),
            *(Expect(nats_down, "RsubNotReady", labels) for labels in replicas),
            # `for: 5m`: pending, not firing, when readiness was first seen lost.
            *(Expect(unready, "RsubNotReady", labels, fires=False) for labels in replicas),
            Expect(nats_down, "RsubNoLeader", west_job),
            Expect(nats_down, "RsubDiscoveryStale", {**west_job, "pod": "west-3"}),
            Expect(nats_down, "RsubCursorCommitsFailing", {**west_job, "stream": STREAM}),
            Expect(nats_down, "RsubCursorCommitsFailing", {"job": "rsub-east"}, fires=False),
        ],
        tmp_path,
    )
