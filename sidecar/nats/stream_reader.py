"""Reading one subject filter of a stream: what is stored now, and what comes after.

- `replay()` yields exactly the matching messages stored when it is called (an ephemeral
  pull consumer: its `num_pending` at creation is the count), for a rebuild at startup.
- `tail()` yields them from a start sequence on, live (an ordered push consumer, which
  nats-py recreates after gaps or missed heartbeats from the sequence after the last one it
  delivered). Restart it from `last seq + 1` when it ends (the connection was closed).

With `headers_only` the server sends each message's headers with an empty payload, plus a
`Nats-Msg-Size` header holding the payload's size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api

_REPLAY_FETCH_TIMEOUT_S = 5.0
_REPLAY_INACTIVE_S = 60.0
_TAIL_HEARTBEAT_S = 2.0


def _from(start_seq: int) -> dict[str, object]:
    if start_seq <= 1:
        return {"deliver_policy": api.DeliverPolicy.ALL}
    return {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": start_seq}


async def replay(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    *,
    start_seq: int = 1,
    batch: int,
    headers_only: bool = False,
) -> AsyncGenerator[Msg, None]:
    """Yield the messages on `filter_subject` stored in `stream` (seq >= `start_seq`) at the
    time of the call, fetched `batch` at a time."""
    config = api.ConsumerConfig(
        filter_subject=filter_subject,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=_REPLAY_INACTIVE_S,
        mem_storage=True,
        num_replicas=1,
        headers_only=headers_only,
        **_from(start_seq),  # type: ignore[arg-type]
    )
    info = await js.add_consumer(stream, config)
    remaining = info.num_pending or 0
    sub = await js.pull_subscribe_bind(info.name, stream=stream)
    try:
        while remaining > 0:
            # The messages are stored: a fetch timing out means the connection is in trouble.
            for msg in await sub.fetch(min(remaining, batch), _REPLAY_FETCH_TIMEOUT_S):
                remaining -= 1
                yield msg
    finally:
        # Best effort: the consumer also expires on its own after _REPLAY_INACTIVE_S.
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            await sub.unsubscribe()
            await js.delete_consumer(stream, info.name)


async def tail(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    start_seq: int,
    *,
    headers_only: bool = False,
) -> AsyncGenerator[Msg, None]:
    """Yield the messages on `filter_subject` of `stream` from `start_seq` on, in stream
    order, forever (until the connection closes)."""
    sub = await js.subscribe(
        filter_subject,
        stream=stream,
        ordered_consumer=True,
        idle_heartbeat=_TAIL_HEARTBEAT_S,
        config=api.ConsumerConfig(headers_only=headers_only, **_from(start_seq)),  # type: ignore[arg-type]
    )
    try:
        async for msg in sub.messages:
            yield msg
    finally:
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            await sub.unsubscribe()
