"""Reading one subject filter of a stream: a stored range, what is stored now, what comes.

- `read_range()` yields the matching messages of a range of sequences as they are stored, in
  lists: with batched direct gets (no consumer: it works without a JetStream meta leader,
  which the Spark source needs in a region cut off from the others), or else `replay`'s. The
  Spark source reads its ranges with it; the sidecar's rebuild reads what is stored with
  `read_stored()`, `read_range()` up to the stream's last sequence.
- `replay()` yields exactly the matching messages stored when it is called (up to a last
  sequence, if given), for a rebuild at startup: the ordered push consumer of `tail`, ended
  after the messages pending at its creation (its count then) and deleted.
- `tail()` yields them from a start sequence on, live (an ordered push consumer: flow
  control, idle heartbeats, no acks); it raises `TailGap` when a delivery is missing or the
  server went silent. Restart it from `last seq + 1` when it ends.

The consumer of `tail` and `replay` is named here, not by the server, so that a creation the
server left unanswered (timed out, no responders, JetStream unavailable: an overloaded
server) is asked again under the same name, inbox and configuration: the server answers with
the consumer the unanswered request made, or makes it then; never a second one, which would
stay until its `inactive_threshold` and add to the servers' work when they can least afford
it (docs/benchmarks.md, "Start-up"). After `_CREATE_ATTEMPTS` it gives up and deletes that
name, best effort. Each creation asked again is logged (`consumer_creation_asked_again`) and
reported to the reading task's count (`port.counting_creations_asked_again`).

The push consumer is the fastest reader of the three: `bench/bench_tail.py`, figures in
docs/benchmarks.md ("Reading a stored range"). With `headers_only` the server sends each
message's headers with an empty payload, plus a `Nats-Msg-Size` header holding the
payload's size (consumers only: a direct get always sends the payload).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext, api
from nats.js.errors import ServiceUnavailableError
from nats.nuid import NUID

from sidecar.nats import jsapi
from sidecar.nats.port import creation_asked_again

log = structlog.get_logger(__name__)

# A stored message as a range is read: (sequence, subject, payload, headers, the time it was
# stored in unix microseconds). A plain tuple: the Spark source makes one per row.
Stored = tuple[int, str, bytes, dict[str, str] | None, int]
# Messages per list `read_range` yields (no await per message in between).
CHUNK = 8192
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
_DIRECT_BATCH = 4096
_STALE_RETRIES = 5
_PENDING_MSGS_LIMIT = 1_000_000
_PENDING_BYTES_LIMIT = 512 * 1024 * 1024
_REPLAY_INACTIVE_S = 60.0
_REQUEST_TIMEOUT_S = 5.0
_TAIL_HEARTBEAT_S = 10.0
# A tail that hears nothing over one whole check period (a heartbeat and a half) starts
# again: silence is noticed between one and two periods after the last message.
_TAIL_SILENCE_S = 1.5 * _TAIL_HEARTBEAT_S
_CONSUMER_STALLED = "Nats-Consumer-Stalled"
# A consumer creation the server left unanswered is asked again under the same name, up to
# this many attempts in all, after a wait of about `_CREATE_BACKOFF_S` doubled each time
# (jittered: thousands of tails asking again at once would meet the same overload again).
_CREATE_ATTEMPTS = 4
_CREATE_BACKOFF_S = 0.5
_UNANSWERED = (asyncio.TimeoutError, NoRespondersError, ServiceUnavailableError)
# The consumers' names: 22 characters of [0-9A-Za-z], within the server's name rules.
_names = NUID()
# `read_stored` with `headers_only` reads a stream holding more than this with a consumer
# that sends headers only, not with direct gets (which send every payload): two JetStream
# meta operations (its creation and deletion) are worth paying to keep megabytes off the wire.
DIRECT_MAX_BYTES = 8 * 1024 * 1024


def _consumer_config(
    name: str, filter_subject: str, inbox: str, start_seq: int, headers_only: bool
) -> dict[str, Any]:
    """An ordered push consumer's configuration (the server's JSON: durations in ns)."""
    config: dict[str, Any] = {
        "name": name,
        "filter_subject": filter_subject,
        "deliver_subject": inbox,
        "ack_policy": "none",
        "max_deliver": 1,
        "flow_control": True,
        "idle_heartbeat": int(_TAIL_HEARTBEAT_S * 1e9),
        "inactive_threshold": int(_REPLAY_INACTIVE_S * 1e9),
        "mem_storage": True,
        "num_replicas": 1,
        "headers_only": headers_only,
        "deliver_policy": "all",
    }
    if start_seq > 1:
        config.update(deliver_policy="by_start_sequence", opt_start_seq=start_seq)
    return config


class TailGap(NatsError):
    """A tail lost its place (a delivery missing, or the server silent too long): start a new
    one after the last message taken."""


def tail(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    start_seq: int,
    *,
    headers_only: bool = False,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[Msg, None]:
    """Yield the messages on `filter_subject` of `stream` from `start_seq` on, in stream
    order, until the server goes silent or a delivery is missing (`TailGap`), or the
    connection closes; restart it from `last seq + 1` then. `opened` is called once the
    server created its consumer (before any message).

    An ordered push consumer written here rather than nats-py's (`ordered_consumer=True`):
    that one runs a task per subscription polling its flow control every 250 ms, which at
    thousands of tails was most of an idle sidecar's CPU. Here the flow-control request is
    answered when it is read (every message before it has been yielded and taken, as the
    server asks), and the server's idle heartbeats (every `_TAIL_HEARTBEAT_S`) are only
    waited for.
    """
    return _ordered(
        js, stream, filter_subject, start_seq, headers_only, stored=False, last=None, opened=opened
    )


def replay(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    *,
    start_seq: int = 1,
    last: int | None = None,
    headers_only: bool = False,
) -> AsyncGenerator[Msg, None]:
    """Yield the messages on `filter_subject` stored in `stream` (`start_seq` <= seq, and
    seq <= `last` if given) at the time of the call, in stream order: `tail`'s consumer,
    ended after the messages pending at its creation, and deleted then. Raises `TailGap` as
    `tail` does."""
    return _ordered(js, stream, filter_subject, start_seq, headers_only, stored=True, last=last)


async def _ordered(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    start_seq: int,
    headers_only: bool,
    *,
    stored: bool,
    last: int | None,
    opened: Callable[[], None] | None = None,
) -> AsyncGenerator[Msg, None]:
    """The ordered push consumer of `tail` (`stored`: of `replay`); `opened` is called once
    its consumer is created."""
    nc = js._nc  # the connection behind `js` (nats-py keeps no public handle on it)
    # Messages come through a callback into a queue of our own, and silence is checked by
    # one timer per `_TAIL_SILENCE_S`, not per message: nats-py's `next_msg(timeout=)` makes
    # a task, a timer and a uuid for every message, a large share of a loaded sidecar's CPU.
    received: asyncio.Queue[Msg | None] = asyncio.Queue()
    heard = True
    loop = asyncio.get_running_loop()
    watchdog: asyncio.TimerHandle | None = None

    async def deliver(msg: Msg) -> None:
        nonlocal heard
        heard = True
        headers = msg.headers
        idle = headers and api.Header.STATUS in headers and _CONSUMER_STALLED not in headers
        if idle and not msg.reply:
            return  # an idle heartbeat: heard, nothing to answer (most of an idle tail's work)
        received.put_nowait(msg)

    def check_silence() -> None:
        nonlocal heard, watchdog
        if heard:
            heard = False
            watchdog = loop.call_later(_TAIL_SILENCE_S, check_silence)
        else:
            received.put_nowait(None)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=deliver)
    name = _names.next().decode()
    created: dict[str, Any] | None = None
    try:
        config = _consumer_config(name, filter_subject, inbox, start_seq, headers_only)
        created = await _create(nc, stream, name, config)
        # Silence counts from the creation on (asking again may take longer than a check).
        heard = True
        watchdog = loop.call_later(_TAIL_SILENCE_S, check_silence)
        if opened is not None:
            opened()
        # Replaying: the messages pending at the consumer's creation are those stored then,
        # with any it delivered before it answered (a creation asked again answers with the
        # consumer an unanswered one made, which delivers from then on: to `received`).
        remaining = -1
        if stored:
            remaining = int(created.get("num_pending", 0))
            remaining += int(created.get("delivered", {}).get("consumer_seq", 0))
        delivered = 0
        while remaining:
            msg = await received.get()
            if msg is None:
                raise TailGap(f"{stream}: no message nor heartbeat for {_TAIL_SILENCE_S} s")
            headers = msg.headers
            if headers and api.Header.STATUS in headers:
                # 100: a flow-control request, or a heartbeat reporting a stall (answered:
                # taken so far); idle heartbeats stop at `deliver`.
                reply = msg.reply or headers.get(_CONSUMER_STALLED)
                if reply:
                    await nc.publish(reply)
                continue
            meta = msg.metadata
            if meta.sequence.consumer != delivered + 1:
                raise TailGap(f"{stream}: delivery {meta.sequence.consumer} after {delivered}")
            delivered = meta.sequence.consumer
            if last is not None and meta.sequence.stream > last:
                return
            remaining -= 1
            yield msg
    finally:
        if watchdog is not None:
            watchdog.cancel()
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()
        if stored and created is not None:
            await _delete(nc, stream, name)


async def _create(nc: Client, stream: str, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Create the consumer `name` of `stream` (its info as the server answers), asking again
    under the same name while the server leaves it unanswered, up to `_CREATE_ATTEMPTS` in
    all; raises the last attempt's error then. With action `create` the same configuration
    under the same name answers with the consumer already made (a different one would be an
    error, "consumer already exists": never another consumer).

    The name goes in the configuration, on the subject without it (`CONSUMER.CREATE.<stream>`,
    from which the server takes the configuration's name, as it takes the subject's from
    `CONSUMER.CREATE.<stream>.<name>`, to the same effect): the permissions docs/security.md
    grants (the cursor tail's `$JS.API.CONSUMER.CREATE.KV_<bucket>`) stay valid."""
    body = {"stream_name": stream, "config": config, "action": "create"}
    delay_s = _CREATE_BACKOFF_S
    attempt = 1
    while True:
        try:
            return await jsapi.request(
                nc, f"CONSUMER.CREATE.{stream}", body, timeout_s=_REQUEST_TIMEOUT_S
            )
        except _UNANSWERED as err:
            if attempt == _CREATE_ATTEMPTS:
                await _delete(nc, stream, name)  # one of the attempts may have made it
                raise
            wait_s = delay_s * random.uniform(0.5, 1.0)
            log.warning(
                "consumer_creation_asked_again",
                stream=stream,
                consumer=name,
                attempt=attempt + 1,
                error=repr(err),
                retry_in_s=round(wait_s, 3),
            )
            creation_asked_again()
            await asyncio.sleep(wait_s)
            delay_s *= 2
            attempt += 1


