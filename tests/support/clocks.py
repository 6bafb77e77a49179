"""A clock a test moves by hand: `clock.now` seconds, read by calling it (the clock `Lease`,
`Member` and `SidecarMetrics` take)."""

from __future__ import annotations


class HandClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
