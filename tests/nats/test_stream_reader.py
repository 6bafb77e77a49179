"""`stream_reader.tail` (the hand-written ordered push consumer) against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator

import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from sidecar.nats import stream_reader

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(js: JetStreamContext) -> str:
    name = f"T{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"], max_consumers=10)
    return name


async def take(tail: AsyncGenerator[Msg, None], n: int) -> list[int]:
    seqs: list[int] = []
    async for msg in tail:
        seqs.append(msg.metadata.sequence.stream)
        if len(seqs) == n:
            break
    return seqs


async def test_a_burst_far_past_flow_control_arrives_whole_and_in_order(
    js: JetStreamContext, stream: str
) -> None:
    # 4,000 messages of 4 KiB: well past what the server sends before it asks for flow
    # control, so the tail stalls for good unless it answers.
    payload = b"x" * 4096
    await asyncio.gather(*(js.publish(f"{stream}.a", payload) for _ in range(4000)))
    tail = stream_reader.tail(js, stream, f"{stream}.>", 1)
    async with contextlib.aclosing(tail):
        seqs = await asyncio.wait_for(take(tail, 4000), 60)
    assert seqs == list(range(1, 4001))


async def test_a_tail_outlives_silence_with_heartbeats_and_starts_where_asked(
    js: JetStreamContext, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_reader, "_TAIL_HEARTBEAT_S", 0.5)
    monkeypatch.setattr(stream_reader, "_TAIL_SILENCE_S", 1.25)
    for i in range(3):
        await js.publish(f"{stream}.a", str(i).encode())
    tail = stream_reader.tail(js, stream, f"{stream}.>", 2)
    async with contextlib.aclosing(tail):
        assert await asyncio.wait_for(take(tail, 2), 10) == [2, 3]
        later = asyncio.create_task(take(tail, 1))
        await asyncio.sleep(3)  # silent for more than twice the silence limit: heartbeats
        assert not later.done()
        await js.publish(f"{stream}.a", b"late")
        assert await asyncio.wait_for(later, 10) == [4]


async def test_a_tail_whose_consumer_is_gone_ends_with_a_gap(
    js: JetStreamContext, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_reader, "_TAIL_HEARTBEAT_S", 0.5)
    monkeypatch.setattr(stream_reader, "_TAIL_SILENCE_S", 1.25)
    await js.publish(f"{stream}.a", b"one")
    tail = stream_reader.tail(js, stream, f"{stream}.>", 1)
    async with contextlib.aclosing(tail):
        assert await asyncio.wait_for(take(tail, 1), 10) == [1]
        for name in await js.consumers_info(stream):
            await js.delete_consumer(stream, name.name)
        with pytest.raises(stream_reader.TailGap):
            await asyncio.wait_for(take(tail, 1), 10)
