"""Reading one subject filter of a stream: what is stored now, and what comes after.

- `replay()` yields exactly the matching messages stored when it is called (an ephemeral
  pull consumer: its `num_pending` at creation is the count), for a rebuild at startup.
- `tail()` yields them from a start sequence on, live (an ordered push consumer: flow
  control, idle heartbeats, no acks); it raises `TailGap` when a delivery is missing or the
  server went silent. Restart it from `last seq + 1` when it ends.

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
_TAIL_HEARTBEAT_S = 10.0
# A tail that hears nothing over one whole check period (a heartbeat and a half) starts
# again: silence is noticed between one and two periods after the last message.
_TAIL_SILENCE_S = 1.5 * _TAIL_HEARTBEAT_S
_CONSUMER_STALLED = "Nats-Consumer-Stalled"


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


class TailGap(NatsError):
    """A tail lost its place (a delivery missing, or the server silent too long): start a new
    one after the last message taken."""


async def tail(
    js: JetStreamContext,
    stream: str,
    filter_subject: str,
    start_seq: int,
    *,
    headers_only: bool = False,
) -> AsyncGenerator[Msg, None]:
    """Yield the messages on `filter_subject` of `stream` from `start_seq` on, in stream
    order, until the server goes silent or a delivery is missing (`TailGap`), or the
    connection closes; restart it from `last seq + 1` then.

    An ordered push consumer written here rather than nats-py's (`ordered_consumer=True`):
    that one runs a task per subscription polling its flow control every 250 ms, which at
    thousands of tails was most of an idle sidecar's CPU. Here the flow-control request is
    answered when it is read (every message before it has been yielded and taken, as the
    server asks), and the server's idle heartbeats (every `_TAIL_HEARTBEAT_S`) are only
    waited for.
    """
    nc = js._nc  # the connection behind `js` (nats-py keeps no public handle on it)
    # Messages come through a callback into a queue of our own, and silence is checked by
    # one timer per `_TAIL_SILENCE_S`, not per message: nats-py's `next_msg(timeout=)` makes
    # a task, a timer and a uuid for every message, a large share of a loaded sidecar's CPU.
    received: asyncio.Queue[Msg | None] = asyncio.Queue()
    heard = True
    loop = asyncio.get_running_loop()
    watchdog: asyncio.TimerHandle

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

    watchdog = loop.call_later(_TAIL_SILENCE_S, check_silence)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=deliver)
    try:
        await js.add_consumer(
            stream,
            api.ConsumerConfig(
                filter_subject=filter_subject,
                deliver_subject=inbox,
                ack_policy=api.AckPolicy.NONE,
                max_deliver=1,
                flow_control=True,
                idle_heartbeat=_TAIL_HEARTBEAT_S,
                inactive_threshold=_REPLAY_INACTIVE_S,
                mem_storage=True,
                num_replicas=1,
                headers_only=headers_only,
                **_from(start_seq),  # type: ignore[arg-type]
            ),
        )
        delivered = 0
        while True:
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
            yield msg
    finally:
        watchdog.cancel()
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            await sub.unsubscribe()
