"""The runtime's clock: the machine has none, every timestamp reaches it from the one clock
the runtime is given (`RegionHandles.clock`): the wall clock by default, a simulation's
virtual time under simulation."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]
"""Now, in milliseconds since the Unix epoch."""


def wall_clock_ms() -> int:
    return int(time.time() * 1000)
