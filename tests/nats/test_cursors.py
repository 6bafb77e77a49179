"""External cursors in the regional KV bucket and their effective positions, against a real
JetStream server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from sidecar.nats.cursors import CursorStore
from sidecar.nats.effective import EffectivePositions, Floor
from sidecar.nats.port import JetStreamPort, KeyValueBucket
from sidecar.nats.regional_kv import open_regional_kv
from tests.support.api_requests import requests_on
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def kv(port: JetStreamPort, bucket: str) -> KeyValueBucket:
    return await open_regional_kv(port, bucket, "west")


@pytest.fixture
def store(kv: KeyValueBucket) -> CursorStore:
    return CursorStore(kv)


async def test_cursors_move_forward_only_and_are_kept_per_stream(store: CursorStore) -> None:
    assert await store.load("orders") == {}
    assert await store.advance("orders", "spark", 0) == 0
    assert await store.advance("orders", "spark", 10) == 10
    assert await store.advance("orders", "spark", 4) == 10
    assert await store.advance("orders", "other", 3) == 3
    assert await store.advance("payments", "spark", 7) == 7
    assert await store.load("orders") == {"spark": 10, "other": 3}
    assert await store.load("payments") == {"spark": 7}


async def test_concurrent_commits_keep_the_highest(store: CursorStore) -> None:
    results = await asyncio.gather(*(store.advance("s", "q", n) for n in range(1, 21)))
    assert (await store.load("s"))["q"] == 20
    assert max(results) == 20


async def test_a_reset_sets_an_existing_cursor_backwards_and_creates_none(
    store: CursorStore,
) -> None:
    await store.advance("orders", "spark", 2**64 - 1)
    await store.advance("orders", "other", 5)
    assert await store.reset("orders", "spark", 12) == 2**64 - 1
    assert await store.load("orders") == {"spark": 12, "other": 5}
    # Forward-only commits go on from the reset value.
    assert await store.advance("orders", "spark", 11) == 12
    assert await store.advance("orders", "spark", 13) == 13
    assert await store.reset("orders", "ghost", 3) is None
    assert await store.reset("payments", "spark", 3) is None
    assert await store.load("orders") == {"spark": 13, "other": 5}
    assert await store.load("payments") == {}


async def test_a_second_store_on_the_same_bucket_sees_the_cursors(
    port: JetStreamPort, bucket: str, store: CursorStore
) -> None:
    await store.advance("orders", "spark", 42)
    again = CursorStore(await open_regional_kv(port, bucket, "west"))
    assert await again.load("orders") == {"spark": 42}


async def test_unreadable_values_are_dropped_not_fatal(
    kv: KeyValueBucket, store: CursorStore
) -> None:
    await kv.put(CursorStore.key("orders"), b'{"ok": 5, "bad": "x", "neg": -1}')
    assert await store.load("orders") == {"ok": 5}
    await kv.put(CursorStore.key("orders"), b"not json")
    assert await store.load("orders") == {}
    assert await store.advance("orders", "ok", 6) == 6


class ReadStream:
    """A stream shaped like a read stream of `orders`: data on `orders.>`, markers apart."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.name = f"orders-read-{uuid.uuid4().hex[:8]}"

    async def create(self) -> None:
        await self.js.add_stream(
            name=self.name,
            subjects=[f"{self.name}.data.>", f"{self.name}.marker"],
            max_consumers=4,
            allow_direct=True,
        )

    async def data(self, n: int = 1) -> int:
        for _ in range(n):
            ack = await self.js.publish(f"{self.name}.data.x", b"d", stream=self.name)
        return ack.seq

    async def markers(self, n: int = 1) -> int:
        for _ in range(n):
            ack = await self.js.publish(f"{self.name}.marker", b"m", stream=self.name)
        return ack.seq

    def trailing(self) -> CursorPositions:
        return CursorPositions(self.name, f"{self.name}.data.>")


class CursorPositions:
    """`EffectivePositions` of cursors whose reader delivers `data_filter` (as
    `LocalSubscriptions` reads them)."""

    def __init__(self, stream: str, data_filter: str) -> None:
        self.positions = EffectivePositions(stream)
        self.filters = (data_filter,)

    async def effective(
        self, port: JetStreamPort, cursors: Mapping[str, int], last_seq: int
    ) -> dict[str, int]:
        floors = {name: Floor(value, self.filters) for name, value in cursors.items()}
        return await self.positions.read(port, floors, last_seq)

    def known(self, name: str, cursor: int, last_seq: int) -> int:
        return self.positions.known(name, Floor(cursor, self.filters), last_seq)


@pytest.fixture
async def stream(js: JetStreamContext) -> ReadStream:
    read = ReadStream(js)
    await read.create()
    return read


async def test_a_cursor_followed_only_by_markers_stands_at_the_last_sequence(
    port: JetStreamPort, stream: ReadStream
) -> None:
    last_data = await stream.data(3)
    last = await stream.markers(2)
    positions = await stream.trailing().effective(port, {"spark": last_data, "early": 1}, last)
    assert positions == {"spark": last, "early": 1}


async def test_data_after_the_cursor_keeps_the_stored_value(
    port: JetStreamPort, stream: ReadStream
) -> None:
    await stream.data(2)
    await stream.markers(2)
    await stream.data()
    last = await stream.markers()
    trailing = stream.trailing()
    # Only markers between the cursor and the next data message: it stands just before it.
    assert await trailing.effective(port, {"a": 2, "b": 3, "c": 5}, last) == {
        "a": 4,
        "b": 4,
        "c": 6,
    }


async def test_data_stored_after_last_seq_was_read_is_never_claimed(
    port: JetStreamPort, stream: ReadStream
) -> None:
    cursor = await stream.data(2)
    last = await stream.markers(2)
    trailing = stream.trailing()
    assert await trailing.effective(port, {"spark": cursor}, last) == {"spark": last}
    later = await stream.markers()
    # New data lands after the caller read `later`: it is past the bound, so not claimed.
    await stream.data()
    assert await trailing.effective(port, {"spark": cursor}, later) == {"spark": later}
    newest = await stream.markers()
    assert await trailing.effective(port, {"spark": cursor}, newest) == {"spark": later}
    assert trailing.known("spark", cursor, newest) == later
    assert trailing.known("spark", cursor + 1, newest) == cursor + 1


async def test_each_stored_value_is_scanned_once_while_the_stream_is_quiet(
    port: JetStreamPort, js_server: LoneServer, stream: ReadStream
) -> None:
    async with requests_on(js_server.url, f"$JS.API.STREAM.MSG.GET.{stream.name}") as requests:
        cursor = await stream.data(2)
        last = await stream.markers()
        trailing = stream.trailing()
        for _ in range(3):
            assert await trailing.effective(port, {"spark": cursor}, last) == {"spark": last}
        assert await requests.count() == 1
        # A cursor beyond the last sequence needs no scan at all.
        assert await trailing.effective(port, {"spark": last + 5}, last) == {"spark": last + 5}
        assert await requests.count() == 1


async def test_a_missing_stream_is_an_error_not_a_position(port: JetStreamPort) -> None:
    trailing = CursorPositions("no-such-stream", "orders.>")
    with pytest.raises(NotFoundError):
        await trailing.effective(port, {"spark": 1}, 5)
