"""`stream_reader.tail` (the hand-written ordered push consumer) and `read_range` against a
real server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from sidecar.nats import stream_reader

pytestmark = pytest.mark.integration


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


@pytest.mark.parametrize("direct", [True, False], ids=["direct-gets", "consumer"])
async def test_a_range_is_read_whole_on_the_filter_and_within_its_bounds(
    nc: Client, js: JetStreamContext, direct: bool
) -> None:
    name = f"R{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=direct)
    for i in range(30):
        await js.publish(f"{name}.{'other' if i % 3 == 0 else 'data.x'}", b"%d" % i)
    expected = [i + 1 for i in range(30) if i % 3 and 5 <= i + 1 <= 25]
    chunks = stream_reader.read_range(nc, name, f"{name}.data.>", 5, 25, direct=direct, timeout_s=5)
    got = [message async for chunk in chunks for message in chunk]
    assert [seq for seq, *_ in got] == expected
    assert all(subject == f"{name}.data.x" and stored > 0 for _, subject, _, _, stored in got)
    empty = stream_reader.read_range(nc, name, f"{name}.none", 1, 30, direct=direct, timeout_s=5)
    assert [chunk async for chunk in empty] == []
    # The consumer of a read is gone with it.
    assert (await js.stream_info(name)).state.consumer_count == 0


def test_subjects_match_filters_as_the_server_does() -> None:
    matches = stream_reader.subject_matches
    assert matches("orders.>", "orders.west.k1") and matches("orders.*.k1", "orders.west.k1")
    assert not matches("orders.>", "orders") and not matches("orders.*", "orders.west.k1")
    assert not matches("orders.>", "_rsub.orders.marker.west") and matches("a.b", "a.b")


async def test_reading_every_subject_keeps_only_the_filters_messages(nc: Client) -> None:
    """Without a meta leader the direct gets ask for every subject: the collector alone, fed
    answers made here."""
    collector = stream_reader._DirectCollector("S", "orders.>", 1, 3, timeout_s=1)
    collector.every_subject = True
    for seq, subject in enumerate(["orders.west.k", "_rsub.orders.marker.west", "orders.x"], 1):
        stamp = "2026-11-27T12:00:00Z"
        headers = {"Nats-Sequence": str(seq), "Nats-Subject": subject, "Nats-Time-Stamp": stamp}
        await collector.on_msg(Msg(nc, "inbox", data=b"%d" % seq, headers=headers))
    assert [(seq, subject) for seq, subject, *_ in collector.buffer] == [
        (1, "orders.west.k"),
        (3, "orders.x"),
    ]
    assert collector.done and collector.next_seq == 4
