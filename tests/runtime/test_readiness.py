"""A sidecar is ready only once every stream's state is rebuilt from its read stream."""

from __future__ import annotations

import asyncio

import pytest

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import READY_TIMEOUT_S, RegionSidecars, wait_until
from sidecar.runtime import Runtime
from sidecar.runtime.driver import StreamDriver

pytestmark = pytest.mark.integration


async def test_not_ready_while_a_stream_is_being_rebuilt(
    cluster2: LocalSuperCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rebuild of a long retention takes seconds (docs/benchmarks.md); here it is held.
    gate = asyncio.Event()
    rebuild = StreamDriver.rebuild

    async def held(self: StreamDriver) -> None:
        await gate.wait()
        await rebuild(self)

    monkeypatch.setattr(StreamDriver, "rebuild", held)
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
