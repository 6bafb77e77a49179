"""The interval loop's tick: the shorter of the snapshot and the progress interval, with the
sweep's period kept in snapshot intervals (pure: no server)."""

from __future__ import annotations

import pytest

from sidecar.config.nats import NatsConfig
from sidecar.nats.connection import NatsConnection
from sidecar.runtime.handles import RegionHandles
from sidecar.runtime.intervals import IntervalLoop


def loop(interval_ms: int, sweep: int, tick_ms: int | None) -> IntervalLoop:
    connection = NatsConnection(NatsConfig(servers=("nats://127.0.0.1:4222",)), name="west")
    handles = RegionHandles("west", connection, port=None, clock=lambda: 0)  # type: ignore[arg-type]
    return IntervalLoop(handles, interval_ms, sweep, tick_ms=tick_ms)


@pytest.mark.parametrize(
    ("interval_ms", "sweep", "tick_ms", "tick_s", "sweep_ticks"),
    [
        (1_000, 120, None, 1.0, 120),
        (1_000, 120, 250, 0.25, 480),
        (1_000, 120, 100, 0.1, 1_200),
        (500, 120, 2_000, 0.5, 120),  # a longer progress interval does not slow the loop
        (1_000, 1, 300, 0.3, 3),
    ],
)
def test_the_tick_and_the_sweep(
    interval_ms: int, sweep: int, tick_ms: int | None, tick_s: float, sweep_ticks: int
) -> None:
    intervals = loop(interval_ms, sweep, tick_ms)
    assert intervals._interval_s == pytest.approx(tick_s)
    assert intervals._sweep == sweep_ticks
