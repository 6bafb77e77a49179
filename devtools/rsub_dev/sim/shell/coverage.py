"""What a machine holds about the data, checked as it takes it: what it is fed as data is
sourced data (`CheckedIndex`: not data), and what the merged progress of the durable and the
ranges acked above other regions' floors cover was consumed (`Coverage`: covered means
consumed)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.ledger import Ledger
from rsub_dev.sim.shell.params import DURABLE, ShellParams
from sidecar.protocol import Output, StreamMachine, UpdateApplied
from sidecar.protocol.origins import DataEntry, OriginIndex


class CheckedIndex(OriginIndex):
    """A machine's origin index whose entries are checked as they are added (not data): each
    names a data message its read stream stored at that sequence, with its origin and origin
    sequence: never a marker (a local snapshot marker has no `Nats-Stream-Source`), never
    another message's origin."""

    def __init__(self, world: LoopWorld[ShellParams], ledger: Ledger, region: str) -> None:
        super().__init__()
        self._world = world
        self._ledger = ledger
        self._region = region

    def add(self, entries: Iterable[DataEntry]) -> int:
        entries = list(entries)
        for e in entries:
            if e.read_seq <= self.indexed_through:
                continue  # a replay: skipped
            stored = self._ledger.data_at(self._region, e.read_seq)
            if stored is None:
                raise self._world.fail(
                    f"not data: {self._region} fed {e} to its index, no data message there"
                )
            if stored != (e.origin, e.origin_seq):
                raise self._world.fail(
                    f"not data: {self._region} fed {e} to its index for {stored}"
                )
        self._world.stats["data_checked"] += len(entries)
        return super().add(entries)


class Coverage:
    """Covered means consumed: whenever a machine accepts an update of the durable, every
    data message its merged progress covers is a logical message consumed, or one passing
    which is excused (`Checks.unconsumed`); an exact client skipping what the progress
    covers after a failover therefore skips only consumed messages. And it covers only what
    was written."""

    def __init__(self, world: LoopWorld[ShellParams], written: dict[str, list[int]]) -> None:
        self._world = world
        self._written = written
        self._checked: dict[str, int] = {}
        """Per origin: how many of its data messages (in `written`) are known covered well."""

    def accepted(
        self,
        region: str,
        machine: StreamMachine,
        outputs: list[Output],
        unconsumed: Callable[[tuple[str, int]], bool],
    ) -> None:
        if not any(isinstance(o, UpdateApplied) and o.subscription == DURABLE for o in outputs):
            return
        view = machine.subscription(DURABLE)
        if view is None:
            return
        progress = dict(view.progress)
        for origin, seq in progress.items():
            written = self._written.get(origin)
            if written is None or seq > (written[-1] if written else 0):
                raise self._world.fail(
                    f"covered: {region}'s progress of {DURABLE} {progress} covers "
                    f"({origin}, {seq}), never written"
                )
            k = self._checked.get(origin, 0)
            while k < len(written) and written[k] <= seq:
                if unconsumed((origin, written[k])):
                    raise self._world.fail(
                        f"covered: {region}'s progress of {DURABLE} {progress} covers "
                        f"({origin}, {written[k]}), never consumed"
                    )
                k += 1
            self._checked[origin] = k
        for origin, ranges in view.acked.items():
            written = self._written.get(origin, [])
            for first, last in ranges:
                for seq in written[bisect_left(written, first) : bisect_right(written, last)]:
                    if unconsumed((origin, seq)):
                        raise self._world.fail(
                            f"covered: {region}'s ranges acked elsewhere of {DURABLE} "
                            f"{dict(view.acked)} cover ({origin}, {seq}), never consumed"
                        )
                self._world.stats["acked_ranges_checked"] += 1
        self._world.stats["progress_checked"] += 1
