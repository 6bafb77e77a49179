"""`NatsPort`: the real `JetStreamPort` (`sidecar.nats.port`), over nats-py.

One port per region's connection. It follows the client a `NatsConnection` holds (a client
nats-py closed for good is replaced; the port then works on the new one), or works on one
given `Client` (tests, tools). Every JetStream API request goes through `sidecar.nats.jsapi`
(the one request path); a stream is read through `sidecar.nats.stream_reader`
(`read_stored` for what is stored, `tail` for live); a marker is published by the port's one
`MarkerPublisher`; a key-value bucket is nats-py's own `KeyValue` (it satisfies
`KeyValueBucket`); a signal is a core-NATS subscription of the client.

- `MarkerPublisher.publish()` writes one marker with a globally unique `Nats-Msg-Id` chosen
  by the caller (a retry with the same id is stored once), to the write stream (replicated
  markers) or to the region's own read stream (snapshot markers); `stream` is checked by
  the server (`Nats-Expected-Stream`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.nats import jsapi, stream_reader
from sidecar.nats.connection import NatsConnection
from sidecar.nats.port import (
    ApiJson,
    KeyValueBucket,
    Listener,
    Published,
    StoredMessage,
)

MSG_ID_HEADER = "Nats-Msg-Id"
_EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
_STATUS_HEADER = "Status"
_NO_RESPONDERS = "503"
_ACK_TIMEOUT_S = 5.0


class _OneClient:
    """A given client and its JetStream context (made once: nats-py makes a new one at every
    `jetstream()`)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()


class NatsPort:
    """The `JetStreamPort` of one region, over `nats` (a connection: its current client; or
    one client)."""

    def __init__(self, nats: NatsConnection | Client) -> None:
        self._nats = nats if isinstance(nats, NatsConnection) else _OneClient(nats)
        self._markers = MarkerPublisher()

    # ---- streams ------------------------------------------------------------------------

    async def stream_info(
        self, stream: str, *, subjects_filter: str | None = None, timeout_s: float
    ) -> ApiJson:
        query = None if subjects_filter is None else {"subjects_filter": subjects_filter}
        return await jsapi.request(
            self._nats.nc, f"STREAM.INFO.{stream}", query, timeout_s=timeout_s
        )

    async def stream_names(self, *, subject: str | None = None, timeout_s: float) -> list[str]:
        return await jsapi.stream_names(self._nats.nc, subject=subject, timeout_s=timeout_s)

    async def stream_create(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"STREAM.CREATE.{config['name']}", config, timeout_s=timeout_s
        )

    async def stream_update(self, config: Mapping[str, Any], *, timeout_s: float) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"STREAM.UPDATE.{config['name']}", config, timeout_s=timeout_s
        )

    async def stream_purge(self, stream: str, subject: str, *, timeout_s: float) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"STREAM.PURGE.{stream}", {"filter": subject}, timeout_s=timeout_s
        )

    async def msg_get(
        self, stream: str, seq: int, *, next_by_subj: str | None = None, timeout_s: float
    ) -> ApiJson | None:
        return await jsapi.msg_get(
            self._nats.nc, stream, seq, next_by_subj=next_by_subj, timeout_s=timeout_s
        )

    async def publish(self, stream: str, subject: str, data: bytes, msg_id: str) -> Published:
        return await self._markers.publish(self._nats.nc, stream, subject, data, msg_id)

    async def read(
        self,
        stream: str,
        filter_subject: str,
        start_seq: int,
        *,
        live: bool,
        headers_only: bool = False,
        opened: Callable[[], None] | None = None,
    ) -> AsyncGenerator[StoredMessage, None]:
        if not live:
            stored = stream_reader.read_stored(
                self._nats.nc, stream, filter_subject, start_seq, headers_only=headers_only
            )
            async with contextlib.aclosing(stored):
                async for seq, subject, data, headers, _ in stored:
                    yield StoredMessage(seq, subject, data, headers or {})
            return
        messages = stream_reader.tail(
            self._nats.js,
            stream,
            filter_subject,
            start_seq,
            headers_only=headers_only,
            opened=opened,
        )
        async with contextlib.aclosing(messages):
            async for msg in messages:
                yield StoredMessage(
                    msg.metadata.sequence.stream, msg.subject, msg.data, msg.headers or {}
                )

    # ---- consumers ----------------------------------------------------------------------

    async def consumer_list(self, stream: str, offset: int, *, timeout_s: float) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"CONSUMER.LIST.{stream}", {"offset": offset}, timeout_s=timeout_s
        )

    async def consumer_info(self, stream: str, name: str, *, timeout_s: float) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"CONSUMER.INFO.{stream}.{name}", timeout_s=timeout_s
        )

    async def consumer_create(
        self, stream: str, name: str, config: Mapping[str, Any], action: str, *, timeout_s: float
    ) -> ApiJson:
        return await jsapi.request(
            self._nats.nc,
            f"CONSUMER.CREATE.{stream}.{name}",
            {"stream_name": stream, "config": config, "action": action},
            timeout_s=timeout_s,
        )

    async def consumer_reset(
        self, stream: str, name: str, seq: int, *, timeout_s: float
    ) -> ApiJson:
        return await jsapi.request(
            self._nats.nc, f"CONSUMER.RESET.{stream}.{name}", {"seq": seq}, timeout_s=timeout_s
        )

    async def consumer_pause(
        self, stream: str, name: str, seconds: float | None, *, timeout_s: float
    ) -> ApiJson:
        """Paused until `seconds` from now on this host's wall clock (the server compares it
        with its own: the pause is as long as their skew allows); resumed with None."""
        pause: dict[str, Any] | None = None
        if seconds is not None:
            until = datetime.now(UTC) + timedelta(seconds=seconds)
            pause = {"pause_until": until.isoformat().replace("+00:00", "Z")}
        return await jsapi.request(
            self._nats.nc, f"CONSUMER.PAUSE.{stream}.{name}", pause, timeout_s=timeout_s
        )

    # ---- key-value and signals ----------------------------------------------------------

    async def key_value(self, bucket: str) -> KeyValueBucket:
        return await self._nats.js.key_value(bucket)

    async def listen(self, subject: str, heard: Callable[[str, bytes], None]) -> Listener:
        async def signal(msg: Msg) -> None:
            heard(msg.subject, msg.data)

        return _Listener(await self._nats.nc.subscribe(subject, cb=signal))


