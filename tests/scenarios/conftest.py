"""Scenario fixtures: a real local super-cluster with one in-process sidecar per region,
shared by the tests of a module (each test uses virtual streams of its own).

Module-scoped fixtures live in the module's event loop: modules that use them mark their
tests `pytest.mark.asyncio(loop_scope="module")`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars
from tests.support.scenario_kit import (
    INTERVAL_MS,
    LEASE_TTL_S,
    THREE_REGION_STREAMS,
    TIMEOUT_S,
    TWO_REGION_STREAMS,
    World,
    clients,
)


@contextlib.asynccontextmanager
async def world(
    regions: list[str], streams: tuple[str, ...], directory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    async with (
        LocalSuperCluster(regions, directory.mktemp("cluster")) as cluster,
        RegionSidecars(
            cluster,
            streams=streams,
            interval_ms=INTERVAL_MS,
            timeout_s=TIMEOUT_S,
            lease_ttl_s=LEASE_TTL_S,
        ) as sidecars,
        clients(cluster) as conns,
    ):
        yield World(cluster, sidecars, conns)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world2(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(["west", "east"], TWO_REGION_STREAMS, tmp_path_factory) as w:
        yield w


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(["west", "central", "east"], THREE_REGION_STREAMS, tmp_path_factory) as w:
        yield w
