"""Data origins read from a real sourced read stream: headers only, data only, unknown ones.

The layout is made by hand on one JetStream server (`tests.support.origin_layout`); what the
runtime makes of the unknown ones: tests/runtime/test_unknown_origins.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest
from nats.js import JetStreamContext

from sidecar.naming import VirtualStream
from sidecar.nats import stream_reader
from sidecar.nats.origin_log import data_entry, replay_origins, tail_origins
from sidecar.nats.port import JetStreamPort
from sidecar.protocol.origins import UNKNOWN_ORIGIN, DataEntry
from tests.support.origin_layout import PAYLOAD, fill, lay_out, write

pytestmark = pytest.mark.integration


@pytest.fixture
async def vs(js: JetStreamContext) -> VirtualStream:
    return await lay_out(js)


def per_origin(entries: list[DataEntry]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for entry in entries:
        found.setdefault(entry.origin, []).append(entry.origin_seq)
    return found


async def take(entries: AsyncGenerator[DataEntry, None], n: int) -> list[DataEntry]:
    got: list[DataEntry] = []
    async with contextlib.aclosing(entries):
        async for entry in entries:
            got.append(entry)
            if len(got) == n:
                break
    return got


async def test_replay_reads_each_data_message_origin_and_no_marker(
    port: JetStreamPort, js: JetStreamContext, vs: VirtualStream
) -> None:
    await fill(js, vs)
    marker = await js.get_last_msg(vs.read_stream("west"), vs.marker_subject("west"))
    print("a sourced header:", (marker.headers or {}).get("Nats-Stream-Source"))

    entries = [e async for e in replay_origins(port, vs, "west")]
    assert [e.read_seq for e in entries] == [seq for seq in range(1, 9) if seq != marker.seq]
    # Per-origin order kept; north is no region of `vs`, local has no source header.
    assert per_origin(entries) == {"west": [1, 2, 3], "east": [1, 2], UNKNOWN_ORIGIN: [0, 0]}
    later = [e async for e in replay_origins(port, vs, "west", entries[-3].read_seq)]
    assert later == entries[-3:]
    assert (await js.stream_info(vs.read_stream("west"))).state.consumer_count == 0


async def test_the_server_sends_headers_only(js: JetStreamContext, vs: VirtualStream) -> None:
    await fill(js, vs)
    read = vs.read_stream("west")
    replay = stream_reader.replay(js, read, vs.data_filter(), headers_only=True)
    replayed = [m async for m in replay]
    assert len(replayed) == 7 and all(m.data == b"" for m in replayed)
    assert {(m.headers or {}).get("Nats-Msg-Size") for m in replayed} == {str(len(PAYLOAD))}
    full = [m async for m in stream_reader.replay(js, read, vs.data_filter())]
    assert {m.data for m in full} == {PAYLOAD}

    tailed = stream_reader.tail(js, read, vs.data_filter(), 1, headers_only=True)
    async with contextlib.aclosing(tailed):
        msgs = [await anext(tailed) for _ in range(7)]
    assert all(m.data == b"" and (m.headers or {})["Nats-Msg-Size"] == "1000" for m in msgs)


async def test_origin_readers_ask_for_headers_only_on_the_data_filter(
    port: JetStreamPort, js: JetStreamContext, vs: VirtualStream
) -> None:
    await fill(js, vs)
    read = vs.read_stream("west")
    for reader in (replay_origins(port, vs, "west"), tail_origins(port, vs, "west", 1)):
        async with contextlib.aclosing(reader):
            await anext(reader)
            [consumer] = await js.consumers_info(read)
        assert consumer.config.headers_only is True
        assert consumer.config.filter_subject == vs.data_filter()


@pytest.mark.parametrize("direct_max_bytes", [stream_reader.DIRECT_MAX_BYTES, 0])
async def test_a_stream_allowing_direct_gets_is_replayed_without_a_consumer(
    port: JetStreamPort,
    js: JetStreamContext,
    vs: VirtualStream,
    monkeypatch: pytest.MonkeyPatch,
    direct_max_bytes: int,
) -> None:
    """Where the read stream allows direct gets (as the topology makes it) and holds at most
    `DIRECT_MAX_BYTES`, the replay creates no consumer (nothing for the JetStream meta
    leader to do); above it, the headers-only consumer. The same origins either way."""
    await fill(js, vs)
    read = vs.read_stream("west")
    marker = await js.get_last_msg(read, vs.marker_subject("west"))
    config = (await js.stream_info(read)).config
    config.allow_direct = True
    await js.update_stream(config)
    monkeypatch.setattr(stream_reader, "DIRECT_MAX_BYTES", direct_max_bytes)
    replay = replay_origins(port, vs, "west")
    async with contextlib.aclosing(replay):
        entries = [await anext(replay)]
        consumers = await js.consumers_info(read)
        entries += [e async for e in replay]
    if direct_max_bytes:
        assert consumers == []
    else:
        assert [c.config.headers_only for c in consumers] == [True]
    assert [e.read_seq for e in entries] == [seq for seq in range(1, 9) if seq != marker.seq]
    assert per_origin(entries) == {"west": [1, 2, 3], "east": [1, 2], UNKNOWN_ORIGIN: [0, 0]}


async def test_tail_follows_live_from_the_start_sequence(
    port: JetStreamPort, js: JetStreamContext, vs: VirtualStream
) -> None:
    await fill(js, vs)
    replayed = [e async for e in replay_origins(port, vs, "west")]
    tail = asyncio.create_task(take(tail_origins(port, vs, "west", replayed[-2].read_seq), 4))
    await asyncio.sleep(0.2)
    await write(js, vs, "east", 1)
    await write(js, vs, "west", 1)
    got = await asyncio.wait_for(tail, 10)
    assert got[:2] == replayed[-2:]
    assert per_origin(got[2:]) == {"east": [3], "west": [5]}  # west's marker took seq 4
    assert got[2].read_seq > replayed[-1].read_seq and got[3].read_seq > got[2].read_seq


def test_headers_without_a_usable_origin() -> None:
    vs = VirtualStream("orders", ("west", "east"))
    source = "Nats-Stream-Source"
    assert data_entry(vs, 7, {source: "orders-write-east 3 orders.east.> > orders.east.a x"}) == (
        DataEntry(7, "east", 3)
    )
    assert data_entry(vs, 8, {source: "orders-write-east:ab12 4 > > orders.east.a"}) == (
        DataEntry(8, "east", 4)
    )
    for headers in (None, {}, {source: "garbled"}, {source: "orders-write-north 3 x"}):
        assert data_entry(vs, 9, headers) == DataEntry(9, UNKNOWN_ORIGIN, 0)
