"""Fixtures for the API layer tests: an in-memory backend and real servers on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from tests.support.api_fakes import Certs, MemoryBackend, make_certs


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
async def grpc_server(backend: MemoryBackend) -> AsyncIterator[GrpcServerHandle]:
    handle = await start_grpc_server(backend, "127.0.0.1:0", health_poll_interval_s=0.02)
    yield handle
    await handle.stop(None)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))
