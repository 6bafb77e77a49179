"""Fixtures for the adapter tests: one real stand-alone JetStream server.

A stand-alone server ignores stream placement (a lone clustered server never elects a meta
leader), so placement itself is checked by the end-to-end tests on `cluster2`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort
from tests.support.runtime_servers import ServerProcess


@pytest.fixture(scope="module")
def js_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A stand-alone JetStream server for the whole test module."""
    server = ServerProcess(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(js_server: ServerProcess) -> AsyncIterator[Client]:
    """A client connected once JetStream can create streams (it needs a meta leader)."""
    client = await nats.connect(js_server.url)
    js = client.jetstream()
    for _ in range(300):
        with contextlib.suppress(Exception):
            await js.add_stream(name="probe", subjects=["probe"], max_consumers=1)
            break
        await asyncio.sleep(0.1)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
def port(nc: Client) -> JetStreamPort:
    """The real port over the test's client (what the runtime reaches JetStream through)."""
    return NatsPort(nc)


@pytest.fixture
def stopped_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test's own, not started yet (the test starts and stops it)."""
    server = ServerProcess(tmp_path)
    try:
        yield server
    finally:
        server.stop()
