"""The markers of a read stream: replay what is stored, tail what comes, publish new ones.

- `replay_markers()` yields exactly the markers stored when it is called (an ephemeral pull
  consumer: its `num_pending` at creation is the count), for the rebuild at startup.
- `tail_markers()` yields markers from a start sequence on, live (an ordered push consumer,
  recreated by nats-py after gaps or missed heartbeats). Restart it from `last.seq + 1`
  when it ends (the connection was closed).
- `publish_marker()` writes one marker with a globally unique `Nats-Msg-Id` chosen by the
  caller (a retry with the same id is stored once), to the write stream (replicated markers) or to the region's own read
  stream (snapshot markers); `stream` is checked by the server (`Nats-Expected-Stream`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api

MSG_ID_HEADER = "Nats-Msg-Id"
_REPLAY_BATCH = 256
_REPLAY_FETCH_TIMEOUT_S = 5.0
_REPLAY_INACTIVE_S = 60.0
_TAIL_HEARTBEAT_S = 2.0


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
        headers=dict(msg.headers or {}),
    )


def _from(start_seq: int) -> dict[str, object]:
    if start_seq <= 1:
        return {"deliver_policy": api.DeliverPolicy.ALL}
    return {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": start_seq}


async def replay_markers(
    js: JetStreamContext, stream: str, filter_subject: str, start_seq: int = 1
) -> AsyncGenerator[StoredMarker, None]:
    """Yield the markers stored in `stream` (seq >= `start_seq`) at the time of the call."""
    config = api.ConsumerConfig(
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=_REPLAY_INACTIVE_S,
        mem_storage=True,
        num_replicas=1,
        **_from(start_seq),  # type: ignore[arg-type]
    )
    info = await js.add_consumer(stream, config)
    remaining = info.num_pending or 0
    sub = await js.pull_subscribe_bind(info.name, stream=stream)
    try:
        while remaining > 0:
            # The markers are stored: a fetch timing out means the connection is in trouble.
            for msg in await sub.fetch(min(remaining, _REPLAY_BATCH), _REPLAY_FETCH_TIMEOUT_S):
                remaining -= 1
                yield _stored(msg)
    finally:
        # Best effort: the consumer also expires on its own after _REPLAY_INACTIVE_S.
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            await sub.unsubscribe()
            await js.delete_consumer(stream, info.name)


async def tail_markers(
    js: JetStreamContext, stream: str, filter_subject: str, start_seq: int
) -> AsyncGenerator[StoredMarker, None]:
    """Yield markers of `stream` from `start_seq` on, forever (until the connection closes)."""
    sub = await js.subscribe(
        filter_subject,
        stream=stream,
        ordered_consumer=True,
        idle_heartbeat=_TAIL_HEARTBEAT_S,
        config=api.ConsumerConfig(**_from(start_seq)),  # type: ignore[arg-type]
    )
    try:
        async for msg in sub.messages:
            yield _stored(msg)
    finally:
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            await sub.unsubscribe()


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
