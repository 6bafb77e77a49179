"""Issue 23, item 1 on real servers: the failback guard (docs/protocol.md §7).

Three regions, producers in each, the replicated durable `billing` consumed in west. All of
west is lost (application, servers, sidecar); the application continues in east for
`AWAY_S`, then stops; west's servers restart from their store, its sidecar restarts, and the
application in west reconnects as soon as west's JetStream answers, racing the sidecar
(`rsub_dev.failback`). Once with the guard (the default `failback.hold_s`), once without
(`failback.hold_s: 0`), each on a cluster of its own.

Scaled down from the issue's runs (300 msg/s, 15 s and 45 s away: `bench/bench_failback.py`)
to 100 msg/s and 8 s away, to stay within about three minutes on a loaded 2-core machine.
JetStream resumes sourcing into west's read stream only 30-45 s after the restart, so each
run lasts about a minute whatever the scale.

Also: restarting the sidecar of a healthy region never holds its durables.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial

import pytest

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.failback import DURABLE, STREAM, FailbackOutcome, FailbackRun, failback
from rsub_dev.sidecars import RegionSidecars, wait_until
from rsub_dev.workload import Workload
from sidecar.naming import VirtualStream
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound
from tests.support.scenario_kit import (
    DEADLINE_S,
    INTERVAL_MS,
    LEASE_TTL_S,
    TIMEOUT_S,
    clients,
    create_durable,
    metric,
)

pytestmark = pytest.mark.integration

REGIONS = ("west", "central", "east")
RATE_PER_S = 100.0
AWAY_S = 8.0
AFTER_S = 5.0

_OUTCOMES: dict[bool, FailbackOutcome] = {}


async def outcome(make_cluster: ClusterFactory, *, guard: bool) -> FailbackOutcome:
    """The run with or without the guard (once per test session)."""
    if guard not in _OUTCOMES:
        run = FailbackRun(
            home="west",
            away="east",
            rate_per_s=RATE_PER_S,
            warm_s=2.0,
            away_s=AWAY_S,
            after_s=AFTER_S,
            hold_s=None if guard else 0,
            interval_ms=INTERVAL_MS,
            timeout_s=TIMEOUT_S,
            lease_ttl_s=LEASE_TTL_S,
        )
        _OUTCOMES[guard] = await failback(await make_cluster(list(REGIONS)), run)
    return _OUTCOMES[guard]


def describe(got: FailbackOutcome) -> str:
    holds = ", ".join(f"{o} {h.count} ({h.seconds:.1f} s)" for o, h in got.holds.items())
    return (
        f"{'guard' if got.run.guard else 'no guard'}: {got.consumed_away} consumed in east; "
        f"duplicates in west {got.duplicates} (stale {got.stale_duplicates}, leading "
        f"{got.leading_duplicates}), other {got.other_duplicates}, lost {got.lost}; first "
        f"delivery {got.first_delivery_s} s, first new {got.first_new_delivery_s} s, sidecar "
        f"ready {got.sidecar_ready_s:.1f} s, held {got.held_s} s (covered run after it "
        f"{got.covered_after_hold}), sources heard {got.sources_heard_s}; holds {holds}"
    )


@pytest.mark.timeout(150)
async def test_the_guard_holds_west_until_caught_up_and_skips_what_east_consumed(
    make_cluster: ClusterFactory,
) -> None:
    got = await outcome(make_cluster, guard=True)
    print(f"\n{describe(got)}")
    assert got.lost == 0
    assert got.holds["caught_up"].count == 1
    assert got.holds["expired"].count == 0
    assert got.held_durables == 0
    # Claim 3: once held, west delivers nothing of the covered run east consumed. JetStream
    # resumes a source 30-45 s after the restart as a rule, long after the hold; now and then
    # it resumes one at once (east heard 6.2 s after the restart in a CI run on a loaded
    # machine, west's sidecar ready at 12.1 s): an application reconnecting at once is then
    # delivered that source's covered run before any sidecar could hold it (docs/protocol.md
    # §7, "What it does not cover": the hold starts at the first listing of the sidecar's new
    # leader). So the harness times the hold (its pause seen on west's durable) and the
    # claim is checked on what the covered run delivered after it, whatever the sources did.
    assert got.held_s is not None
    assert got.covered_after_hold == 0
    assert got.first_new_delivery_s is not None


@pytest.mark.timeout(240)
async def test_without_the_guard_nothing_is_lost_and_nothing_held(
    make_cluster: ClusterFactory,
) -> None:
    got = await outcome(make_cluster, guard=False)
    print(f"\n{describe(got)}")
    assert got.lost == 0
    assert all(h.count == 0 for h in got.holds.values())
    assert got.held_s is None and got.covered_after_hold is None
    guarded = await outcome(make_cluster, guard=True)
    # Not asserted: fewer duplicates in total with the guard. What it leaves (messages of
    # another region's backlog lying after new ones in west's read stream) varies with the
    # order JetStream sources the backlogs in, and so does what the sidecar moves over
    # without the guard: runs gave 146 against 247 (this scale), but 463 against 378 (at
    # 50 msg/s).
    print(f"guard {guarded.duplicates}, no guard {got.duplicates}")


async def vector_sent(runtime: Runtime) -> bool:
    """Whether `runtime`'s leader read the durable's position and sent a vector."""
    try:
        view = await runtime.get_subscription(STREAM, DURABLE)
    except NotFound:
        return False
    return view.progress_sent_position > 0


@pytest.mark.timeout(120)
async def test_a_sidecar_restart_in_a_healthy_region_holds_nothing(
    cluster2: LocalSuperCluster,
) -> None:
    cluster = cluster2
    vs = VirtualStream(STREAM, tuple(cluster.regions))
    async with (
        RegionSidecars(
            cluster,
            streams=[STREAM],
            interval_ms=INTERVAL_MS,
            timeout_s=TIMEOUT_S,
            lease_ttl_s=LEASE_TTL_S,
        ) as sidecars,
        clients(cluster) as nc,
    ):
        js = nc["west"].jetstream()
        await create_durable(js, vs, "west", DURABLE)
        async with Workload(nc, vs, 50.0, (DURABLE,)) as work:
            work.consume_in(nc["west"], "west")
            consumer = work.consumers[DURABLE]

            await wait_until(partial(vector_sent, sidecars["west"]), "a vector", DEADLINE_S)
            paused: list[bool] = []

            async def watch() -> None:
                while True:
                    info = await js.consumer_info(vs.read_stream("west"), DURABLE)
                    paused.append(bool(info.paused))
                    await asyncio.sleep(0.05)

            watching = asyncio.create_task(watch())
            try:
                await sidecars.stop("west")
                restarted = time.monotonic()
                runtime = await sidecars.start("west")
                await sidecars.wait_leaders()
                delivered = len(consumer.deliveries)

                # The new leader read positions and sent a vector past what it found.
                async def read_again() -> bool:
                    more = len(consumer.deliveries) > delivered + 100
                    return more and await vector_sent(runtime)

                await wait_until(read_again, "west's new leader sending vectors", DEADLINE_S)
                await asyncio.sleep(1.0)
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
            print(
                f"\nrestart: {len(paused)} CONSUMER.INFO reads over "
                f"{time.monotonic() - restarted:.1f} s, paused in {sum(paused)}"
            )
            assert paused and not any(paused)
            assert await metric(runtime, "rsub_failback_held_durables") == 0
            assert await metric(runtime, "rsub_failback_hold_seconds_count") == 0
