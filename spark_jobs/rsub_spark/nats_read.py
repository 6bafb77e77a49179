"""Reads sequence ranges of a read stream, synchronously (for Spark's workers), through the
sidecar's NATS adapter: its connection builder, its JetStream request path (`jsapi`) and its
one range reader (`stream_reader.read_range`).

A range is `(start, end]`: every data message (subject `V.>`, never a marker) whose
read-stream sequence `s` satisfies `start < s <= end`. Reading the same range always returns
the same messages as long as the stream still holds them, which is what makes Spark's
retries and checkpoint restarts exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

import structlog
from nats.aio.client import Client as NATS
from nats.js.errors import APIError

from sidecar.config.checks import ConfigError
from sidecar.config.nats import renamed
from sidecar.naming import NamingError, VirtualStream, region_in_stream
from sidecar.nats import jsapi, stream_reader
from sidecar.nats.connection import NatsRefused, NatsUnreachable, connect_once, shown_servers
from sidecar.nats.port import STREAM_NOT_FOUND
from spark_jobs.rsub_spark.options import NATS_OPTIONS, RsubOptions

log = structlog.get_logger(__name__)

T = TypeVar("T")


class RsubReadError(RuntimeError):
    """Reading a read stream failed; the message names the servers, the stream or the range."""


class RsubDataLossError(RsubReadError):
    """Sequences asked for are no longer in the read stream (expired or deleted)."""


@dataclass(frozen=True)
class StreamBounds:
    first_seq: int
    last_seq: int
    allow_direct: bool
    # Origin regions by write stream, taken from the read stream's sources.
    origins: VirtualStream | None


class NatsSession:
    """One NATS connection on a private event-loop thread, used from synchronous code.

    Opens lazily; not picklable by design (create it where it is used).
    """

    def __init__(self, opts: RsubOptions) -> None:
        self._opts = opts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: NATS | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rsub-nats", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def run(self, make: Callable[[NATS], Awaitable[T]]) -> T:
        """Runs `make(connection)` on the session's loop and returns its result."""
        loop = self._ensure_loop()

        async def call() -> T:
            if self._nc is None or self._nc.is_closed:
                self._nc = await connect(self._opts)
            return await make(self._nc)

        future: Future[T] = asyncio.run_coroutine_threadsafe(call(), loop)
        return future.result()

    def close(self) -> None:
        loop, thread, nc = self._loop, self._thread, self._nc
        self._loop, self._thread, self._nc = None, None, None
        if loop is None:
            return
        if nc is not None and not nc.is_closed:
            asyncio.run_coroutine_threadsafe(nc.close(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        loop.close()


async def connect(opts: RsubOptions) -> NATS:
    """Connects to the region's servers once, without retrying; fails naming the servers."""
    try:
        return await connect_once(opts.nats, name=f"rsub-spark {opts.read_stream}")
    except (NatsRefused, NatsUnreachable) as exc:
        raise RsubReadError(str(exc)) from None
    except ConfigError as exc:
        raise RsubReadError(renamed(exc, NATS_OPTIONS)) from None


def _origins(opts: RsubOptions, sources: list[str]) -> VirtualStream | None:
    """The virtual stream whose write streams feed the read stream, for origin columns."""
    pattern = opts.write_stream_pattern
    found = (region_in_stream(pattern, opts.stream, name) for name in sources)
    regions = tuple(region for region in found if region is not None)
    try:
        return VirtualStream(opts.stream, regions, write_pattern=pattern) if regions else None
    except NamingError:
        log.warning("rsub.origins_unparsed", stream=opts.read_stream, regions=regions)
        return None


async def stream_bounds(nc: NATS, opts: RsubOptions) -> StreamBounds:
    """First and last sequence of the read stream; fails naming the stream when absent."""
    try:
        info = await jsapi.request(
            nc, f"STREAM.INFO.{opts.read_stream}", timeout_s=opts.timeout_ms / 1000
        )
    except APIError as err:
        if err.err_code != STREAM_NOT_FOUND:
            raise
        raise RsubReadError(
            f"read stream {opts.read_stream!r} (virtual stream {opts.stream!r}) not found on "
            f"{shown_servers(opts.nats.servers)}"
        ) from None
    state, config = info["state"], info["config"]
    return StreamBounds(
        int(state["first_seq"]),
        int(state["last_seq"]),
        bool(config.get("allow_direct")),
        _origins(opts, [str(source["name"]) for source in config.get("sources") or []]),
    )


def clip_to_bounds(opts: RsubOptions, start: int, end: int, bounds: StreamBounds) -> int:
    """The exclusive start to read from after checking the range against the stream.

    Raises RsubDataLossError for sequences no longer held (unless failOnDataLoss=false).
    """
    if bounds.last_seq < end:
        message = (
            f"read stream {opts.read_stream!r} ends at sequence {bounds.last_seq}, before the "
            f"end {end} of the range asked for: was the stream deleted and created again?"
        )
        if opts.fail_on_data_loss:
            raise RsubDataLossError(message + " (set failOnDataLoss=false to skip)")
        log.warning("rsub.data_loss", stream=opts.read_stream, reason=message)
    if bounds.first_seq > start + 1:
        lost_to = min(end, bounds.first_seq - 1)
        if opts.fail_on_data_loss:
            raise RsubDataLossError(
                f"read stream {opts.read_stream!r} no longer holds sequences {start + 1}.."
                f"{lost_to} (expired or deleted; the stream now starts at {bounds.first_seq}); "
                "set failOnDataLoss=false to skip them"
            )
        log.warning("rsub.data_loss", stream=opts.read_stream, first=start + 1, last=lost_to)
        return bounds.first_seq - 1
    return start


async def read_chunks(
    nc: NATS, opts: RsubOptions, start: int, end: int
) -> AsyncGenerator[tuple[list[stream_reader.Stored], StreamBounds]]:
    """Yields the data messages with start < seq <= end in order, in lists of up to
    `stream_reader.CHUNK`, read by the one range reader (`sidecar.nats.stream_reader`).

    Streams that allow direct get are read with batched direct gets: no consumer, so reads
    also work in a region cut off from the super-cluster's meta leader. Other streams are
    read with an ephemeral ordered push consumer.
    """
    if end <= start:
        return
    bounds = await stream_bounds(nc, opts)
    start = clip_to_bounds(opts, start, end, bounds)
    end = min(end, bounds.last_seq)
    if start >= end:
        return
    chunks = stream_reader.read_range(
        nc,
        opts.read_stream,
        opts.data_filter,
        start + 1,
        end,
        direct=bounds.allow_direct,
        timeout_s=opts.timeout_ms / 1000,
    )
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk, bounds
    except stream_reader.RangeReadError as err:
        raise RsubReadError(f"read {err}") from None  # "read stream 'name': what failed"
    except stream_reader.TailGap as err:
        raise RsubReadError(f"read stream {opts.read_stream!r}: {err}") from None


def iterate_range(
    opts: RsubOptions, start: int, end: int
) -> Iterator[tuple[list[stream_reader.Stored], StreamBounds]]:
    """Synchronous `read_chunks` on a private event loop in the calling thread.

    The loop runs only while a chunk is being read; in between, the server's flow control
    holds the stream back. One thread, no hand-off: faster in Spark's Python workers.
    """
    loop = asyncio.new_event_loop()
    try:
        nc = loop.run_until_complete(connect(opts))
        chunks = read_chunks(nc, opts, start, end)
        try:
            while True:
                try:
                    yield loop.run_until_complete(anext(chunks))
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(chunks.aclose())
            loop.run_until_complete(nc.close())
    finally:
        loop.close()
