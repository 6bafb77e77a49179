"""A sidecar is ready only once every stream's state is rebuilt from its read stream and its
tails follow it; until then each stream rebuilt serves, and /readyz tells how many are."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
import nats
import pytest
import structlog

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import (
    READY_TIMEOUT_S,
    RegionSidecars,
    durable_config,
    sidecar_settings,
    wait_until,
)
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.config.loading import config_from_mapping
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology
from sidecar.runtime import Runtime
from tests.support.held_rebuilds import hold_rebuilds
from tests.support.nats_users import ADMIN, STREAM, connect_as, credentials, restrict, sidecar_user

pytestmark = pytest.mark.integration


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    """/readyz's status and body."""
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def test_not_ready_while_a_stream_is_being_rebuilt(
    cluster2: LocalSuperCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rebuild of a long retention takes seconds (docs/benchmarks.md); here it is held.
    gate = hold_rebuilds(monkeypatch)
    runtime = Runtime(RegionSidecars(cluster2, regions=["west"]).config("west"))
    await runtime.start()
    try:

        async def only_streams_missing() -> bool:
            return runtime.readiness.missing() == ["streams"]

        await wait_until(only_streams_missing, "everything but the streams to be ready", 30)
        await asyncio.sleep(0.5)
        assert runtime.readiness.missing() == ["streams"]
        gate.set()
        await runtime.wait_ready(READY_TIMEOUT_S)
        assert runtime.readiness.ready
    finally:
        gate.set()
        await runtime.stop()


async def test_streams_serve_once_rebuilt_and_readyz_counts_them(
    cluster2: LocalSuperCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 streams, the rebuilds of the last 100 held: the first 100 answer the API (the
    others UNAVAILABLE, and `Status` says they are rebuilding) while /readyz answers 503
    with 100 of 200 rebuilt; once released, 200 of 200 and 200."""
    names = [f"p{i:03d}" for i in range(200)]
    first, last = (VirtualStream(n, tuple(cluster2.regions)) for n in (names[0], names[-1]))
    nc = await nats.connect(cluster2.servers("west"))
    try:
        for vs in (first, last):
            await apply_topology(nc, vs)
            await nc.jetstream().add_consumer(vs.read_stream("west"), durable_config(vs, "d"))
    finally:
        await nc.close()
    held = set(names[100:])
    gate = hold_rebuilds(monkeypatch, held)
    service = Service(RegionSidecars(cluster2, regions=["west"], streams=names).config("west"))
    await service.start()
    try:
        url = f"http://127.0.0.1:{service.http_port}/readyz"
        async with aiohttp.ClientSession() as http:

            async def answers(status: int, rebuilt: int) -> bool:
                got, body = await readyz(http, url)
                return (got, body.get("streams")) == (status, {"rebuilt": rebuilt, "total": 200})

            await wait_until(lambda: answers(503, 100), "/readyz: 100 of 200 rebuilt", 120)
            await asyncio.sleep(0.5)  # the held ones stay held: no further progress
            status, body = await readyz(http, url)
            assert (status, body["missing"], body["streams"]["rebuilt"]) == (503, ["streams"], 100)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
                stub = api_pb2_grpc.CursorServiceStub(channel)
                state = await stub.GetSubscription(
                    api_pb2.GetSubscriptionRequest(stream=first.name, subscription="d")
                )
                assert state.subscription == "d"
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetSubscription(
                        api_pb2.GetSubscriptionRequest(stream=last.name, subscription="d")
                    )
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                status_of = api_pb2_grpc.AdminServiceStub(channel).Status
                streams = (await status_of(api_pb2.StatusRequest())).streams
                rebuilding = {s.stream for s in streams if s.rebuilding}
                assert (len(streams), rebuilding) == (200, held)
            gate.set()
            await wait_until(lambda: answers(200, 200), "/readyz: 200 of 200, ready", 120)
    finally:
        gate.set()
        await service.stop()


async def test_not_ready_while_the_tails_cannot_open(cluster2: LocalSuperCluster) -> None:
    """Without `$JS.API.CONSUMER.CREATE.<read stream>` (the live tails' consumers) a stream is
    replayed and its positions read, but its tails are refused: it stays rebuilding (/readyz
    503, 0 of 1) while each tail is retried, and the log names the refused subject. Given
    the permission back (a reload), the tails open and the sidecar becomes ready."""
    refused = "$JS.API.CONSUMER.CREATE.orders-read-west"
    full = sidecar_user("west")
    await restrict(cluster2, [full.without(refused)])
    async with connect_as(cluster2, "west", *ADMIN) as admin:
        await apply_topology(admin, VirtualStream(STREAM, tuple(cluster2.regions)))
    settings = sidecar_settings(cluster2, "west", streams=[STREAM], credentials=credentials(full))
    service = Service(config_from_mapping(settings))
    with structlog.testing.capture_logs() as events:
        await service.start()
        try:
            url = f"http://127.0.0.1:{service.http_port}/readyz"
            async with aiohttp.ClientSession() as http:

                async def tails_failed() -> bool:
                    failed = {e["event"] for e in events if e["event"].endswith("_tail_failed")}
                    return failed == {"marker_tail_failed", "origin_tail_failed"}

                # A refused request times out (5 s), and a tail fails once its consumer's
                # creation was asked 4 times (`stream_reader._CREATE_ATTEMPTS`: about 22 s).
                await wait_until(tails_failed, "both tails to fail", 60)
                status, body = await readyz(http, url)
                assert (status, body["missing"]) == (503, ["streams"])
                assert body["streams"] == {"rebuilt": 0, "total": 1}
                violation = f'permissions violation for publish to "{refused}"'.lower()
                assert any(violation in str(e.get("error")).lower() for e in events)

                await restrict(cluster2, [full])

                async def ready() -> bool:
                    return (await readyz(http, url))[0] == 200

                await wait_until(ready, "/readyz 200 once the tails may open", 60)
                assert (await readyz(http, url))[1]["streams"] == {"rebuilt": 1, "total": 1}
        finally:
            await service.stop()
