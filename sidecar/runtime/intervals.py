"""`IntervalLoop`: the interval of every stream of a region, in one task, and the positions
reads the machines ask for, carried out by a few reader tasks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import structlog
from nats.errors import Error as NatsError

from sidecar.nats import signals
from sidecar.nats.cursors import cursor_commits
from sidecar.nats.port import Listener
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles

log = structlog.get_logger(__name__)

_TAIL_RETRY_S = 0.5
# Position reads in flight at once over the region's streams.
_READERS = 16
# The streams are taken in this many groups, spread over each interval.
_PHASES = 10


def cadence(interval_ms: int, sweep_intervals: int, tick_ms: int | None) -> tuple[float, int]:
    """The loop's tick in seconds, the shorter of the snapshot interval and `tick_ms` (the
    progress interval), and the sweep's period in ticks: it stays `sweep_intervals` snapshot
    intervals whatever the tick."""
    tick = min(interval_ms, tick_ms or interval_ms)
    return tick / 1000, max(1, round(sweep_intervals * interval_ms / tick))


class IntervalLoop:
    """Every `tick_ms` (by default `interval_ms`, the snapshot interval; the progress
    interval when shorter), in `_PHASES` groups spread over it, each driver's `interval`
    (cheap, no I/O: it posts a job only when its machine has something to be told or asked
    for, see `StreamDriver.interval`); the positions reads the machines ask for
    (`ReadPositions`) wait in one queue for `_READERS` tasks. Each stream's sweep comes once
    per `sweep_intervals` snapshot intervals, the streams' sweeps spread over them. A machine
    starts its snapshots by its own clock (`MachineConfig.interval_ms`), so a shorter tick only
    reads positions and sends vectors sooner after a signal. The work of an
    interval grows with the streams that changed, not with all streams; the signals come from
    `sidecar.nats.signals` and `cursor_commits`.
    """

    def __init__(
        self,
        handles: RegionHandles,
        interval_ms: int,
        sweep_intervals: int,
        *,
        tick_ms: int | None = None,
    ) -> None:
        self._drivers: list[StreamDriver] = []
        self._by_name: dict[str, StreamDriver] = {}
        self._signals: dict[str, list[Listener]] = {}
        self._handles = handles
        self._interval_s, self._sweep = cadence(interval_ms, sweep_intervals, tick_ms)
        self._queue: asyncio.Queue[StreamDriver] = asyncio.Queue()

    @property
    def reads_waiting(self) -> int:
        """Positions reads queued, not yet taken by a reader."""
        return self._queue.qsize()

    async def add(self, driver: StreamDriver) -> None:
        """Take `driver` (rebuilt) into the intervals, its consumer signals followed (the
        port keeps the listeners across reconnects) and its reads queued here."""
        read_stream = driver.vs.read_stream(self._handles.region)
        name = driver.vs.name
        self._signals[name] = await signals.follow_consumers(
            self._handles.port, read_stream, driver.moved, driver.acked
        )
        driver.read_later = self._queue.put_nowait
        self._drivers.append(driver)
        self._by_name[name] = driver

    async def remove(self, driver: StreamDriver) -> None:
        """Stop the intervals and the signals of `driver` (a stream no longer run here)."""
        name = driver.vs.name
        if self._by_name.pop(name, None) is None:
            return
        self._drivers.remove(driver)
        for listener in self._signals.pop(name, []):
            with contextlib.suppress(NatsError):
                await listener.stop()

    async def run(self) -> None:
        readers = [asyncio.create_task(self._reader()) for _ in range(_READERS)]
        try:
            for step in itertools.count(_PHASES):
                await asyncio.sleep(self._interval_s / _PHASES)
                self.interval(*divmod(step, _PHASES))
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    def interval(self, count: int, phase: int) -> None:
        """Interval `count` of the streams in `phase`: one in `_PHASES` of the streams, so
        that their snapshots do not all start (and load both regions) at the same instant."""
        now = self._handles.clock()
        for i in range(phase, len(self._drivers), _PHASES):
            self._drivers[i].interval(now, sweep=(i + count) % self._sweep == 0)
        log.debug("interval", phase=phase, reads_waiting=self.reads_waiting)

    async def _reader(self) -> None:
        connection = self._handles.conn
        while True:
            driver = await self._queue.get()
            # Unconnected, a request would only wait for its timeout: failed at once, the
            # machine asks again at the next interval.
            await driver.refresh(connected=connection.connected)

    async def follow_cursors(self, bucket: str) -> None:
        """Mark a stream whenever one of its cursors is written (by any replica)."""
        by_name = self._by_name
        while True:
            try:
                async for stream in cursor_commits(self._handles.port, bucket):
                    driver = by_name.get(stream)
                    if driver is not None:
                        driver.moved()
                log.warning("cursor_tail_ended", bucket=bucket)
            except (TimeoutError, NatsError, OSError) as err:
                log.warning("cursor_tail_failed", bucket=bucket, error=repr(err))
            await asyncio.sleep(_TAIL_RETRY_S)
