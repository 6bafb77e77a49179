"""External cursors in the regional KV bucket, against a real JetStream server."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from sidecar.nats.cursors import CursorStore
from sidecar.nats.regional_kv import open_regional_kv

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def kv(js: JetStreamContext, bucket: str) -> KeyValue:
    return await open_regional_kv(js, bucket, "west")


@pytest.fixture
def store(kv: KeyValue) -> CursorStore:
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


async def test_a_second_store_on_the_same_bucket_sees_the_cursors(
    js: JetStreamContext, bucket: str, store: CursorStore
) -> None:
    await store.advance("orders", "spark", 42)
    again = CursorStore(await open_regional_kv(js, bucket, "west"))
    assert await again.load("orders") == {"spark": 42}


async def test_unreadable_values_are_dropped_not_fatal(kv: KeyValue, store: CursorStore) -> None:
    await kv.put(CursorStore.key("orders"), b'{"ok": 5, "bad": "x", "neg": -1}')
    assert await store.load("orders") == {"ok": 5}
    await kv.put(CursorStore.key("orders"), b"not json")
    assert await store.load("orders") == {}
    assert await store.advance("orders", "ok", 6) == 6
