"""Fixtures of the Spark plugin tests (helpers and their explanation: spark_helpers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from spark_helpers import (
    Layout,
    NatsServer,
    SidecarDouble,
    create_layout,
    publish_orders,
    stored_messages,
    wait_sourced,
)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def orders_layout(nats_server: NatsServer) -> Layout:
    """`orders` with 200 data messages (plus markers) in `orders-read-west`."""

    async def build() -> Layout:
        nc = await nats.connect(nats_server.url)
        try:
            vstream = await create_layout(nc, "orders")
            published = await publish_orders(nc, vstream, 200)
            last = await wait_sourced(nc, vstream, len(published))
            read_stream = vstream.read_stream("west")
            stored = await stored_messages(nc, read_stream, last)
            return Layout(nats_server.url, vstream, read_stream, published, stored)
        finally:
            await nc.close()

    return asyncio.run(build())


@pytest.fixture
def sidecar_double() -> Iterator[SidecarDouble]:
    double = SidecarDouble()
    yield double
    double.stop()
