"""A cut gateway link stalls sourcing between two regions; after the restore every read
stream converges with nothing lost and nothing doubled."""

from __future__ import annotations

import nats
import pytest
from nats.aio.client import Client

from rsub_dev.cluster import ClusterFactory
from rsub_dev.sidecars import wait_until
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology
from tests.support.topology_helpers import check_converged, message_count, publish_many

pytestmark = pytest.mark.integration

BASE = 100
SPLIT = 300
# Sourcing resumes 30-45 s after a link comes back (the server's retry back-off).
RESUME_S = 120


async def wait_total(nc: Client, stream: str, total: int, deadline_s: float) -> None:
    async def full() -> bool:
        return await message_count(nc, stream) >= total

    await wait_until(full, f"{stream} to hold {total} messages", deadline_s, poll_s=0.5)


async def test_cut_link_then_restore_converges(make_cluster: ClusterFactory) -> None:
    cluster3 = await make_cluster(["west", "central", "east"])  # proxied links
    vs = VirtualStream("evt", ("west", "central", "east"))
    ncs = {r: await nats.connect(cluster3.servers(r)) for r in vs.regions}
    try:
        await apply_topology(ncs["west"], vs)
        for r in vs.regions:
            await publish_many(ncs[r], [vs.publish_subject(r, "a")], 0, BASE)
        for r in vs.regions:
            await wait_total(ncs[r], vs.read_stream(r), 3 * BASE, 60)

        await cluster3.cut_link("west", "east")
        for r in vs.regions:
            await publish_many(ncs[r], [vs.publish_subject(r, "b")], BASE, SPLIT)
        total = 3 * (BASE + SPLIT)
        # central still reaches both sides; west and east miss each other's new data.
        await wait_total(ncs["central"], vs.read_stream("central"), total, 60)
        for r, other in (("west", "east"), ("east", "west")):
            count = await message_count(ncs[r], vs.read_stream(r))
            assert count < total, f"{r} got {other}'s data across a cut link"

        await cluster3.restore_link("west", "east")
        for r in vs.regions:
            await wait_total(ncs[r], vs.read_stream(r), total, RESUME_S)
        await check_converged(ncs, vs, {r: BASE + SPLIT for r in vs.regions})
    finally:
        for nc in ncs.values():
            await nc.close()
