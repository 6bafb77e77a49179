"""Applied (the deleted protocol world's property, on the runtime's time): after a leader's machine accepted
an update of a durable naming its region at position p (`UpdateApplied`), the copy there
stands at or beyond p (or has delivered that far) by the second current positions read its
machine applies since, unless its user changed a durable in the region since its machine
last read them (it decided on a position read before), a move or creation of it failed
(retried follows that), or the replica no longer leads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rsub_dev.sim.outcome import LoopWorld
from rsub_dev.sim.shell.params import ShellParams
from sidecar.protocol import Output, StreamMachine, UpdateApplied

if TYPE_CHECKING:
    from rsub_dev.sim.shell.checks import Checks


class Applied:
    """Applied, for one incarnation (`name`) of a sidecar replica of `region`."""

    def __init__(
        self, world: LoopWorld[ShellParams], checks: Checks, name: str, region: str
    ) -> None:
        self._world = world
        self._checks = checks
        self._name = name
        self._region = region
        self._owed: dict[str, tuple[int, int, int]] = {}
        """Per durable: the position accepted, the user's changes then, the current reads
        applied since."""

    def asked(self, machine: StreamMachine, outputs: list[Output], changes: int) -> None:
        """`changes`: the user's changes in the region as its machine last read them (one
        it has not read since excuses it)."""
        for o in outputs:
            if isinstance(o, UpdateApplied) and o.position is not None and machine.is_leader:
                self._owed[o.subscription] = (o.position, changes, 0)

    def failed(self, name: str) -> None:
        self._owed.pop(name, None)

    def read(self, machine: StreamMachine, current: bool) -> None:
        if not current or not self._owed:
            return
        if not machine.is_leader:
            self._owed.clear()
            return
        checks = self._checks
        for name, (position, changes, reads) in list(self._owed.items()):
            standing = checks.standing(self._region, name)
            info = checks.consumer(self._region, name)
            delivered = info.delivered.stream_seq if info is not None else -1
            if (
                max(standing or -1, delivered) >= position
                or checks.user_changes[self._region] > changes
            ):
                del self._owed[name]
                self._world.stats["applied_checked"] += 1
            elif reads + 1 < 2:
                self._owed[name] = (position, changes, reads + 1)
            else:
                raise self._world.fail(
                    f"applied: {self._name} accepted an update of {name} to {position}, not "
                    f"carried out in two reads (it stands at {standing})"
                )
