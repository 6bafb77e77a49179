"""apply_topology on real super-clusters: layout, convergence, per-origin order, idempotence."""

from __future__ import annotations

import nats
import pytest
from nats.aio.client import Client

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.sidecars import wait_until
from sidecar.naming import VirtualStream
from sidecar.nats.topology import DEFAULT_MAX_CONSUMERS, apply_topology
from tests.support.topology_helpers import (
    check_converged,
    message_count,
    publish_many,
    read_all,
    stream_info,
)

pytestmark = pytest.mark.integration

PER_REGION = 2000


async def apply_and_load(cluster: LocalSuperCluster, vs: VirtualStream, replicas: int) -> None:
    ncs = {r: await nats.connect(cluster.servers(r)) for r in vs.regions}
    try:
        report = await apply_topology(ncs[vs.regions[0]], vs, replicas=replicas)
        assert [(s.stream, s.action) for s in report.streams] == [
            (vs.write_stream(r), "created") for r in vs.regions
        ] + [(vs.read_stream(r), "created") for r in vs.regions]

        for r in vs.regions:
            for stream in (vs.write_stream(r), vs.read_stream(r)):
                info = await stream_info(ncs[r], stream)
                assert info["cluster"]["name"] == r
                assert info["config"]["num_replicas"] == replicas
                assert info["config"]["max_consumers"] == DEFAULT_MAX_CONSUMERS
                assert len(info["cluster"].get("replicas") or []) == replicas - 1
            assert (await stream_info(ncs[r], vs.read_stream(r)))["config"]["allow_direct"]

        expected: dict[str, int] = {}
        for i, r in enumerate(vs.regions):
            subjects = [vs.publish_subject(r, f"k{k}.x") for k in range(7)]
            await publish_many(ncs[r], subjects, 0, PER_REGION)
            js = ncs[r].jetstream()
            for n in range(3):
                await js.publish(vs.marker_subject(r), b"m", headers={"Nats-Msg-Id": f"{r}-{n}"})
            await publish_many(ncs[r], subjects, PER_REGION, 10 * (i + 1))
            expected[r] = PER_REGION + 3 + 10 * (i + 1)
        total = sum(expected.values())

        for r in vs.regions:
            stream = vs.read_stream(r)

            async def full(nc: Client = ncs[r], stream: str = stream) -> bool:
                return await message_count(nc, stream) >= total

            await wait_until(full, f"{stream} to hold {total} messages", 60, poll_s=0.5)
        await check_converged(ncs, vs, expected)

        again = await apply_topology(ncs[vs.regions[-1]], vs, replicas=replicas)
        assert not again.changed, again
        assert {s.action for s in again.streams} == {"unchanged"}
        dry = await apply_topology(ncs[vs.regions[-1]], vs, dry_run=True)
        assert not dry.changed
    finally:
        for nc in ncs.values():
            await nc.close()


async def test_apply_three_regions_converges(cluster3: LocalSuperCluster) -> None:
    await apply_and_load(cluster3, VirtualStream("orders", ("west", "central", "east")), 1)


@pytest.mark.slow
async def test_apply_three_regions_three_servers_each(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(["west", "central", "east"], servers_per_region=3)
    await apply_and_load(cluster, VirtualStream("orders", ("west", "central", "east")), 3)


async def test_dry_run_changes_nothing_and_new_region_is_added(cluster3: LocalSuperCluster) -> None:
    nc = await nats.connect(cluster3.servers("west"))
    try:
        two = VirtualStream("pay", ("west", "east"))
        dry = await apply_topology(nc, two, dry_run=True)
        assert dry.dry_run and {s.action for s in dry.streams} == {"created"}
        names = await nc.request("$JS.API.STREAM.NAMES", b"", timeout=5)
        assert b"pay-" not in names.data

        await apply_topology(nc, two)
        await publish_many(nc, [two.publish_subject("west", "a")], 0, 50)
        three = VirtualStream("pay", ("west", "central", "east"))
        report = await apply_topology(nc, three)
        by_stream = {s.stream: s for s in report.streams}
        assert by_stream["pay-write-central"].action == "created"
        assert by_stream["pay-read-central"].action == "created"
        for r in ("west", "east"):
            assert by_stream[f"pay-write-{r}"].action == "unchanged"
            assert by_stream[f"pay-read-{r}"].action == "updated"
            assert by_stream[f"pay-read-{r}"].fields == ("sources",)
        central = await nats.connect(cluster3.servers("central"))
        try:
            await publish_many(central, [three.publish_subject("central", "b")], 0, 20)
        finally:
            await central.close()

        for r in three.regions:

            async def all_in(stream: str = f"pay-read-{r}") -> bool:
                return await message_count(nc, stream) == 70

            await wait_until(all_in, f"pay-read-{r} to hold 70 messages", 60, poll_s=0.5)
        for r in three.regions:
            data = await read_all(nc, three, f"pay-read-{r}", ">")
            origins = [m.origin for m in data]
            assert len(set(origins)) == len(origins) == 70
    finally:
        await nc.close()
