"""`NatsPort`, the real `JetStreamPort`: the operations the runtime uses, against a real
JetStream server, each JetStream API request through the one request path."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import BucketNotFoundError

from sidecar.config.nats import NatsConfig
from sidecar.nats import jsapi
from sidecar.nats.connection import NatsConnection
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort, StoredMessage
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration


async def take(messages: AsyncGenerator[StoredMessage, None], n: int) -> list[StoredMessage]:
    taken: list[StoredMessage] = []
    async with contextlib.aclosing(messages):
        async for msg in messages:
            taken.append(msg)
            if len(taken) == n:
                break
    return taken


async def test_read_replays_what_is_stored_and_tails_what_comes(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    for i in range(4):
        subject = f"{stream}.{'a' if i % 2 == 0 else 'b'}"
        await js.publish(subject, f"m{i}".encode(), headers={"h": str(i)})

    stored = [m async for m in port.read(stream, f"{stream}.a", 2, live=False)]
    assert stored == [StoredMessage(3, f"{stream}.a", b"m2", {"h": "2"})]
    heads = [m async for m in port.read(stream, f"{stream}.>", 1, live=False, headers_only=True)]
    assert [(m.seq, m.data, m.headers["h"], m.headers["Nats-Msg-Size"]) for m in heads] == [
        (seq, b"", str(seq - 1), "2") for seq in range(1, 5)
    ]

    tail = asyncio.create_task(take(port.read(stream, f"{stream}.b", 3, live=True), 2))
    await asyncio.sleep(0.2)
    await js.publish(f"{stream}.a", b"m4")
    await js.publish(f"{stream}.b", b"m5")
    tailed = await asyncio.wait_for(tail, 10)
    assert [(m.seq, m.data) for m in tailed] == [(4, b"m3"), (6, b"m5")]


async def test_every_api_request_goes_through_the_one_request_path(
    port: JetStreamPort,
    js: JetStreamContext,
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await js.publish(f"{stream}.a", b"m")
    await js.add_consumer(stream, durable_name="d", ack_policy=api.AckPolicy.EXPLICIT)
    real_request = jsapi.request
    ops: list[str] = []

    async def recorded(
        conn: Client, op: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        ops.append(op.removesuffix(f".{stream}").removesuffix(f".{stream}.d"))
        return await real_request(conn, op, payload, **kw)

    monkeypatch.setattr(jsapi, "request", recorded)
    assert (await port.stream_info(stream, timeout_s=5))["state"]["last_seq"] == 1
    assert (await port.msg_get(stream, 1, timeout_s=5) or {})["seq"] == 1
    assert await port.msg_get(stream, 2, timeout_s=5) is None
    assert (await port.consumer_list(stream, 0, timeout_s=5))["total"] == 1
    info = await port.consumer_info(stream, "d", timeout_s=5)
    config = {**info["config"], "description": "edited"}
    edited = await port.consumer_create(stream, "d", config, "update", timeout_s=5)
    assert edited["config"]["description"] == "edited"
    reset = await port.consumer_reset(stream, "d", 2, timeout_s=5)
    assert reset["ack_floor"]["stream_seq"] == 1
    await port.consumer_pause(stream, "d", 60, timeout_s=5)
    assert ops == [
        "STREAM.INFO",
        "STREAM.MSG.GET",
        "STREAM.MSG.GET",
        "CONSUMER.LIST",
        "CONSUMER.INFO",
        "CONSUMER.CREATE",
        "CONSUMER.RESET",
        "CONSUMER.PAUSE",
    ]


async def test_a_pause_lasts_the_seconds_asked_and_none_resumes(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await js.add_consumer(stream, durable_name="d", ack_policy=api.AckPolicy.EXPLICIT)
    before = datetime.now(UTC)
    paused = await port.consumer_pause(stream, "d", 30, timeout_s=5)
    until = datetime.fromisoformat(paused["pause_until"])
    assert paused["paused"] is True
    assert 29 <= (until - before).total_seconds() <= 31
    assert (await js.consumer_info(stream, "d")).paused

    resumed = await port.consumer_pause(stream, "d", None, timeout_s=5)
    assert resumed["paused"] is False
    assert not (await js.consumer_info(stream, "d")).paused


async def test_listen_hears_each_message_until_stopped(port: JetStreamPort, nc: Client) -> None:
    heard: list[tuple[str, bytes]] = []
    listener = await port.listen("signals.>", lambda s, p: heard.append((s, p)))
    for subject in ("signals.a", "signals.b", "other"):
        await nc.publish(subject, subject.encode())
    await nc.flush()
    await asyncio.sleep(0.1)
    assert heard == [("signals.a", b"signals.a"), ("signals.b", b"signals.b")]
    await listener.stop()
    await nc.publish("signals.a", b"")
    await nc.flush()
    await asyncio.sleep(0.1)
    assert len(heard) == 2


async def test_key_value_binds_an_existing_bucket(
    port: JetStreamPort, js: JetStreamContext
) -> None:
    bucket = f"kv-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BucketNotFoundError):
        await port.key_value(bucket)
    await js.create_key_value(bucket=bucket)
    kv = await port.key_value(bucket)
    first = await kv.create("k", b"1")
    assert await kv.update("k", b"2", first) > first
    assert (await kv.get("k")).value == b"2"


async def test_a_port_over_a_connection_works_once_it_is_up(
    js_server: LoneServer, js: JetStreamContext, stream: str
) -> None:
    """The runtime's port is made with the connection, before it connects, and follows the
    client the connection holds."""
    conn = NatsConnection(NatsConfig(servers=(js_server.url,)), name="port-test")
    port = NatsPort(conn)
    await conn.connect()
    try:
        await js.publish(f"{stream}.a", b"m")
        assert (await port.stream_info(stream, timeout_s=5))["state"]["messages"] == 1
        published = await port.publish(stream, f"{stream}.b", b"x", "id-1")
        assert (published.seq, published.duplicate) == (2, False)
    finally:
        await conn.close()
