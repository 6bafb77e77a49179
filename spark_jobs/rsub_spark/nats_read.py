"""Reads sequence ranges of a read stream with nats-py, synchronously (for Spark's workers).

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
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, ServiceUnavailableError

from sidecar.config.checks import ConfigError
from sidecar.config.nats import renamed
from sidecar.naming import NamingError, VirtualStream, region_in_stream
from sidecar.nats import jsapi
from sidecar.nats.connection import NatsRefused, NatsUnreachable, connect_once, shown_servers
from sidecar.nats.port import STREAM_NOT_FOUND
from spark_jobs.rsub_spark.options import NATS_OPTIONS, RsubOptions
from spark_jobs.rsub_spark.rows import EPOCH, MICROSECOND, Record, rfc3339_micros

log = structlog.get_logger(__name__)

T = TypeVar("T")
CHUNK_ROWS = 8192
_DIRECT_BATCH = 4096
_STALE_RETRIES = 5
# Ephemeral ordered consumers of finished reads disappear after this long.
_CONSUMER_INACTIVE_S = 2.0
_PENDING_MSGS_LIMIT = 1_000_000
_PENDING_BYTES_LIMIT = 512 * 1024 * 1024


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


async def _first_data_seq(nc: NATS, opts: RsubOptions, from_seq: int) -> int | None:
    """The first data sequence at or after `from_seq`, as the stream leader holds it (None:
    none). Raises `ServiceUnavailableError` while the server has no meta leader."""
    msg = await jsapi.msg_get(
        nc,
        opts.read_stream,
        from_seq,
        next_by_subj=opts.data_filter,
        timeout_s=opts.timeout_ms / 1000,
    )
    return None if msg is None else int(msg["seq"])


async def read_chunks(
    nc: NATS, opts: RsubOptions, start: int, end: int
) -> AsyncGenerator[tuple[list[Record], StreamBounds]]:
    """Yields the data messages with start < seq <= end in order, in lists of ~CHUNK_ROWS.

    Streams that allow direct get are read with batched direct gets: no consumer, so reads
    also work in a region cut off from the super-cluster's meta leader. Other streams are
    read with an ephemeral ordered consumer.
    """
    if end <= start:
        return
    bounds = await stream_bounds(nc, opts)
    start = clip_to_bounds(opts, start, end, bounds)
    end = min(end, bounds.last_seq)
    if start >= end:
        return
    chunks = _direct_chunks if bounds.allow_direct else _consumer_chunks
    async with contextlib.aclosing(chunks(nc, opts, start + 1, end)) as read:
        async for chunk in read:
            yield chunk, bounds


async def _direct_chunks(
    nc: NATS, opts: RsubOptions, first: int, end: int
) -> AsyncGenerator[list[Record]]:
    collector = _DirectCollector(opts, first, end)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(
        inbox,
        cb=collector.on_msg,
        pending_msgs_limit=_PENDING_MSGS_LIMIT,
        pending_bytes_limit=_PENDING_BYTES_LIMIT,
    )
    stale_answers = 0
    try:
        while not collector.done:
            request = jsapi.direct_get_batch(
                nc,
                opts.read_stream,
                collector.next_seq,
                # Messages never outnumber sequences: nothing is asked for past `end`.
                min(_DIRECT_BATCH, end - collector.next_seq + 1),
                next_by_subj=">" if collector.every_subject else opts.data_filter,
                reply=inbox,
            )
            await collector.round_trip(request)
            if collector.exhausted:
                collector.exhausted = False
                # Any replica may answer a direct get, and a lagging one says "no message"
                # too early: the stream leader decides whether data is left in the range.
                left: int | None = collector.next_seq
                if not collector.every_subject:
                    try:
                        left = await _first_data_seq(nc, opts, collector.next_seq)
                    except ServiceUnavailableError:
                        # No meta leader: the stream leader refuses STREAM.MSG.GET, but direct
                        # gets still work. Read the rest of the range over every subject,
                        # markers too: one answer reaching `end` comes from a replica that
                        # holds the whole range, so its data messages are all there are.
                        log.info(
                            "rsub.range_end_read_without_leader",
                            stream=opts.read_stream,
                            start=collector.next_seq,
                            end=end,
                        )
                        collector.every_subject = True
                        continue
                # Reading every subject, "no message" before `end` means the replica lags.
                if left is None or left > end:
                    collector.done = True
                else:
                    stale_answers += 1
                    if stale_answers > _STALE_RETRIES:
                        unasked = "; no meta leader to ask" if collector.every_subject else ""
                        raise RsubReadError(
                            f"read stream {opts.read_stream!r}: direct gets keep missing "
                            f"sequence {left} (a lagging replica?{unasked})"
                        )
                    await asyncio.sleep(0.05 * stale_answers)
            if collector.done or len(collector.buffer) >= CHUNK_ROWS:
                chunk, collector.buffer = collector.buffer, []
                if chunk:
                    yield chunk
    finally:
        await sub.unsubscribe()


class _DirectCollector:
    """Gathers the answers of batched direct gets (one batch in flight at a time)."""

    def __init__(self, opts: RsubOptions, first: int, end: int) -> None:
        self._opts = opts
        self._end = end
        self.next_seq = first
        self.buffer: list[Record] = []
        self.done = False
        # The answering replica holds no message asked for at or after next_seq.
        self.exhausted = False
        # Asking for every subject (markers too, left out of the rows), not only data.
        self.every_subject = False
        self._data_prefix = opts.data_filter.removesuffix(">")
        self._error: str | None = None
        self._answered = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is not None:
            if status == "404":
                self.exhausted = True
            elif status != "204":  # 204: end of this batch
                self._error = f"{status} {headers.get('Description', '')}".strip()
            self._answered.set()
            return
        if self.done:
            return
        seq = int(headers["Nats-Sequence"])
        if seq > self._end:
            self.done = True
            return
        subject = headers["Nats-Subject"]
        if subject.startswith(self._data_prefix):
            stored = rfc3339_micros(headers["Nats-Time-Stamp"])
            self.buffer.append((seq, subject, msg.data, headers, stored or 0))
        self.next_seq = seq + 1
        if seq == self._end:
            self.done = True

    async def round_trip(self, request: Awaitable[None]) -> None:
        """Sends one batch request and waits until its last answer came."""
        self._answered.clear()
        before = self.next_seq
        await request
        timeout = self._opts.timeout_ms / 1000
        try:
            await asyncio.wait_for(self._answered.wait(), timeout)
        except TimeoutError:
            raise RsubReadError(
                f"read stream {self._opts.read_stream!r}: no answer to a direct get from "
                f"sequence {before} within {timeout:g}s"
            ) from None
        if self._error is not None:
            raise RsubReadError(
                f"read stream {self._opts.read_stream!r}: direct get from sequence {before} "
                f"failed: {self._error}"
            )
        if not self.done and not self.exhausted and self.next_seq == before:
            raise RsubReadError(
                f"read stream {self._opts.read_stream!r}: direct get from sequence {before} "
                "returned nothing"
            )


async def _consumer_chunks(
    nc: NATS, opts: RsubOptions, first: int, end: int
) -> AsyncGenerator[list[Record]]:
    start_at = await _first_data_seq(nc, opts, first)
    if start_at is None or start_at > end:
        return
    collector = _ConsumerCollector(opts, start_at, end)
    js = nc.jetstream(timeout=opts.timeout_ms / 1000)
    sub = await js.subscribe(
        opts.data_filter,
        stream=opts.read_stream,
        cb=collector.on_msg,
        ordered_consumer=True,
        inactive_threshold=_CONSUMER_INACTIVE_S,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_at
        ),
        pending_msgs_limit=_PENDING_MSGS_LIMIT,
        pending_bytes_limit=_PENDING_BYTES_LIMIT,
    )
    try:
        while True:
            chunk, done = await collector.next_chunk()
            if chunk:
                yield chunk
            if done:
                return
    finally:
        await sub.unsubscribe()


class _ConsumerCollector:
    """Gathers the messages of one range from an ordered consumer (no await per message)."""

    def __init__(self, opts: RsubOptions, first: int, end: int) -> None:
        self._opts = opts
        self._end = end
        self._last = first - 1
        self._buffer: list[Record] = []
        self._received = 0
        self._done = False
        self._ready = asyncio.Event()

    async def on_msg(self, msg: Msg) -> None:
        if self._done:
            return
        meta = msg.metadata
        seq = meta.sequence.stream
        self._received += 1
        if seq <= self._end:
            stored = (meta.timestamp - EPOCH) // MICROSECOND
            self._buffer.append((seq, msg.subject, msg.data, msg.headers, stored))
            self._last = seq
        # num_pending == 0: no data message follows, so none is left at or below `end`.
        if seq >= self._end or meta.num_pending == 0:
            self._done = True
        if self._done or len(self._buffer) >= CHUNK_ROWS:
            self._ready.set()

    async def next_chunk(self) -> tuple[list[Record], bool]:
        """The messages gathered so far (waiting for a full chunk), and whether all came."""
        timeout = self._opts.timeout_ms / 1000
        while not self._done and len(self._buffer) < CHUNK_ROWS:
            seen = self._received
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                if self._received == seen:
                    raise RsubReadError(
                        f"read stream {self._opts.read_stream!r}: no message after sequence "
                        f"{self._last} within {timeout:g}s while reading up to {self._end}"
                    ) from None
        chunk, self._buffer = self._buffer, []
        return chunk, self._done


def iterate_range(
    opts: RsubOptions, start: int, end: int
) -> Iterator[tuple[list[Record], StreamBounds]]:
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
