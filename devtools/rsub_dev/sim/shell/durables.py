"""The replicated durables of the runtime's world (`ShellParams.durables`): each has a home
region (the i-th durable's first home is region i modulo the regions), an application
consuming it there, the ledger of what that application consumed, and its own excuses
(`limits.Excuses`: how far its copies got). A failover moves the durables homed in the lost
region, a move (`moves`) one durable; every per-durable check runs for each."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rsub_dev.sim.shell.ledger import DataId
from rsub_dev.sim.shell.limits import Excuses


@dataclass(eq=False, slots=True)
class Durable:
    name: str
    first_home: str
    home: str
    """Where its application consumes now (a failover, a move or a return changes it)."""
    consumed: Counter[DataId]
    """How many times its application consumed each data message (origin, origin seq)."""
    excuses: Excuses
    """Why passing a message it never consumed may not be a loss (`limits`)."""
    deleted: set[str] = field(default_factory=set)
    """Regions where its user deleted it and did not create it again."""
    reached: dict[str, int] = field(default_factory=dict)
    """Per region, the last sequence a sidecar moved or created it past."""
