"""The markers of a read stream: replay what is stored, tail what comes, publish new ones.

- `replay_markers()` yields exactly the markers stored when it is called, for the rebuild at
  startup; `tail_markers()` yields markers from a start sequence on, live. Restart it from
  `last.seq + 1` when it ends (the connection was closed). Both read through
  `stream_reader`.
- `publish_marker()` writes one marker with a globally unique `Nats-Msg-Id` chosen by the
  caller (a retry with the same id is stored once), to the write stream (replicated
  markers) or to the region's own read stream (snapshot markers); `stream` is checked by
  the server (`Nats-Expected-Stream`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from sidecar.nats import stream_reader

MSG_ID_HEADER = "Nats-Msg-Id"
_REPLAY_BATCH = 256


@dataclass(frozen=True)
class StoredMarker:
    seq: int
    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    seq: int
    duplicate: bool


def _stored(msg: Msg) -> StoredMarker:
    return StoredMarker(
        seq=msg.metadata.sequence.stream,
        subject=msg.subject,
        data=msg.data,
        headers=msg.headers or {},
    )


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


async def publish_marker(
    js: JetStreamContext,
    stream: str,
    subject: str,
    data: bytes,
    msg_id: str,
    headers: Mapping[str, str] | None = None,
) -> Published:
    """Publish one marker; a repeated `msg_id` is acknowledged as a duplicate, not stored."""
    all_headers = {**(headers or {}), MSG_ID_HEADER: msg_id}
    ack = await js.publish(subject, data, stream=stream, headers=all_headers)
    return Published(seq=ack.seq, duplicate=bool(ack.duplicate))
