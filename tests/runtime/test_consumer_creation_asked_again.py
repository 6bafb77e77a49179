"""A tail's or a replay's consumer creation that the server handled but whose reply was lost
is asked again under the same name, so the stream keeps one consumer, not one per attempt
(issue 22: at 3,000 streams the servers answered 503 thousands of times, and each creation
asked again by a new tail left a consumer behind). On real servers, a lone one and a
cluster; the fault is injected into the one request path (`jsapi.request`): the server
handles the creation, then its reply is dropped and the caller times out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from rsub_dev.cluster import LocalSuperCluster
from sidecar.config.nats import NatsConfig
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats import jsapi, stream_reader
from sidecar.nats.connection import NatsConnection
from sidecar.nats.nats_port import NatsPort
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.tails import Input, StreamTails
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

VS = VirtualStream("orders", ("west", "east"))
STREAM = VS.read_stream("west")
MARKERS = 3
_request = jsapi.request


class LostReplies:
    """The request path, with the replies of the first `lose` consumer creations dropped
    after the server handled them (the caller sees a timeout)."""

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.lost = 0

    async def __call__(
        self, nc: Client, op: str, payload: Mapping[str, Any] | None = None, *, timeout_s: float
    ) -> dict[str, Any]:
        reply = await _request(nc, op, payload, timeout_s=timeout_s)
        if op.startswith("CONSUMER.CREATE.") and self.lost < self.lose:
            self.lost += 1
            raise NatsTimeoutError
        return reply


@pytest.fixture(params=["lone_server", "cluster"])
def servers(request: pytest.FixtureRequest) -> list[str]:
    """A lone server's URL, or a cluster's region's (`west`)."""
    if request.param == "lone_server":
        request.getfixturevalue("nc")  # JetStream ready
        server: LoneServer = request.getfixturevalue("js_server")
        return [server.url]
    cluster: LocalSuperCluster = request.getfixturevalue("cluster2")
    return cluster.servers("west")


@pytest.fixture
async def js(servers: list[str]) -> AsyncIterator[JetStreamContext]:
    """A client's JetStream, with the read stream holding `MARKERS` markers (deleted after)."""
    client = await nats.connect(servers)
    js = client.jetstream()
    await js.add_stream(name=STREAM, subjects=[VS.marker_filter()])
    for i in range(MARKERS):
        await js.publish(VS.marker_subject("east"), f"marker {i}".encode())
    try:
        yield js
    finally:
        with contextlib.suppress(Exception):
            await js.delete_stream(STREAM)
        await client.close()


async def consumers(js: JetStreamContext) -> int:
    return len(await js.consumers_info(STREAM))


async def test_a_tail_asks_again_under_the_same_name_and_leaves_one_consumer(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    lossy = LostReplies(1)
    monkeypatch.setattr(jsapi, "request", lossy)
    # The port works on the test's client; the connection only tells whether it is up.
    conn = NatsConnection(NatsConfig(servers=("nats://127.0.0.1:1",)), name="test")
    handles = RegionHandles("west", conn, NatsPort(js._nc))
    metrics = SidecarMetrics()
    posted: list[Input] = []
    all_posted = asyncio.Event()

    def post(job: Input) -> None:
        posted.append(job)
        if len(posted) == MARKERS:
            all_posted.set()

    observer = StreamObserver(VS.name, metrics, handles.clock)
    tails = StreamTails(VS, handles, True, observer, post)
    task = asyncio.create_task(tails.markers())
    try:
        await asyncio.wait_for(all_posted.wait(), 20)
        taken = [p.keywords["stored"].seq for p in posted if isinstance(p, partial)]
        assert taken == list(range(1, MARKERS + 1))
        assert lossy.lost == 1
        assert await consumers(js) == 1
        asked = metrics.registry.get_sample_value("rsub_consumer_creations_asked_again_total")
        assert asked == 1
    finally:
        tails.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_replay_asked_again_yields_what_its_first_creation_delivered(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The consumer the unanswered creation made delivers at once: the creation asked again
    # answers with it, most or all of it delivered, and the replay still takes every message.
    lossy = LostReplies(1)
    monkeypatch.setattr(jsapi, "request", lossy)
    replay = stream_reader.replay(js, STREAM, VS.marker_filter())
    async with contextlib.aclosing(replay), asyncio.timeout(20):
        taken = [msg.metadata.sequence.stream async for msg in replay]
    assert taken == list(range(1, MARKERS + 1))
    assert lossy.lost == 1
    assert await consumers(js) == 0  # a replay deletes its consumer


async def test_a_creation_given_up_deletes_its_consumer(
    js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    lossy = LostReplies(lose=1_000)  # every one
    monkeypatch.setattr(jsapi, "request", lossy)
    tail = stream_reader.tail(js, STREAM, VS.marker_filter(), 1)
    async with contextlib.aclosing(tail), asyncio.timeout(20):
        with pytest.raises(NatsTimeoutError):
            async for _ in tail:
                pass
    assert await consumers(js) == 0
    assert lossy.lost == stream_reader._CREATE_ATTEMPTS
