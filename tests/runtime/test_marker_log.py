"""Marker replay, tail and publish against a real JetStream server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator

import pytest
from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.nats.marker_log import (
    StoredMarker,
    publish_marker,
    replay_markers,
    tail_markers,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(js: JetStreamContext) -> str:
    name = f"S{uuid.uuid4().hex[:8]}"
    await js.add_stream(
        name=name,
        subjects=[f"{name}.>", f"_rsub.{name}.>"],
        max_consumers=10,
        duplicate_window=60,
    )
    return name


async def put_marker(js: JetStreamContext, stream: str, payload: bytes) -> int:
    published = await publish_marker(
        js, stream, f"_rsub.{stream}.marker.west", payload, f"rsub-west-{uuid.uuid4().hex}"
    )
    return published.seq


async def collect(markers: AsyncGenerator[StoredMarker, None], n: int) -> list[StoredMarker]:
    out: list[StoredMarker] = []
    async with contextlib.aclosing(markers):
        async for marker in markers:
            out.append(marker)
            if len(out) == n:
                break
    return out


async def test_replay_yields_exactly_the_stored_markers_and_skips_data(
    js: JetStreamContext, stream: str
) -> None:
    await js.publish(f"{stream}.west.a", b"data")
    seqs = [await put_marker(js, stream, f"m{i}".encode()) for i in range(300)]
    await js.publish(f"{stream}.west.b", b"data")

    replayed = [m async for m in replay_markers(js, stream, f"_rsub.{stream}.>")]
    assert [m.seq for m in replayed] == seqs
    assert replayed[5].data == b"m5"
    assert replayed[5].subject == f"_rsub.{stream}.marker.west"
    assert replayed[5].headers["Nats-Msg-Id"].startswith("rsub-west-")

    later = [m async for m in replay_markers(js, stream, f"_rsub.{stream}.>", seqs[-3])]
    assert [m.seq for m in later] == seqs[-3:]
    # The ephemeral replay consumers are gone.
    assert (await js.stream_info(stream)).state.consumer_count == 0


async def test_replay_of_a_stream_without_markers_is_empty(
    js: JetStreamContext, stream: str
) -> None:
    await js.publish(f"{stream}.west.a", b"data")
    assert [m async for m in replay_markers(js, stream, f"_rsub.{stream}.>")] == []


async def test_tail_starts_at_the_given_sequence_and_sees_new_markers(
    js: JetStreamContext, stream: str
) -> None:
    first = await put_marker(js, stream, b"old")
    await js.publish(f"{stream}.west.a", b"data")
    second = await put_marker(js, stream, b"kept")
    task = asyncio.create_task(collect(tail_markers(js, stream, f"_rsub.{stream}.>", first + 1), 2))
    await asyncio.sleep(0.2)
    third = await put_marker(js, stream, b"live")
    got = await asyncio.wait_for(task, 10)
    assert [(m.seq, m.data) for m in got] == [(second, b"kept"), (third, b"live")]


async def test_publish_with_a_repeated_msg_id_is_a_duplicate(
    js: JetStreamContext, stream: str
) -> None:
    subject = f"_rsub.{stream}.snapshot.west"
    msg_id = f"rsub-west-{uuid.uuid4().hex}"
    first = await publish_marker(js, stream, subject, b"x", msg_id)
    again = await publish_marker(js, stream, subject, b"x", msg_id)
    assert not first.duplicate and again.duplicate
    assert again.seq == first.seq
    assert (await js.stream_info(stream)).state.messages == 1


async def test_publish_to_the_wrong_stream_is_refused(js: JetStreamContext, stream: str) -> None:
    with pytest.raises(APIError, match="expected stream"):
        await publish_marker(js, "other", f"_rsub.{stream}.marker.west", b"x", "id-1")
