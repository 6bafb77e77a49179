"""The markers of a read stream: replay what is stored, tail what comes, publish new ones.

- `replay_markers()` yields exactly the markers stored when it is called, for the rebuild at
  startup; `tail_markers()` yields markers from a start sequence on, live. Restart it from
  `last.seq + 1` when it ends (the connection was closed). Both read through
  `stream_reader`.
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
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.nats import stream_reader
from sidecar.protocol import StoredMarker

MSG_ID_HEADER = "Nats-Msg-Id"
_EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
_STATUS_HEADER = "Status"
_NO_RESPONDERS = "503"
_ACK_TIMEOUT_S = 5.0
_REPLAY_BATCH = 256


@dataclass(frozen=True)
class Published:
    seq: int
    duplicate: bool


def _stored(msg: Msg) -> StoredMarker:
    return StoredMarker(msg.metadata.sequence.stream, msg.subject, msg.data)


async def replay_markers(
    js: JetStreamContext, stream: str, filter_subject: str, start_seq: int = 1
) -> AsyncGenerator[StoredMarker, None]:
    """Yield the markers stored in `stream` (seq >= `start_seq`) at the time of the call."""
    replay = stream_reader.replay(
        js, stream, filter_subject, start_seq=start_seq, batch=_REPLAY_BATCH
    )
    async with contextlib.aclosing(replay):
        async for msg in replay:
            yield _stored(msg)


async def tail_markers(
    js: JetStreamContext, stream: str, filter_subject: str, start_seq: int
) -> AsyncGenerator[StoredMarker, None]:
    """Yield markers of `stream` from `start_seq` on, forever (until the connection closes)."""
    tail = stream_reader.tail(js, stream, filter_subject, start_seq)
    async with contextlib.aclosing(tail):
        async for msg in tail:
            yield _stored(msg)


class MarkerPublisher:
    """Publishes markers, each awaited until JetStream acknowledges it, on one reply
    subscription of its own per client.

    Written by hand rather than through nats-py's `js.publish`, which draws a random token
    (a system call), runs `wait_for` and builds a `PubAck` for every message: a marker is a
    few per snapshot, and this path costs a third less CPU (`bench/bench_publish.py`). One
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
