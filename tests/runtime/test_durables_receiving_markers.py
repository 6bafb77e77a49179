"""A replicated durable whose filter lets the markers through, on a real sidecar: flagged in
the API (`receives_markers`) and in `rsub subscriptions`, counted in
`rsub_durables_receiving_markers`, and logged once (issue 21, item 6)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import nats
import pytest
from nats.js import JetStreamContext, api
from structlog.testing import capture_logs

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, wait_until
from sidecar._gen.rsub.v1 import api_pb2, api_pb2_grpc
from sidecar.api.service import Service
from sidecar.runtime.errors import NotFound
from tests.support.rsub_process import rsub_command

pytestmark = pytest.mark.integration

STREAM = "orders"
READ_STREAM = f"{STREAM}-read-west"
REPLICATED = {"rsub.replicate": "true"}


@contextlib.asynccontextmanager
async def west_sidecar(
    cluster: LocalSuperCluster,
) -> AsyncIterator[tuple[Service, JetStreamContext]]:
    """West's sidecar alone, and a JetStream context of west."""
    async with RegionSidecars(cluster, streams=[STREAM], regions=["west"]) as sidecars:
        nc = await nats.connect(cluster.servers("west"))
        try:
            yield sidecars["west"], nc.jetstream()
        finally:
            await nc.close()


async def durable(js: JetStreamContext, name: str, **config: Any) -> None:
    await js.add_consumer(
        READ_STREAM, durable_name=name, ack_policy=api.AckPolicy.EXPLICIT, **config
    )


def gauge(runtime: Service) -> float | None:
    return runtime.metrics.registry.get_sample_value(
        "rsub_durables_receiving_markers", {"stream": STREAM}
    )


async def test_a_replicated_durable_receiving_markers_is_shown_counted_and_logged_once(
    cluster2: LocalSuperCluster,
) -> None:
    with capture_logs() as logs:
        async with west_sidecar(cluster2) as (west, js):
            await durable(js, "leaky", metadata=REPLICATED)  # no filter: every message
            await durable(js, "wide", metadata=REPLICATED, filter_subject="*.>")
            await durable(js, "tidy", metadata=REPLICATED, filter_subject=f"{STREAM}.>")
            await durable(js, "plain")  # not replicated: not rsub's to judge

            async def listed() -> bool:
                try:
                    views = [await west.get_subscription(STREAM, n) for n in ("leaky", "tidy")]
                except NotFound:
                    return False
                return all(v.mark_delete_read_unix_ms is not None for v in views)

            await wait_until(listed, "the durables to be read")
            flags = {
                v.subscription: v.receives_markers for v in await west.list_subscriptions(STREAM)
            }
            assert flags == {"leaky": True, "wide": True, "tidy": False, "plain": False}
            assert gauge(west) == 2
            async with grpc.aio.insecure_channel(f"127.0.0.1:{west.grpc_port}") as channel:
                state = await api_pb2_grpc.CursorServiceStub(channel).GetSubscription(
                    api_pb2.GetSubscriptionRequest(stream=STREAM, subscription="leaky")
                )
            assert state.receives_markers
            code, out, err = await rsub_command(
                "subscriptions", STREAM, "--sidecar", f"127.0.0.1:{west.grpc_port}"
            )
            assert (code, err) == (0, "")
            assert (
                "warning: durable 'leaky' receives the markers of stream 'orders': its filter "
                "lets them through; filter it on 'orders.>' (docs/topology.md)"
            ) in out.splitlines()
            assert "'tidy'" not in out and "'plain'" not in out
            # Each positions read finds them again; each is logged once all the same.
            for _ in range(3):
                await west.set_replicated(STREAM, "tidy", True)  # reads the positions
            # Fixed by its user (the filter `rsub topology` documents): no longer counted.
            await durable(js, "wide", metadata=REPLICATED, filter_subject=f"{STREAM}.>")
            await west.set_replicated(STREAM, "wide", True)
            assert not (await west.get_subscription(STREAM, "wide")).receives_markers
            assert gauge(west) == 1
    warned = [e for e in logs if e["event"] == "durable_receives_markers"]
    assert [(e["subscription"], e["filters"], e["log_level"]) for e in warned] == [
        ("leaky", [], "warning"),
        ("wide", ["*.>"], "warning"),
    ]
    assert "filter it on 'orders.>'" in warned[0]["detail"]
