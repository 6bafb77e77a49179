"""The live tails of a region open a bounded number at a time (`TAIL_OPENS_IN_FLIGHT`), and
a stream's tails count as open only once the port said so. A pure unit test: the port is a
stand-in whose live reads wait at their opening until let through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from sidecar.config.nats import NatsConfig
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.nats.port import StoredMessage
from sidecar.runtime.handles import TAIL_OPENS_IN_FLIGHT, RegionHandles
from sidecar.runtime.observer import StreamObserver
from sidecar.runtime.tails import StreamTails

STREAMS = 40


class OpeningPort:
    """Live reads that wait at their opening (the consumer's creation) until `gate` is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.opening = 0
        self.most_opening = 0

    async def read(
        self,
        stream: str,
        filter_subject: str,
        start_seq: int,
        *,
        live: bool,
        headers_only: bool = False,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[StoredMessage, None]:
        self.opening += 1
        self.most_opening = max(self.most_opening, self.opening)
        try:
            await self.gate.wait()
        finally:
            self.opening -= 1
        assert opened is not None
        opened()
        await asyncio.Event().wait()  # open: nothing comes
        yield StoredMessage(0, "", b"", {})  # never reached: an async generator


async def test_tails_open_a_bounded_number_at_a_time() -> None:
    fake = OpeningPort()
    port: Any = fake  # only `read` is used by the tails
    conn = NatsConnection(NatsConfig(servers=("nats://127.0.0.1:1",)), name="test")
    handles = RegionHandles("west", conn, port)
    metrics = SidecarMetrics()
    tails = [
        StreamTails(
            VirtualStream(f"s{i}", ("west", "east")),
            handles,
            True,
            StreamObserver(f"s{i}", metrics, handles.clock),
            lambda _: None,
        )
        for i in range(STREAMS)
    ]
    tasks = [asyncio.create_task(t.markers()) for t in tails]
    tasks += [asyncio.create_task(t.origins()) for t in tails]
    opened = [asyncio.create_task(t.opened()) for t in tails]
    try:
        for _ in range(10):
            await asyncio.sleep(0)
        assert 2 * STREAMS > TAIL_OPENS_IN_FLIGHT
        assert (fake.opening, fake.most_opening) == (TAIL_OPENS_IN_FLIGHT, TAIL_OPENS_IN_FLIGHT)
        assert not any(o.done() for o in opened)  # none open yet: none counts as rebuilt
        fake.gate.set()
        await asyncio.wait_for(asyncio.gather(*opened), 5)
        assert fake.most_opening == TAIL_OPENS_IN_FLIGHT
    finally:
        for task in tasks + opened:
            task.cancel()
        await asyncio.gather(*tasks, *opened, return_exceptions=True)
