"""How the driver hands data origins to the machine: in batches, and compactly at rebuild."""

from __future__ import annotations

import asyncio

from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from sidecar.runtime.driver import _Backlog, _Batches


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
