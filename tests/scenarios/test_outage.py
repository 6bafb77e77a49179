"""Issue 10 on real servers: a region lost for a while, then the consuming region lost too.

Three regions. Durables `native` and `exact` are created in west and consumed there in step
while producers publish in every region. Central is lost (servers killed, sidecar stopped)
and west goes on consuming for `OUTAGE_S` (the issue measured 20 s; 8 s keeps this file
within about three minutes on a loaded 2-core machine). Then the application in west fails
(consumption stops), east's sidecar receives west's last progress vector, and west is lost.
Both durables continue in east, `native` natively and `exact` through the exact client with
the vector read from east's sidecar, while east's producer goes on for a while.

With progress vectors nothing is lost, `exact` receives nothing twice, and `native` at most
the exposure east reported before the loss (docs/protocol.md §6). With PIP-33 alone nothing
is lost either, but no snapshot completes without central, so `native` receives again about
everything consumed during the outage. Each run has a cluster of its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from rsub_dev.cluster import ClusterFactory
from rsub_dev.sidecars import RegionSidecars, wait_until
from rsub_dev.workload import ReadStreamLedger, Workload, lose_region, wait_settled
from sidecar.exact import progress_of
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
)

pytestmark = pytest.mark.integration

STREAM = "orders"
REGIONS = ("west", "central", "east")
NATIVE, EXACT = "native", "exact"
RATE_PER_S = 50.0
WARM_UP_S = 2.0
OUTAGE_S = 8.0
AFTER_S = 2.0
# For the last SPIKE_S of consumption in west, the link between west and east is that slow:
# east then holds messages west consumed after the first east message west had not received,
# so the exposure is not 0 (on 127.0.0.1 without it, it is 0-2 and the test could not tell
# the exact client from a plain one). Only a spike: with a down region, every consumer move
# needs the two remaining regions' JetStream meta group, and a latency for the whole outage
# makes east's sidecar fall behind the vectors it receives.
SPIKE_S = 0.5
SETTLED_S = 5 * INTERVAL_MS / 1000


@dataclass(frozen=True)
class Outcome:
    lost: dict[str, int]
    duplicates: dict[str, int]
    exposure: int | None
    """East's `failover_exposure` of `native` before the loss of west."""
    outage_consumed: int
    """Messages `native` consumed in west while central was down."""


_OUTCOMES: dict[bool, Outcome] = {}


async def in_east(east: Runtime) -> bool:
    """Whether east's sidecar knows both durables (an update from west created them)."""
    for durable in (NATIVE, EXACT):
        try:
            await east.get_subscription(STREAM, durable)
        except NotFound:
            return False
    return True


async def final_vectors_in_east(sidecars: RegionSidecars, work: Workload) -> None:
    """Wait until west sent the vector of each durable's last position and east has it.

    West may send more than one vector at that position: a vector covers what west's sidecar
    has indexed of its read stream, which can be behind the position (on a loaded machine it
    is), and a fuller one follows once the index caught up. So what east must hold is the
    vector west sent last, read again at each check, not the first one at the position."""
    west, east = sidecars["west"], sidecars["east"]
    for durable, consumer in work.consumers.items():
        last = max(d.read_seq for d in consumer.in_region("west"))

        async def received(durable: str = durable, last: int = last) -> bool:
            sent = await west.get_subscription(STREAM, durable)
            held = (await east.get_subscription(STREAM, durable)).progress
            return sent.progress_sent_position >= last and dict(held) == dict(sent.progress_sent)

        await wait_until(received, f"west's last vector of {durable} at {last} in east", DEADLINE_S)


def consumed_by_all(work: Workload, expected: set[bytes]) -> bool:
    return all(not c.missing(expected) for c in work.consumers.values())


