"""Data origins on their way to the machine: compact while a rebuild replays them
(`Backlog`), in batches once tailed (`Batches`, never one job per message)."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable, Iterator

from sidecar.protocol.origins import DataEntry


class Backlog:
    """The data entries replayed by `rebuild`, held until `restore` indexes them: in typed
    columns (18 bytes an entry) rather than a list of `DataEntry` (about 120 bytes each)."""

    def __init__(self) -> None:
        self._reads = array("q")
        self._origin_seqs = array("q")
        self._origins = array("H")
        self._names: list[str] = []
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, entry: DataEntry) -> None:
        origin = self._ids.get(entry.origin)
        if origin is None:
            origin = self._ids[entry.origin] = len(self._names)
            self._names.append(entry.origin)
        self._reads.append(entry.read_seq)
        self._origin_seqs.append(entry.origin_seq)
        self._origins.append(origin)

    def entries(self) -> Iterator[DataEntry]:
        names = self._names
        for read_seq, origin, origin_seq in zip(
            self._reads, self._origins, self._origin_seqs, strict=True
        ):
            yield DataEntry(read_seq, names[origin], origin_seq)


class Batches:
    """Entries handed on together: `size` of them, or what came within `wait_s` of the
    first one, whichever is first."""

    def __init__(
        self, hand_on: Callable[[list[DataEntry]], None], size: int, wait_s: float
    ) -> None:
        self._hand_on = hand_on
        self._size = size
        self._wait_s = wait_s
        self._entries: list[DataEntry] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, entry: DataEntry) -> None:
        self._entries.append(entry)
        if len(self._entries) >= self._size:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._wait_s, self.flush)

    def flush(self) -> None:
        self.cancel()
        if self._entries:
            entries, self._entries = self._entries, []
            self._hand_on(entries)

    def cancel(self) -> None:
        """Stop the timer (what was collected stays until the next `flush`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
