"""Stream discovery: the virtual streams of the account that this sidecar follows unlisted.

`found_streams` is the pure part: from the names of the account's streams it picks the
virtual streams whose read stream in this region is named by `discovery.read_stream`, whose
name matches a glob of `discovery.match`, that are not listed in `streams` (a listed
stream's own settings win), and whose write stream in this region exists too (the sidecar
publishes its markers there). It never creates a stream: the topology is the operator's
(`rsub topology apply`), and a stream is taken up once it is there.

`StreamDiscovery` runs it every `discovery.interval_s` on one paged `STREAM.NAMES` listing
(through the region's port, as its check of a read stream) and tells the root what to start (`add`) and what to stop (`drop`). A stream is dropped only
when its read stream is confirmed deleted (a `STREAM.INFO` answering "stream not found"):
a name missing from a listing may be a page that shifted under a concurrent delete, and a
listing that fails drops nothing. Dropping is safe whenever it happens: a stopped driver
only stops acting, and a stream found again is rebuilt from its read stream like a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from sidecar.config.schema import Config
from sidecar.metrics import SidecarMetrics
from sidecar.naming import NamingError, VirtualStream, name_in_stream
from sidecar.nats.port import STREAM_NOT_FOUND, JetStreamPort

log = structlog.get_logger(__name__)

_REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Found:
    """What one listing shows: the virtual streams to run, and those left aside with why."""

    streams: dict[str, VirtualStream] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def found_streams(names: Iterable[str], config: Config) -> Found:
    """The discoverable virtual streams among the account's stream `names` (pure)."""
    existing = set(names)
    discovery, region = config.discovery, config.region
    listed = {s.name for s in config.streams}
    found = Found()
    for stream in sorted(existing):
        name = name_in_stream(discovery.read_stream, region, stream)
        if name is None or name in listed or not discovery.matches(name):
            continue
        try:
            vs = discovery.virtual_stream(name, config.regions)
        except NamingError as err:
            found.skipped[name] = f"breaks the naming contract: {err}"
            continue
        if vs.write_stream(region) not in existing:
            found.skipped[name] = f"its write stream {vs.write_stream(region)!r} does not exist"
            continue
        found.streams[name] = vs
    return found


class StreamDiscovery:
    """Lists the account's streams every `interval_s`; `add`s the streams found, `drop`s the
    ones whose read stream is gone. `running` is what it has taken up."""

    def __init__(
        self,
        config: Config,
        port: JetStreamPort,
        metrics: SidecarMetrics,
        *,
        add: Callable[[VirtualStream], None],
        drop: Callable[[str], Awaitable[None]],
    ) -> None:
        self._config = config
        self._port = port
        self._metrics = metrics
        self._add = add
        self._drop = drop
        self.running: dict[str, VirtualStream] = {}
        self._skipped: dict[str, str] = {}

    async def round(self) -> None:
        """List once; raises the NATS error when the listing fails (nothing changes then)."""
        names = await self._port.stream_names(timeout_s=_REQUEST_TIMEOUT_S)
        self._metrics.discovery_round(listed=True)
        found = found_streams(names, self._config)
        for name, vs in found.streams.items():
            if name not in self.running:
                self.running[name] = vs
                log.info(
                    "stream_discovered",
                    stream=name,
                    read_stream=vs.read_stream(self._config.region),
                    write_stream=vs.write_stream(self._config.region),
                )
                self._metrics.stream_discovered()
                self._add(vs)
        for name in [n for n in self.running if n not in found.streams]:
            if await self._read_stream_gone(self.running[name]):
                del self.running[name]
                log.warning("stream_dropped", stream=name, reason="read stream deleted")
                await self._drop(name)
        self._report_skipped(found.skipped)
        self._metrics.set_streams("discovered", len(self.running))

    async def run(self) -> None:
        """A round every `interval_s` until cancelled; a failed round is logged, counted and
        retried at the next one."""
        while True:
            await asyncio.sleep(self._config.discovery.interval_s)
            try:
                await self.round()
            except (TimeoutError, NatsError, OSError) as err:
                self._metrics.discovery_round(listed=False)
                log.warning("discovery_failed", error=repr(err))

    async def _read_stream_gone(self, vs: VirtualStream) -> bool:
        """Whether `vs`'s read stream here is deleted: only a "stream not found" says so."""
        stream = vs.read_stream(self._config.region)
        try:
            await self._port.stream_info(stream, timeout_s=_REQUEST_TIMEOUT_S)
        except APIError as err:
            if err.err_code == STREAM_NOT_FOUND:
                return True
            log.warning("discovery_check_failed", stream=vs.name, error=repr(err))
        except (TimeoutError, NatsError) as err:
            log.warning("discovery_check_failed", stream=vs.name, error=repr(err))
        return False

    def _report_skipped(self, skipped: dict[str, str]) -> None:
        """Log a stream left aside once per reason (every round would repeat it)."""
        for name, reason in skipped.items():
            if self._skipped.get(name) != reason:
                log.warning("stream_skipped", stream=name, reason=reason)
        self._skipped = dict(skipped)