async def outage(make_cluster: ClusterFactory, *, progress: bool) -> Outcome:
    cluster = await make_cluster(list(REGIONS))
    vs = VirtualStream(STREAM, REGIONS)
    async with (
        RegionSidecars(
            cluster,
            streams=[STREAM],
            interval_ms=INTERVAL_MS,
            timeout_s=TIMEOUT_S,
            lease_ttl_s=LEASE_TTL_S,
            progress=progress,
        ) as sidecars,
        clients(cluster) as nc,
    ):
        for durable in (NATIVE, EXACT):
            await create_durable(nc["west"].jetstream(), vs, "west", durable)
        ledger = await ReadStreamLedger.open(nc["east"], vs, "east")
        async with Workload(nc, vs, RATE_PER_S, (NATIVE, EXACT)) as work:
            work.consume_in(nc["west"], "west")
            started = time.monotonic()

            async def warm() -> bool:
                return time.monotonic() - started >= WARM_UP_S and await in_east(sidecars["east"])

            await wait_until(warm, "both durables in east", DEADLINE_S)
            await lose_region(cluster, sidecars, work, nc, "central")
            before_outage = len(work.consumers[NATIVE].deliveries)
            await asyncio.sleep(OUTAGE_S - SPIKE_S)
            await cluster.set_link_delay("west", "east", SPIKE_S)
            await asyncio.sleep(SPIKE_S)

            # The application in west fails first; west's last vectors reach east.
            await work.stop_consuming()
            await cluster.set_link_delay("west", "east", 0)
            outage_consumed = len(work.consumers[NATIVE].deliveries) - before_outage
            if progress:
                await final_vectors_in_east(sidecars, work)
            # Central is gone: what east holds of it is all it will ever hold.
            from_west_or_east = {
                d.payload
                for c in work.consumers.values()
                for d in c.deliveries
                if not d.payload.startswith(b"central-")
            }
            await ledger.holding(from_west_or_east, "east to hold what west consumed", DEADLINE_S)
            views = await wait_settled(sidecars["east"], STREAM, (NATIVE, EXACT), SETTLED_S)
            exposure = views[NATIVE].failover_exposure
            await lose_region(cluster, sidecars, work, nc, "west")

            vector = await progress_of(f"127.0.0.1:{sidecars['east'].grpc_port}", STREAM, EXACT)
            work.consume_in(nc["east"], "east", {EXACT: vector})
            await asyncio.sleep(AFTER_S)
            work.stop_producer("east")
            # What east can ever deliver: everything its read stream holds.
            own = set(work.producers["east"].confirmed)
            expected = await ledger.holding(own, "east's own messages in east", DEADLINE_S)

            async def consumed() -> bool:
                return consumed_by_all(work, expected)

            await wait_until(consumed, "every message east holds consumed", DEADLINE_S)
            await work.stop_consuming()
            consumers = work.consumers
            return Outcome(
                lost={d: len(c.missing(expected)) for d, c in consumers.items()},
                duplicates={d: c.duplicates() for d, c in consumers.items()},
                exposure=exposure,
                outage_consumed=outage_consumed,
            )


async def outcome(make_cluster: ClusterFactory, *, progress: bool) -> Outcome:
    """The run with or without progress vectors (once per test session)."""
    if progress not in _OUTCOMES:
        _OUTCOMES[progress] = await outage(make_cluster, progress=progress)
    return _OUTCOMES[progress]


@pytest.mark.timeout(150)
async def test_after_an_outage_vectors_bound_native_duplicates_and_exact_gets_none(
    make_cluster: ClusterFactory,
) -> None:
    got = await outcome(make_cluster, progress=True)
    print(
        f"\nvectors: {got.outage_consumed} consumed in west during the outage; duplicates "
        f"native {got.duplicates[NATIVE]} (exposure before the loss {got.exposure}), "
        f"exact {got.duplicates[EXACT]}"
    )
    assert got.lost == {NATIVE: 0, EXACT: 0}
    assert got.duplicates[EXACT] == 0
    assert got.exposure is not None
    assert got.duplicates[NATIVE] <= got.exposure


@pytest.mark.timeout(240)
async def test_pip33_alone_delivers_the_outage_again_and_vectors_do_better(
    make_cluster: ClusterFactory,
) -> None:
    got = await outcome(make_cluster, progress=False)
    print(
        f"\nPIP-33 only: {got.outage_consumed} consumed in west during the outage; duplicates "
        f"native {got.duplicates[NATIVE]}, exact {got.duplicates[EXACT]} (no vector to skip by)"
    )
    assert got.lost == {NATIVE: 0, EXACT: 0}
    vectors = await outcome(make_cluster, progress=True)
    assert vectors.duplicates[NATIVE] < got.duplicates[NATIVE]
