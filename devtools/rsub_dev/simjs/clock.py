"""Virtual time: the simulated JetStream reads the time from a clock it is given, never the wall.

A clock is any object with `now_ms()` (milliseconds since the Unix epoch, never decreasing);
`ManualClock` is one that only moves when told to. Times the server reports as text (a
stream's `created`) are written the way Go writes `time.RFC3339Nano` in UTC, because the
server hashes that text into a stream's identity (`rsub_dev.simjs.stream.stream_identity`);
the simulation adds a count of streams created to the nanoseconds of a creation time, so
that two streams created in the same millisecond still differ, as on a real server.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch; never decreasing."""
        ...


class ManualClock:
    """A clock that stands still until `advance` or `set` moves it (forward only)."""

    def __init__(self, start_ms: int = 0) -> None:
        if start_ms < 0:
            raise ValueError(f"start_ms must not be negative, got {start_ms}")
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError(f"a clock only moves forward, got {ms} ms")
        self._now += ms

    def set(self, now_ms: int) -> None:
        if now_ms < self._now:
            raise ValueError(f"a clock only moves forward: {now_ms} ms is before {self._now} ms")
        self._now = now_ms


def rfc3339_nano(ns: int) -> str:
    """`ns` (nanoseconds since the Unix epoch) as Go's `time.RFC3339Nano` writes it in UTC:
    `2026-01-02T03:04:05.5Z` (the fraction without trailing zeros, no point when it is 0)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    moment = _EPOCH + timedelta(seconds=seconds)
    digits = f"{fraction:09d}".rstrip("0")
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{digits}" if digits else "") + "Z"