async def _delete(nc: Client, stream: str, name: str) -> None:
    """Delete the consumer `name`, best effort: without its inbox it also expires on its own
    after `_REPLAY_INACTIVE_S`."""
    with contextlib.suppress(NatsError, asyncio.TimeoutError):
        await jsapi.request(nc, f"CONSUMER.DELETE.{stream}.{name}", timeout_s=_REQUEST_TIMEOUT_S)


async def read_range(
    nc: Client,
    stream: str,
    filter_subject: str,
    first: int,
    last: int,
    *,
    direct: bool,
    timeout_s: float,
) -> AsyncGenerator[list[Stored], None]:
    """Yield the messages on `filter_subject` with `first` <= seq <= `last`, in stream order,
    in lists of up to `CHUNK`: with batched direct gets when `direct` (the stream allows
    them; `last` no later than its last sequence), else with `replay`. `timeout_s` bounds
    each direct get. Raises `RangeReadError` when the range cannot be read whole, and what
    `replay` raises."""
    if last < first:
        return
    if direct:
        reader = _direct_chunks(nc, stream, filter_subject, first, last, timeout_s)
    else:
        reader = _replayed_chunks(nc.jetstream(), stream, filter_subject, first, last)
    async with contextlib.aclosing(reader):
        async for chunk in reader:
            yield chunk


