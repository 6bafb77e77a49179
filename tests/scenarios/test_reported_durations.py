"""The snapshot durations the sidecar reports (ListSnapshots `duration_ms`, the
`rsub_snapshot_duration_seconds` histogram) against the stored markers' timestamps."""

from __future__ import annotations

import pytest

from rsub_dev.cluster import ClusterFactory
from rsub_dev.sidecars import RegionSidecars, read_markers, snapshot_latencies_ms
from sidecar.naming import VirtualStream
from tests.support.scenario_kit import clients, create_durable, publish, snapshot_past_data

pytestmark = pytest.mark.integration

DELAY_S = 0.2
# Far longer than a snapshot takes here, so no tick falls between its start and its end.
INTERVAL_MS = 5000


async def test_reported_duration_matches_the_stored_markers(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(["west", "east"])
    vs = VirtualStream("orders", ("west", "east"))
    async with (
        RegionSidecars(cluster, interval_ms=INTERVAL_MS, timeout_s=30) as sidecars,
        clients(cluster) as nc,
    ):
        await cluster.set_link_delay("west", "east", DELAY_S)
        west = sidecars["west"]
        await create_durable(nc["west"].jetstream(), vs, "west", "app")
        await publish(nc["west"].jetstream(), vs, "west", [b"one"])
        await snapshot_past_data(nc["west"], west, vs)
        stored = snapshot_latencies_ms(await read_markers(nc["west"], vs, "west"), "west")
        reported = {s.id: s.duration_ms for s in await west.list_snapshots("orders")}
        for snapshot_id, stored_ms in stored.items():
            # One delayed round trip at least; the report agrees with what was stored.
            assert stored_ms >= 2 * DELAY_S * 1000
            assert abs(reported[snapshot_id] - stored_ms) < 2 * DELAY_S * 1000 / 4
