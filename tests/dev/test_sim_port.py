"""`SimPort`: the runtime's port over the simulated JetStream, on virtual time, answering in
the shapes the product's parsers read (`sidecar.nats.consumers`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import looptime
import pytest
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from rsub_dev.sim.port import LoopClock, SimNet, SimPort
from rsub_dev.simjs import SimJetStream, StreamConfig
from sidecar.nats.consumers import has_state, position_of
from sidecar.nats.port import JetStreamPort, StoredMessage

STREAM = "orders"


def run(test: Callable[[SimPort, SimNet], Awaitable[None]]) -> None:
    loop = looptime.new_event_loop(start=0)

    async def main() -> None:
        js = SimJetStream(LoopClock(asyncio.get_running_loop()))
        js.stream_create(StreamConfig(STREAM, ("orders.>", "_rsub.orders.>")))
        js.kv_bucket_create("kv")
        net = SimNet(js, random.Random(1), max_delay_ms=5)
        settling = asyncio.get_running_loop().create_task(net.run())
        port: JetStreamPort = SimPort(net)
        try:
            assert isinstance(port, SimPort)
            await test(port, net)
        finally:
            settling.cancel()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_consumers_answer_in_the_server_shape_the_product_parses() -> None:
    async def test(port: SimPort, net: SimNet) -> None:
        for i in range(5):
            net.js.publish(f"orders.a.{i}", b"x")
        config: dict[str, object] = {
            "durable_name": "app",
            "deliver_policy": "all",
            "filter_subject": "orders.>",
            "metadata": {"rsub.replicate": "true"},
            "ack_policy": "explicit",
        }
        await port.consumer_create(STREAM, "app", config, "create", timeout_s=1)
        with pytest.raises(Exception, match="already exists"):
            await port.consumer_create(STREAM, "app", config, "create", timeout_s=1)
        net.js.fetch(STREAM, "app", 2)
        net.js.ack(STREAM, "app", 1)
        net.js.ack(STREAM, "app", 2)
        page = await port.consumer_list(STREAM, 0, timeout_s=1)
        last = (await port.stream_info(STREAM, timeout_s=1))["state"]["last_seq"]
        (info,) = page["consumers"]
        assert has_state(info) and page["total"] == 1 and last == 5
        position = position_of(info, last)
        assert (position.name, position.replicated, position.mark_delete) == ("app", True, 2)
        assert position.config == config  # as created: the product copies it to other regions
        reset = await port.consumer_reset(STREAM, "app", 5, timeout_s=1)
        assert reset["ack_floor"]["stream_seq"] == 4
        with pytest.raises(NotFoundError):
            await port.consumer_info(STREAM, "gone", timeout_s=1)

    run(test)


def test_reads_replay_what_is_stored_and_follow_what_comes() -> None:
    async def test(port: SimPort, net: SimNet) -> None:
        net.js.publish("_rsub.orders.marker.a", b"m1")
        net.js.publish("orders.a.x", b"d1")
        stored = [m async for m in port.read(STREAM, "_rsub.orders.>", 1, live=False)]
        assert stored == [StoredMessage(1, "_rsub.orders.marker.a", b"m1", {})]
        seen: list[int] = []

        async def follow() -> None:
            async for msg in port.read(STREAM, "orders.>", 1, live=True, headers_only=True):
                assert msg.data == b""
                seen.append(msg.seq)

        following = asyncio.get_running_loop().create_task(follow())
        await asyncio.sleep(0.1)
        await port.publish(STREAM, "orders.a.y", b"d2", "id-2")
        duplicate = await port.publish(STREAM, "orders.a.y", b"d2", "id-2")
        assert duplicate.duplicate
        await asyncio.sleep(0.1)
        following.cancel()
        assert seen == [2, 3]
        got = await port.msg_get(STREAM, 1, next_by_subj="orders.>", timeout_s=1)
        assert got is not None and got["seq"] == 2

    run(test)


def test_key_values_and_signals() -> None:
    async def test(port: SimPort, net: SimNet) -> None:
        kv = await port.key_value("kv")
        first = await kv.create("k", b"1")
        assert await kv.update("k", b"2", first) > first
        with pytest.raises(KeyWrongLastSequenceError):
            await kv.update("k", b"3", first)
        heard: list[tuple[str, bytes]] = []
        listener = await port.listen("$JS.ACK.orders.>", lambda s, p: heard.append((s, p)))
        net.signal("$JS.ACK.orders.app.1.1.1.0.0", b"+ACK")
        net.signal("$JS.ACK.other.app.1.1.1.0.0")
        await listener.stop()
        net.signal("$JS.ACK.orders.app.1.2.2.0.0")
        assert heard == [("$JS.ACK.orders.app.1.1.1.0.0", b"+ACK")]
        await port.consumer_create(
            STREAM, "p", {"durable_name": "p", "deliver_policy": "all"}, "create", timeout_s=1
        )
        paused = await port.consumer_pause(STREAM, "p", 10.0, timeout_s=1)
        assert paused["paused"]
        net.js.publish("orders.a.x", b"x")
        assert net.js.fetch(STREAM, "p", 1) == []
        await port.consumer_pause(STREAM, "p", None, timeout_s=1)
        assert len(net.js.fetch(STREAM, "p", 1)) == 1

    run(test)
