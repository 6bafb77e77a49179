"""How the driver hands data origins to the machine: in batches, and compactly at rebuild."""

from __future__ import annotations

import asyncio

import pytest

from rsub_dev.sidecars import wait_until
from sidecar.api.metrics import SidecarMetrics
from sidecar.config import NatsConfig
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.protocol import MachineConfig, StreamMachine
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.driver import StreamDriver, _Backlog, _Batches
from sidecar.runtime.handles import RegionHandles


async def test_entries_go_on_per_full_batch_or_after_the_wait() -> None:
    loop = asyncio.get_running_loop()
    handed: list[tuple[float, list[int]]] = []
    batches = _Batches(lambda es: handed.append((loop.time(), [e.read_seq for e in es])), 3, 0.1)
    start = loop.time()
    for seq in range(1, 8):
        batches.add(DataEntry(seq, "west", seq))
    assert [seqs for _, seqs in handed] == [[1, 2, 3], [4, 5, 6]]
    await asyncio.sleep(0.2)
    assert [seqs for _, seqs in handed] == [[1, 2, 3], [4, 5, 6], [7]]
    assert handed[-1][0] - start >= 0.1

    batches.add(DataEntry(8, "west", 8))
    batches.cancel()
    await asyncio.sleep(0.15)
    assert len(handed) == 3  # a cancelled timer hands nothing on
    batches.flush()
    assert handed[-1][1] == [8]


def test_the_backlog_gives_back_what_it_took_in_order() -> None:
    entries = [
        DataEntry(1, "west", 1),
        DataEntry(2, UNKNOWN_ORIGIN, 0),
        DataEntry(4, "east", 7),
        DataEntry(5, "west", 2),
    ]
    backlog = _Backlog()
    for entry in entries:
        backlog.add(entry)
    assert len(backlog) == 4
    assert list(backlog.entries()) == entries


async def test_a_positions_read_waits_while_the_last_one_is_still_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The machine takes jobs one by one; when they are slow (moves in a degraded cluster),
    the interval loop must not pile reads behind them: one read waits in the queue at most,
    and a read skipped for it is asked for again at the next interval."""
    vs = VirtualStream("orders", ("west", "east"))
    conn = NatsConnection(NatsConfig(servers=("nats://127.0.0.1:1",)), name="test")
    conn.connected = True
    driver = StreamDriver(
        vs,
        MachineConfig("west", "orders", vs.regions, interval_ms=10),
        RegionHandles("west", conn),
        SidecarMetrics(),
    )
    reads = 0

    async def read_positions() -> dict[str, int]:
        nonlocal reads
        reads += 1
        return {}

    monkeypatch.setattr(driver, "read_positions", read_positions)
    for _ in range(5):  # five intervals, and nobody drives the machine
        await driver.refresh()
    assert reads == 1
    assert driver.positions_stale(leader=True, sweep=False)
    driver.machine = StreamMachine(MachineConfig("west", "orders", vs.regions))
    driving = asyncio.create_task(driver.drive())

    async def read_again() -> bool:
        await driver.refresh()
        return reads > 1

    await wait_until(read_again, "a read once the machine took the one queued", 10)
    driver.stop()
    driving.cancel()
