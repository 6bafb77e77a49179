"""A sidecar must stop cleanly when its region's NATS is gone (what the failover demo does:
the whole region is lost, then its sidecar is stopped)."""

from __future__ import annotations

import pytest

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars

pytestmark = pytest.mark.integration


async def test_stop_after_the_region_died_does_not_raise(cluster2: LocalSuperCluster) -> None:
    cluster = cluster2
    async with RegionSidecars(cluster, interval_ms=200, timeout_s=3) as sidecars:
        west = sidecars["west"]
        await cluster.stop_region("west")
        await sidecars.stop("west")
        assert not west.readiness.connected
