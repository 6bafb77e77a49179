"""Hold the runtime's stream rebuilds until a gate opens: a rebuild of a long retention takes
seconds (docs/benchmarks.md), the tests of what a replica does meanwhile hold it instead."""

from __future__ import annotations

import asyncio
from collections.abc import Container

import pytest

from sidecar.runtime.driver import StreamDriver


def hold_rebuilds(
    monkeypatch: pytest.MonkeyPatch, streams: Container[str] | None = None
) -> asyncio.Event:
    """Hold every stream's rebuild (or only those of `streams`) until the returned event is set."""
    gate = asyncio.Event()
    rebuild = StreamDriver.rebuild

    async def held(self: StreamDriver) -> None:
        if streams is None or self.vs.name in streams:
            await gate.wait()
        await rebuild(self)

    monkeypatch.setattr(StreamDriver, "rebuild", held)
    return gate
