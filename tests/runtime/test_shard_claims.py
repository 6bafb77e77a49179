"""A replica that joins claims no shard before it has rebuilt every stream (a new pod of a
rolling upgrade): the replica that leads keeps every stream meanwhile, on real servers."""

from __future__ import annotations

import asyncio

import pytest

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import READY_TIMEOUT_S, RegionSidecars, wait_until
from sidecar.runtime import Runtime
from tests.support.held_rebuilds import hold_rebuilds

pytestmark = pytest.mark.integration

STREAMS = tuple(f"tenant-{i:02d}" for i in range(30))
LEASE_TTL_S = 3.0


def led_by(runtime: Runtime) -> set[str]:
    return {s for s in STREAMS if runtime.leadership(s).leader}


async def test_a_joining_replica_leads_nothing_until_its_streams_are_rebuilt(
    cluster2: LocalSuperCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sidecars = RegionSidecars(cluster2, streams=STREAMS, regions=["west"], lease_ttl_s=LEASE_TTL_S)
    async with sidecars:
        first = sidecars["west"]
        gate = hold_rebuilds(monkeypatch)
        joining = Runtime(sidecars.config("west"))
        await joining.start()
        try:

            async def rebuilding() -> bool:
                return joining.readiness.missing() == ["streams"]

            await wait_until(rebuilding, "the joining replica's first lease round", 30)
            # Rounds every ttl/3: in two ttls the first replica would have seen a member and
            # released its excess, and the joining one taken it.
            await asyncio.sleep(2 * LEASE_TTL_S)
            assert led_by(joining) == set()
            assert led_by(first) == set(STREAMS)

            gate.set()
            await joining.wait_ready(READY_TIMEOUT_S)

            async def shared() -> bool:
                mine, theirs = led_by(joining), led_by(first)
                return bool(mine) and bool(theirs) and mine | theirs == set(STREAMS)

            await wait_until(shared, "the streams shared by both replicas", 6 * LEASE_TTL_S)
            assert not led_by(joining) & led_by(first)
        finally:
            gate.set()
            await joining.stop()