async def read_stored(
    nc: Client, stream: str, filter_subject: str, start_seq: int, *, headers_only: bool
) -> AsyncGenerator[Stored, None]:
    """Yield the messages on `filter_subject` stored in `stream` (seq >= `start_seq`) when it
    is called, in stream order (the sidecar's rebuild): the stream's last sequence, size and
    whether it allows direct gets are read first (`STREAM.INFO`, answered by the stream
    leader), then what it held up to that sequence: with direct gets (`read_range`) where the
    stream allows them (with `headers_only`: and holds at most `DIRECT_MAX_BYTES`), else
    with `replay`'s consumer. With direct gets no
    consumer is created and deleted: at thousands of streams those were most of the servers'
    work of a sidecar's start-up (docs/benchmarks.md, "Start-up")."""
    info = await jsapi.request(nc, f"STREAM.INFO.{stream}", timeout_s=_REQUEST_TIMEOUT_S)
    state = info["state"]
    last = int(state["last_seq"])
    small = not headers_only or int(state.get("bytes", 0)) <= DIRECT_MAX_BYTES
    if not (small and info["config"].get("allow_direct")):
        messages = replay(
            nc.jetstream(),
            stream,
            filter_subject,
            start_seq=start_seq,
            last=last,
            headers_only=headers_only,
        )
        async with contextlib.aclosing(messages):
            async for msg in messages:
                yield _stored(msg)
        return
    chunks = read_range(
        nc, stream, filter_subject, start_seq, last, direct=True, timeout_s=_REQUEST_TIMEOUT_S
    )
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            for stored in chunk:
                yield stored


