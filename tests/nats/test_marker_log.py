"""Marker replay, tail and publish against a real JetStream server."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator

import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from sidecar.nats.marker_log import replay_markers, tail_markers
from sidecar.nats.nats_port import MarkerPublisher
from sidecar.nats.port import JetStreamPort
from sidecar.protocol import StoredMarker
from tests.support.nats_servers import LoneServer

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


async def put_marker(port: JetStreamPort, stream: str, payload: bytes) -> int:
    published = await port.publish(
        stream, f"_rsub.{stream}.marker.west", payload, f"rsub-west-{uuid.uuid4().hex}"
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
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await js.publish(f"{stream}.west.a", b"data")
    seqs = [await put_marker(port, stream, f"m{i}".encode()) for i in range(300)]
    await js.publish(f"{stream}.west.b", b"data")

    replayed = [m async for m in replay_markers(port, stream, f"_rsub.{stream}.>")]
    assert [m.seq for m in replayed] == seqs
    assert replayed[5].data == b"m5"
    assert replayed[5].subject == f"_rsub.{stream}.marker.west"
    # The publisher's id is stored with it (the read streams de-duplicate by it).
    stored = await js.get_msg(stream, seqs[5])
    assert (stored.headers or {})["Nats-Msg-Id"].startswith("rsub-west-")

    later = [m async for m in replay_markers(port, stream, f"_rsub.{stream}.>", seqs[-3])]
    assert [m.seq for m in later] == seqs[-3:]
    # The ephemeral replay consumers are gone.
    assert (await js.stream_info(stream)).state.consumer_count == 0


async def test_replay_of_a_stream_without_markers_is_empty(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await js.publish(f"{stream}.west.a", b"data")
    assert [m async for m in replay_markers(port, stream, f"_rsub.{stream}.>")] == []


async def test_tail_starts_at_the_given_sequence_and_sees_new_markers(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    first = await put_marker(port, stream, b"old")
    await js.publish(f"{stream}.west.a", b"data")
    second = await put_marker(port, stream, b"kept")
    task = asyncio.create_task(
        collect(tail_markers(port, stream, f"_rsub.{stream}.>", first + 1), 2)
    )
    await asyncio.sleep(0.2)
    third = await put_marker(port, stream, b"live")
    got = await asyncio.wait_for(task, 10)
    assert [(m.seq, m.data) for m in got] == [(second, b"kept"), (third, b"live")]


async def test_publish_with_a_repeated_msg_id_is_a_duplicate(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    subject = f"_rsub.{stream}.snapshot.west"
    msg_id = f"rsub-west-{uuid.uuid4().hex}"
    first = await port.publish(stream, subject, b"x", msg_id)
    again = await port.publish(stream, subject, b"x", msg_id)
    assert not first.duplicate and again.duplicate
    assert again.seq == first.seq
    assert (await js.stream_info(stream)).state.messages == 1


async def test_publish_to_the_wrong_stream_is_refused(port: JetStreamPort, stream: str) -> None:
    with pytest.raises(APIError, match="expected stream"):
        await port.publish("other", f"_rsub.{stream}.marker.west", b"x", "id-1")


async def test_publish_where_no_stream_listens_is_refused(port: JetStreamPort, stream: str) -> None:
    with pytest.raises(NoRespondersError):
        await port.publish(stream, "_rsub.nowhere.marker.west", b"x", "id-2")


async def test_publish_unacknowledged_times_out(nc: Client) -> None:
    """Something that takes the subject but never answers: the marker is not acknowledged."""
    await nc.subscribe("_rsub.silent.marker.west")
    publisher = MarkerPublisher(timeout_s=0.2)
    with pytest.raises(TimeoutError):
        await publisher.publish(nc, "silent", "_rsub.silent.marker.west", b"x", "id-3")


async def test_one_publisher_serves_many_at_once_and_a_new_client(
    nc: Client, js: JetStreamContext, stream: str, js_server: LoneServer
) -> None:
    """Concurrent publishes each get their own acknowledgement; a new client (the sidecar's
    connection replaced) is listened on anew."""
    publisher = MarkerPublisher()
    subject = f"_rsub.{stream}.marker.west"
    first = await asyncio.gather(
        *(publisher.publish(nc, stream, subject, b"x", f"a-{i}") for i in range(50))
    )
    assert sorted(p.seq for p in first) == list(range(1, 51))
    other = await nats.connect(js_server.url)
    try:
        again = await publisher.publish(other, stream, subject, b"x", "b-0")
    finally:
        await other.close()
    assert (again.seq, again.duplicate) == (51, False)
    assert (await js.stream_info(stream)).state.messages == 51
