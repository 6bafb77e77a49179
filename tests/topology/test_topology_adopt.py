"""Adopting a hand-made "virtual global stream" layout in place, holding data, under load."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from rsub_dev.cluster import ClusterFactory, LocalSuperCluster
from rsub_dev.sidecars import wait_until
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology
from tests.support.topology_helpers import message_count, publish_many, read_all, stream_info

pytestmark = pytest.mark.integration

HOUR_NS = 3600 * 1_000_000_000
BEFORE = 300  # per region, before adoption
DURING = 200  # per region, published while adoption runs
AFTER = 50  # per region, after adoption


async def make_walkthrough_layout(nc: Client, vs: VirtualStream, replicas: int) -> None:
    """The layout of the public walkthrough, made by hand as a user would."""

    async def create(cfg: dict[str, Any]) -> None:
        reply = await nc.request(
            f"$JS.API.STREAM.CREATE.{cfg['name']}", json.dumps(cfg).encode(), timeout=10
        )
        assert "error" not in json.loads(reply.data), reply.data

    for r in vs.regions:
        await create(
            {
                "name": vs.write_stream(r),
                "subjects": [vs.data_subject(r)],
                "num_replicas": replicas,
                "max_age": HOUR_NS,
                "placement": {"cluster": r},
            }
        )
    for r in vs.regions:
        await create(
            {
                "name": vs.read_stream(r),
                "num_replicas": replicas,
                "max_age": HOUR_NS,
                "placement": {"cluster": r},
                "sources": [
                    {"name": vs.write_stream(x), "filter_subject": vs.data_subject(x)}
                    for x in vs.regions
                ],
                "subject_transform": {"src": f"{vs.name}.*.>", "dest": f"{vs.name}.>"},
            }
        )


async def wait_counts(ncs: dict[str, Client], vs: VirtualStream, total: int) -> None:
    for r in vs.regions:

        async def full(nc: Client = ncs[r], stream: str = vs.read_stream(r)) -> bool:
            return await message_count(nc, stream) >= total

        await wait_until(full, f"{vs.read_stream(r)} to hold {total} messages", 90, poll_s=0.5)


async def adopt_under_load(cluster: LocalSuperCluster, replicas: int) -> None:
    vs = VirtualStream("foo", ("west", "central", "east"))
    ncs = {r: await nats.connect(cluster.servers(r)) for r in vs.regions}
    n = len(vs.regions)
    try:
        await make_walkthrough_layout(ncs["west"], vs, replicas)
        subjects = {r: [vs.publish_subject(r, f"s{k}") for k in range(5)] for r in vs.regions}
        for r in vs.regions:
            await publish_many(ncs[r], subjects[r], 0, BEFORE)
        await wait_counts(ncs, vs, n * BEFORE)
        before = {r: await stream_info(ncs[r], vs.read_stream(r)) for r in vs.regions}
        assert all(i["state"]["messages"] == n * BEFORE for i in before.values())

        # Publishers keep writing in every region while the layout is adopted.
        load = asyncio.gather(
            *(publish_many(ncs[r], subjects[r], BEFORE, DURING) for r in vs.regions)
        )
        report = await apply_topology(ncs["central"], vs)
        await load
        by_stream = {s.stream: s for s in report.streams}
        for r in vs.regions:
            w, q = by_stream[vs.write_stream(r)], by_stream[vs.read_stream(r)]
            assert (w.action, set(w.fields)) == ("updated", {"subjects", "max_consumers"})
            assert q.action == "updated"
            assert set(q.fields) == {
                "subjects",
                "subject_transform",
                "sources",
                "max_consumers",
                "allow_direct",
            }

        # Markers written after adoption travel with their origin's data.
        for r in vs.regions:
            js = ncs[r].jetstream()
            await js.publish(vs.marker_subject(r), b"m", headers={"Nats-Msg-Id": f"adopt-{r}"})
            await publish_many(ncs[r], subjects[r], BEFORE + DURING, AFTER)
        per_region = BEFORE + DURING + AFTER
        total = n * (per_region + 1)
        await wait_counts(ncs, vs, total)

        for r in vs.regions:
            stream = vs.read_stream(r)
            info = await stream_info(ncs[r], stream)
            old = before[r]["config"]
            cfg = info["config"]
            assert info["state"]["messages"] == total
            assert (cfg["num_replicas"], cfg["max_age"], cfg["retention"]) == (
                old["num_replicas"],
                old["max_age"],
                old["retention"],
            )
            assert "subject_transform" not in cfg
            assert cfg["subjects"] == [vs.snapshot_subject(r)]
            everything = await read_all(ncs[r], vs, stream, ">")
            assert len(everything) == total
            origins = Counter(m.origin for m in everything)
            assert max(origins.values()) == 1, "a message was sourced twice"
            assert {o for o in origins if o is not None} == {
                (x, s) for x in vs.regions for s in range(1, per_region + 2)
            }
            data = await read_all(ncs[r], vs, stream, vs.data_filter())
            assert len(data) == n * per_region
            assert all(m.subject.split(".")[1] != x for m in data for x in vs.regions)
            markers = await read_all(ncs[r], vs, stream, vs.marker_filter())
            assert sorted(m.msg_id or "" for m in markers) == sorted(
                f"adopt-{x}" for x in vs.regions
            )
            for x in vs.regions:
                # Each origin's data and marker keep the origin's order in the read stream.
                seqs = [m.origin[1] for m in everything if m.origin and m.origin[0] == x]
                assert seqs == sorted(seqs)
            winfo = await stream_info(ncs[r], vs.write_stream(r))
            assert winfo["state"]["messages"] == per_region + 1
            assert winfo["config"]["max_age"] == HOUR_NS
            assert winfo["config"]["num_replicas"] == replicas

        again = await apply_topology(ncs["east"], vs)
        assert {s.action for s in again.streams} == {"unchanged"}, again
    finally:
        for nc in ncs.values():
            await nc.close()


async def test_adopt_walkthrough_layout_r1(cluster3: LocalSuperCluster) -> None:
    await adopt_under_load(cluster3, 1)


@pytest.mark.slow
async def test_adopt_walkthrough_layout_r3(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(["west", "central", "east"], servers_per_region=3)
    await adopt_under_load(cluster, 3)


async def test_server_resources_a_source_whose_filter_changes(cluster2: LocalSuperCluster) -> None:
    """The trap adoption avoids, shown on the server: editing a source's filter in place gives
    it a new internal name, and the server sources its origin again from the start."""
    vs = VirtualStream("trap", ("west", "east"))
    nc = await nats.connect(cluster2.servers("west"))
    try:
        await make_walkthrough_layout(nc, vs, 1)
        await publish_many(nc, [vs.publish_subject("west", "a")], 0, 40)
        await wait_counts({"west": nc, "east": nc}, vs, 40)
        stream = vs.read_stream("west")
        cfg = (await stream_info(nc, stream))["config"]
        cfg["sources"][0] = {
            "name": vs.write_stream("west"),
            "subject_transforms": [
                {"src": vs.data_subject("west"), "dest": ""},
                {"src": vs.marker_subject("west"), "dest": ""},
            ],
        }
        reply = await nc.request(
            f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(cfg).encode(), timeout=10
        )
        assert "error" not in json.loads(reply.data), reply.data

        async def doubled() -> bool:
            return await message_count(nc, stream) >= 80

        await wait_until(doubled, f"{stream} to source its origin a second time", 60, poll_s=0.5)
        origins = Counter(m.origin for m in await read_all(nc, vs, stream, ">"))
        assert origins == Counter({("west", s): 2 for s in range(1, 41)})
    finally:
        await nc.close()


async def test_adopted_layout_survives_restart(cluster2: LocalSuperCluster) -> None:
    """After adoption, restarted servers resume every source where it stood: the new sources
    carry opt_start_seq, so nothing is re-sourced even before the origin sends anything new."""
    vs = VirtualStream("rs", ("west", "east"))
    ncs = {r: await nats.connect(cluster2.servers(r)) for r in vs.regions}
    try:
        await make_walkthrough_layout(ncs["west"], vs, 1)
        for r in vs.regions:
            await publish_many(ncs[r], [vs.publish_subject(r, "a")], 0, 60)
        await wait_counts(ncs, vs, 120)
        await apply_topology(ncs["west"], vs)
        for nc in ncs.values():
            await nc.close()
        for r in vs.regions:
            await cluster2.stop_region(r)
        for r in vs.regions:
            await cluster2.start_region(r)
        await cluster2.wait_ready(60)
        ncs = {r: await nats.connect(cluster2.servers(r)) for r in vs.regions}
        for r in vs.regions:
            await publish_many(ncs[r], [vs.publish_subject(r, "b")], 60, 5)
        await wait_counts(ncs, vs, 130)
        for r in vs.regions:
            everything = await read_all(ncs[r], vs, vs.read_stream(r), ">")
            assert Counter(m.origin for m in everything) == Counter(
                {(x, s): 1 for x in vs.regions for s in range(1, 66)}
            )
    finally:
        for nc in ncs.values():
            await nc.close()