def _stored(msg: Msg) -> Stored:
    """A message a consumer delivered, as a range is read."""
    meta = msg.metadata
    stored = (meta.timestamp - EPOCH) // MICROSECOND
    return meta.sequence.stream, msg.subject, msg.data, msg.headers, stored


class RangeReadError(NatsError):
    """A range could not be read whole; the message names the stream and the sequence."""


async def _replayed_chunks(
    js: JetStreamContext, stream: str, filter_subject: str, first: int, last: int
) -> AsyncGenerator[list[Stored], None]:
    chunk: list[Stored] = []
    messages = replay(js, stream, filter_subject, start_seq=first, last=last)
    async with contextlib.aclosing(messages):
        async for msg in messages:
            chunk.append(_stored(msg))
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def rfc3339_micros(text: str) -> int | None:
    """Unix microseconds of an RFC 3339 time with a zone (nanoseconds are truncated)."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return (parsed - EPOCH) // MICROSECOND


def subject_matches(filter_subject: str, subject: str) -> bool:
    """Whether `subject` matches `filter_subject` (NATS wildcards `*` and `>`)."""
    tokens = subject.split(".")
    for i, token in enumerate(filter_subject.split(".")):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(tokens) == len(filter_subject.split("."))


async def _first_match(
    nc: Client, stream: str, filter_subject: str, from_seq: int, timeout_s: float
) -> int | None:
    """The first sequence at or after `from_seq` on `filter_subject`, as the stream leader
    holds it (None: none). Raises `ServiceUnavailableError` while the server has no meta
    leader."""
    msg = await jsapi.msg_get(
        nc, stream, from_seq, next_by_subj=filter_subject, timeout_s=timeout_s
    )
    return None if msg is None else int(msg["seq"])


async def _direct_chunks(
    nc: Client, stream: str, filter_subject: str, first: int, last: int, timeout_s: float
) -> AsyncGenerator[list[Stored], None]:
    collector = _DirectCollector(stream, filter_subject, first, last, timeout_s)
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
                stream,
                collector.next_seq,
                # Messages never outnumber sequences: nothing is asked for past `last`.
                min(_DIRECT_BATCH, last - collector.next_seq + 1),
                next_by_subj=">" if collector.every_subject else filter_subject,
                reply=inbox,
            )
            await collector.round_trip(request)
            if collector.exhausted:
                collector.exhausted = False
                # Any replica may answer a direct get, and a lagging one says "no message"
                # too early: the stream leader decides whether a message is left in range.
                left: int | None = collector.next_seq
                if not collector.every_subject:
                    try:
                        left = await _first_match(
                            nc, stream, filter_subject, collector.next_seq, timeout_s
                        )
                    except ServiceUnavailableError:
                        # No meta leader: the stream leader refuses STREAM.MSG.GET, but direct
                        # gets still work. Read the rest of the range over every subject,
                        # keeping only the matching messages: one answer reaching `last`
                        # comes from a replica that holds the whole range, so its matching
                        # messages are all there are.
                        log.info(
                            "range_end_read_without_leader",
                            stream=stream,
                            start=collector.next_seq,
                            last=last,
                        )
                        collector.every_subject = True
                        continue
                # Reading every subject, "no message" before `last` means the replica lags.
                if left is None or left > last:
                    collector.done = True
                else:
                    stale_answers += 1
                    if stale_answers > _STALE_RETRIES:
                        unasked = "; no meta leader to ask" if collector.every_subject else ""
                        raise RangeReadError(
                            f"stream {stream!r}: direct gets keep missing sequence {left} "
                            f"(a lagging replica?{unasked})"
                        )
                    await asyncio.sleep(0.05 * stale_answers)
            if collector.done or len(collector.buffer) >= CHUNK:
                chunk, collector.buffer = collector.buffer, []
                if chunk:
                    yield chunk
    finally:
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()


class _DirectCollector:
    """Gathers the answers of batched direct gets (one batch in flight at a time)."""

    def __init__(
        self, stream: str, filter_subject: str, first: int, last: int, timeout_s: float
    ) -> None:
        self._stream = stream
        self._filter = filter_subject
        self._last = last
        self._timeout_s = timeout_s
        self.next_seq = first
        self.buffer: list[Stored] = []
        self.done = False
        # The answering replica holds no message asked for at or after next_seq.
        self.exhausted = False
        # Asking for every subject (the others left out), not only the filter's.
        self.every_subject = False
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
        if seq > self._last:
            self.done = True
            return
        subject = headers["Nats-Subject"]
        if not self.every_subject or subject_matches(self._filter, subject):
            stored = rfc3339_micros(headers["Nats-Time-Stamp"])
            self.buffer.append((seq, subject, msg.data, headers, stored or 0))
        self.next_seq = seq + 1
        if seq == self._last:
            self.done = True

    async def round_trip(self, request: Awaitable[None]) -> None:
        """Sends one batch request and waits until its last answer came."""
        self._answered.clear()
        before = self.next_seq
        await request
        try:
            await asyncio.wait_for(self._answered.wait(), self._timeout_s)
        except TimeoutError:
            raise RangeReadError(
                f"stream {self._stream!r}: no answer to a direct get from sequence {before} "
                f"within {self._timeout_s:g}s"
            ) from None
        if self._error is not None:
            raise RangeReadError(
                f"stream {self._stream!r}: direct get from sequence {before} failed: {self._error}"
            )
        if not self.done and not self.exhausted and self.next_seq == before:
            raise RangeReadError(
                f"stream {self._stream!r}: direct get from sequence {before} returned nothing"
            )