@dataclass(frozen=True)
class _Listener:
    """A subscription of the client (nats-py renews it after a reconnect)."""

    subscription: Subscription

    async def stop(self) -> None:
        await self.subscription.unsubscribe()


class MarkerPublisher:
    """Publishes markers, each awaited until JetStream acknowledges it, on one reply
    subscription of its own per client.

    Written by hand rather than through nats-py's `js.publish`, which draws a random token
    (a system call), runs `wait_for` and builds a `PubAck` for every message: a marker is a
    few per snapshot, and this path costs less CPU (`bench/bench_publish.py`, figures in
    docs/benchmarks.md). One
    publisher serves every stream of a region; the counter makes each reply subject unique.
    """

    def __init__(self, *, timeout_s: float = _ACK_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        self._client: Client | None = None
        self._prefix = ""
        self._listening = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count()

    async def publish(
        self, nc: Client, stream: str, subject: str, data: bytes, msg_id: str
    ) -> Published:
        """Publish one marker to `stream` (checked by the server); a repeated `msg_id` is
        acknowledged as a duplicate, not stored. Raises `TimeoutError` without an
        acknowledgement, `NoRespondersError` when no stream takes `subject`, and the matching
        `APIError` when JetStream refuses it."""
        if self._client is not nc:
            await self._listen(nc)
        token = str(next(self._tokens))
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = acked
        timer = loop.call_later(self._timeout_s, _expire, acked, subject)
        try:
            headers = {MSG_ID_HEADER: msg_id, _EXPECTED_STREAM_HEADER: stream}
            await nc.publish(subject, data, reply=self._prefix + token, headers=headers)
            reply = await acked
        finally:
            timer.cancel()
            del self._waiting[token]
        return _published(reply)

    async def _listen(self, nc: Client) -> None:
        """Subscribe to the acknowledgements on `nc` (a new client: the old subscription
        ended with the old one)."""
        async with self._listening:
            if self._client is nc:
                return
            prefix = nc.new_inbox() + "."
            await nc.subscribe(prefix + "*", cb=self._acked)
            self._client, self._prefix = nc, prefix

    async def _acked(self, msg: Msg) -> None:
        acked = self._waiting.get(msg.subject[len(self._prefix) :])
        if acked is not None and not acked.done():
            acked.set_result(msg)


def _expire(acked: asyncio.Future[Msg], subject: str) -> None:
    if not acked.done():
        acked.set_exception(TimeoutError(f"no acknowledgement of a marker on {subject}"))


def _published(reply: Msg) -> Published:
    if reply.headers and reply.headers.get(_STATUS_HEADER) == _NO_RESPONDERS:
        raise NoRespondersError
    ack = json.loads(reply.data)
    if "error" in ack:
        APIError.from_error(ack["error"])  # raises
    return Published(seq=int(ack["seq"]), duplicate=bool(ack.get("duplicate", False)))
