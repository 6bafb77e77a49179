"""What a machine holds about the data, checked as it takes it: what it is fed as data is
sourced data (`CheckedIndex`: not data), and what the merged progress of the durable covers
was consumed (`Coverage`: covered means consumed)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.ledger import DataId, Ledger
from rsub_dev.sim.shell.params import ShellParams
from sidecar.protocol import Output, StreamMachine, UpdateApplied
from sidecar.protocol.origins import DataEntry, OriginIndex

if TYPE_CHECKING:
    from rsub_dev.sim.shell.durables import Durable


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
    """Covered means consumed: whenever a machine accepts an update of a durable, every
    data message its merged progress covers is a logical message consumed from it, or one
    passing which is excused (`Checks.unconsumed`); an exact client skipping what the
    progress covers after a failover therefore skips only consumed messages. And it covers
    only what was written."""

    def __init__(
        self,
        world: LoopWorld[ShellParams],
        written: dict[str, list[int]],
        durables: list[Durable],
    ) -> None:
        self._world = world
        self._written = written
        self._durables = durables
        self._checked: dict[tuple[str, str], int] = {}
        """Per durable and origin: how many of its data messages (in `written`) are known
        covered well."""

    def accepted(
        self,
        region: str,
        machine: StreamMachine,
        outputs: list[Output],
        unconsumed: Callable[[Durable, DataId], bool],
    ) -> None:
        applied = {o.subscription for o in outputs if isinstance(o, UpdateApplied)}
        for durable in self._durables:
            if durable.name in applied:
                self._covered(region, machine, durable, unconsumed)

    def _covered(
        self,
        region: str,
        machine: StreamMachine,
        durable: Durable,
        unconsumed: Callable[[Durable, DataId], bool],
    ) -> None:
        name = durable.name
        view = machine.subscription(name)
        if view is None:
            return
        progress = dict(view.progress)
        for origin, seq in progress.items():
            written = self._written.get(origin)
            if written is None or seq > (written[-1] if written else 0):
                raise self._world.fail(
                    f"covered: {region}'s progress of {name} {progress} covers "
                    f"({origin}, {seq}), never written"
                )
            k = self._checked.get((name, origin), 0)
            while k < len(written) and written[k] <= seq:
                if unconsumed(durable, (origin, written[k])):
                    raise self._world.fail(
                        f"covered: {region}'s progress of {name} {progress} covers "
                        f"({origin}, {written[k]}), never consumed"
                    )
                k += 1
            self._checked[(name, origin)] = k
        for origin, ranges in view.acked.items():
            written = self._written.get(origin, [])
            for first, last in ranges:
                for seq in written[bisect_left(written, first) : bisect_right(written, last)]:
                    if unconsumed(durable, (origin, seq)):
                        raise self._world.fail(
                            f"covered: {region}'s ranges acked elsewhere of {name} "
                            f"{dict(view.acked)} cover ({origin}, {seq}), never consumed"
                        )
                self._world.stats["acked_ranges_checked"] += 1
        self._world.stats["progress_checked"] += 1
