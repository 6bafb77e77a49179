"""Fixtures for the adapter tests (`sidecar/nats`), over the stand-alone JetStream server of
tests/conftest.py (`js_server`, `nc`).

A stand-alone server ignores stream placement (a lone clustered server never elects a meta
leader), so placement itself is checked by the end-to-end tests on `cluster2`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort
from tests.support.nats_servers import LoneServer


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    return nc.jetstream()


@pytest.fixture
def port(nc: Client) -> JetStreamPort:
    """The real port over the test's client (what the runtime reaches JetStream through)."""
    return NatsPort(nc)


@pytest.fixture
def stopped_server(tmp_path: Path) -> Iterator[LoneServer]:
    """A server of this test's own, not started yet (the test starts and stops it)."""
    server = LoneServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def stream(js: JetStreamContext) -> str:
    """A plain stream of its own, `<name>.>` (a test file with a stream of another shape
    defines its own)."""
    name = f"P{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"], max_consumers=10)
    return name
