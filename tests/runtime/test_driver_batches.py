"""How the driver hands data origins to the machine: in batches, and compactly at rebuild."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.config.nats import NatsConfig
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.nats.nats_port import NatsPort
from sidecar.protocol import MachineConfig, PositionsListing, StreamMachine
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.batches import Backlog, Batches
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles


async def test_entries_go_on_per_full_batch_or_after_the_wait() -> None:
    loop = asyncio.get_running_loop()
    handed: list[tuple[float, list[int]]] = []
    batches = Batches(lambda es: handed.append((loop.time(), [e.read_seq for e in es])), 3, 0.1)
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
    backlog = Backlog()
    for entry in entries:
        backlog.add(entry)
    assert len(backlog) == 4
    assert list(backlog.entries()) == entries


async def test_the_driver_posts_an_interval_only_when_the_machine_has_news_or_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pump: a read the machine asked for goes to the reader queue; while it is out, the
    machine asks for no other (a signal waits for the next interval); an interval with
    nothing to tell a machine that asked for nothing posts no job."""
    vs = VirtualStream("orders", ("west", "east"))
    conn = NatsConnection(NatsConfig(servers=("nats://127.0.0.1:1",)), name="test")
    driver = StreamDriver(
        vs,
        MachineConfig("west", "orders", vs.regions, interval_ms=10),
        RegionHandles("west", conn, NatsPort(conn)),
        SidecarMetrics(),
    )
    queued: list[StreamDriver] = []
    driver.read_later = queued.append
    reads = 0

    async def read_positions() -> PositionsListing:
        nonlocal reads
        reads += 1
        return PositionsListing(0, {}, {}, 0, follows_end=False)

    monkeypatch.setattr(driver, "read_positions", read_positions)
    machine = driver.machine = StreamMachine(MachineConfig("west", "orders", vs.regions))
    driving = asyncio.create_task(driver.drive())

    async def settle() -> None:  # every job posted before is carried out
        await driver.submit(lambda _: [])

    driver.leadership(True, 1)
    await settle()
    driver.interval(1_000, sweep=False)  # a new leader reads its positions
    await settle()
    assert queued == [driver]
    driver.moved()
    driver.interval(1_010, sweep=False)  # one read out: the signal waits
    await settle()
    assert queued == [driver]
    await driver.refresh(connected=True)
    await settle()
    assert reads == 1 and machine.needs().deadline_ms is not None  # the signal's read is due
    driver.interval(1_020, sweep=False)
    await settle()
    assert queued == [driver, driver]
    await driver.refresh(connected=False)  # failed at once: asked for again
    await settle()
    driver.interval(1_030, sweep=False)
    await settle()
    assert len(queued) == 3 and reads == 1
    await driver.refresh(connected=True)
    await settle()
    steps = driver._steps
    driver.interval(1_040, sweep=False)  # nothing to tell, nothing asked for: no job
    await settle()
    assert driver._steps == steps + 1 and machine.needs().deadline_ms is None  # settle's own
    driver.stop()
    driving.cancel()
