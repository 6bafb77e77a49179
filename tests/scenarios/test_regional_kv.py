"""The region's KV bucket (leases, members, cursors) survives the loss of one server.

Chaos seed 7 (docs/reliability.md, Findings): the bucket was R1, on one server of three;
killing that server made every lease step fail, the sidecar lost its leadership for 8 s and
`CommitCursor` failed in the region. Here, on a three-server region with R3 streams, the
server that leads the bucket is killed and stays down: the sidecar leads again once the
bucket has elected another leader, and cursors are committed. With an R1 bucket on that
server neither happens until it is back.
"""

from __future__ import annotations

import nats
import pytest

from rsub_dev.cluster import ClusterFactory
from rsub_dev.sidecars import READY_TIMEOUT_S, sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.runtime import Runtime
from sidecar.runtime.errors import Unavailable

pytestmark = pytest.mark.integration

STREAM = "orders"
TTL_S = 3.0


async def test_the_sidecar_leads_and_commits_cursors_while_the_buckets_leader_is_down(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(["west"], servers_per_region=3)
    settings = sidecar_settings(cluster, "west", streams=[STREAM], lease_ttl_s=TTL_S)
    settings["streams"] = [{"name": STREAM, "replicas": 3}]
    runtime = Runtime(config_from_mapping(settings))
    nc = await nats.connect(cluster.servers("west"))
    try:
        await runtime.start()
        await runtime.wait_ready(READY_TIMEOUT_S)

        async def leads() -> bool:
            return runtime.leadership(STREAM).leader

        await wait_until(leads, "west leads", READY_TIMEOUT_S)
        js = nc.jetstream()
        info = await js.stream_info("KV_rsub-leases-west")
        # Without a lease.replicas setting: as many as the cluster places, up to 3.
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader is not None
        for _ in range(3):
            await js.publish(f"{STREAM}.west.item", b"x", stream=f"{STREAM}-write-west")

        async def sourced() -> bool:  # a cursor is committed within the read stream only
            return (await js.stream_info(f"{STREAM}-read-west")).state.last_seq >= 3

        await wait_until(sourced, "the data in west's read stream", READY_TIMEOUT_S)
        assert await runtime.commit_cursor(STREAM, "spark", 1) == 1

        # The server leading the bucket is lost.
        await cluster.stop_server("west", int(info.cluster.leader.rsplit("-", 1)[1]))

        async def committed() -> bool:
            try:
                return await runtime.commit_cursor(STREAM, "spark", 2) == 2
            except Unavailable:
                return False

        await wait_until(committed, "a cursor committed with the bucket's former leader down", 60)
        # And it leads (a lease step fails while the bucket elects a new leader,
        # which takes longer than this short TTL) with that server still down.
        await wait_until(leads, "west leads with the bucket's former leader down", 60)
    finally:
        await runtime.stop()
        await nc.close()
