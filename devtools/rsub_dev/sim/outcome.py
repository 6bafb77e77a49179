"""What every simulated world returns, how it stops at a broken property, and the frame of
the worlds that run real asyncio code on looptime's virtual time."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass
from typing import Generic, TypeVar

import looptime
import structlog

P = TypeVar("P")


class Violation(Exception):
    """A property broken: the run ends, its message is the result's `violation`."""


@dataclass(slots=True)
class SimResult(Generic[P]):
    """One run: its seed and parameters, the first violation (None: none), the last events
    and the counts."""

    seed: int
    params: P
    violation: str | None
    trace: list[str]
    stats: dict[str, int]

    def report(self) -> str:
        lines = [f"seed={self.seed} params={self.params}", f"stats={self.stats}"]
        if self.violation:
            lines += [f"VIOLATION: {self.violation}", "last events:", *self.trace]
        return "\n".join(lines)


class LoopWorld(Generic[P]):
    """A run of real asyncio code on looptime's event loop (time moves only when every task
    waits), from one seed: its trace, counts and first violation. `_main` is the run."""

    def __init__(self, seed: int, params: P, trace_len: int) -> None:
        self.seed = seed
        self.p = params
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self._trace_len = trace_len
        self.stats: Counter[str] = Counter()
        self.violation: str | None = None
        self._failed = asyncio.Event()

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def note(self, what: str) -> None:
        self.trace.append(f"{self.now_ms():>8}ms {what}")
        del self.trace[: -self._trace_len]

    def fail(self, message: str) -> Violation:
        """Record the run's first violation (`_main` then ends the run); the exception to
        raise where it was found."""
        if self.violation is None:
            self.violation = message
            self.note(f"VIOLATION {message}")
            self._failed.set()
        return Violation(message)

    async def until(self, at_ms: int) -> bool:
        """Run until `at_ms` of virtual time; whether a violation ended it first."""
        remaining = at_ms / 1000 - asyncio.get_running_loop().time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._failed.wait(), max(0.0, remaining))
        return self.violation is not None

    async def _main(self) -> None:
        raise NotImplementedError

    def run(self) -> SimResult[P]:
        # No no-op cycles before time moves (looptime's default is 42): nothing outside the
        # loop (no socket, no thread) can wake a world, so those cycles only spun the loop
        # and the runs stay the same (what it saves: docs/simulation.md, its speed figures).
        loop = looptime.new_event_loop(start=0, noop_cycles=0)
        try:
            # What the real code logs is its business, not the run's report.
            with structlog.testing.capture_logs():
                loop.run_until_complete(self._main())
        except Violation:
            pass  # recorded (`fail`)
        finally:
            loop.close()
        return SimResult(self.seed, self.p, self.violation, list(self.trace), dict(self.stats))
