"""The simulated JetStream against a real nats-server: the same scenarios, the same outcomes.

Each scenario runs once over a real nats-server (the pinned binary, a fresh lone server)
and once over `rsub_dev.simjs`, through `tests.support.jetstream_scenarios`; what each step
returned (consumer info, deliveries, stored messages, errors) must be equal, step by step.
A step expected to succeed that fails, or expected to fail that succeeds, stops the scenario.
Real waits are short (TTLs and ages of 1 s); the simulation moves its clock instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats
import pytest

from rsub_dev.simjs import (
    ConsumerConfig,
    Delivery,
    SourceConfig,
    StoredMessage,
    StreamConfig,
    StreamInfo,
    SubjectTransform,
    stream_identity,
)
from sidecar.naming import SOURCE_HEADER
from tests.support.jetstream_scenarios import (
    Failure,
    JetStreamScenario,
    RealScenario,
    SimScenario,
    attempt,
)
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

T = TypeVar("T")
Scenario = Callable[[JetStreamScenario], Awaitable[list[tuple[str, object]]]]


class Transcript:
    """What a scenario saw, step by step."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, object]] = []

    async def ok(self, label: str, call: Awaitable[T]) -> T:
        value = await call
        self.steps.append((label, _seen(value)))
        return value

    async def fails(self, label: str, call: Awaitable[object]) -> None:
        outcome = await attempt(call)
        if not isinstance(outcome, Failure):
            raise AssertionError(f"{label}: expected a failure, got {outcome!r}")
        self.steps.append((label, outcome))


def _seen(value: object) -> object:
    """What is compared of a value: a stream's state and de-duplication window (not its
    creation time), deliveries and stored messages without their times."""
    if isinstance(value, StreamInfo):
        heard = sorted((source.name, source.active_ms is not None) for source in value.sources)
        return (value.state, value.config.window_ms, heard)
    if isinstance(value, list):
        return [_seen(v) for v in value]
    if isinstance(value, Delivery):
        return (value.stream_seq, value.consumer_seq, value.subject, value.data, value.num_pending)
    if isinstance(value, StoredMessage):
        return _stored(value, {})
    return value


def _stored(msg: StoredMessage | None, identities: dict[str, str]) -> object:
    """A stored message without its time, the identity in `Nats-Stream-Source` named."""
    if msg is None:
        return None
    headers = dict(msg.headers)
    if SOURCE_HEADER in headers:
        *fields, identity = headers[SOURCE_HEADER].split(" ")
        headers[SOURCE_HEADER] = " ".join([*fields, identities.get(identity, identity)])
    return (msg.seq, msg.subject, msg.data, sorted(headers.items()))


async def consumer_reset(s: JetStreamScenario) -> list[tuple[str, object]]:
    t = Transcript()
    await t.ok("stream", s.stream_create(StreamConfig("S", ("s.>",))))
    for i in range(1, 11):
        await t.ok(f"publish {i}", s.publish(f"s.{i % 2}", b"%d" % i))
    await t.ok("create d", s.consumer_create("S", ConsumerConfig("d")))
    await t.ok("fetch 5", s.fetch("S", "d", 5))
    for seq in (1, 2, 4):
        await s.ack("S", "d", seq)
    await t.ok("acked 1 2 4", s.consumer_info("S", "d"))
    await t.ok("reset to 3", s.consumer_reset("S", "d", 3))
    await t.ok("info after reset", s.consumer_info("S", "d"))
    await t.ok("fetch 3 after reset", s.fetch("S", "d", 3))
    await t.ok("reset to the ack floor", s.consumer_reset("S", "d", 0))
    await t.ok("reset past the end", s.consumer_reset("S", "d", 100))
    await t.ok("publish 11", s.publish("s.1", b"11"))
    await t.ok("publish 12", s.publish("s.0", b"12"))
    await t.ok("past the end, more published", s.consumer_info("S", "d"))
    by_start = ConsumerConfig("e", ("s.1",), "by_start_sequence", 5)
    await t.ok("create e from 5 on s.1", s.consumer_create("S", by_start))
    await t.fails("reset e below its start", s.consumer_reset("S", "e", 3))
    await t.ok("reset e to 6", s.consumer_reset("S", "e", 6))
    await t.ok("fetch e (fewer than asked)", s.fetch("S", "e", 5))
    await s.ack("S", "e", 9)
    await t.ok("e acked 9 of 7 9 11", s.consumer_info("S", "e"))
    await s.ack("S", "e", 7)
    await t.ok("e acked 7 too", s.consumer_info("S", "e"))
    await s.ack("S", "e", 11)
    await t.ok("e acked all it got", s.consumer_info("S", "e"))
    await t.ok("reset e to its ack floor", s.consumer_reset("S", "e", 0))
    await t.fails("reset a consumer that does not exist", s.consumer_reset("S", "zz", 1))
    await t.fails("info of a consumer that does not exist", s.consumer_info("S", "zz"))
    await t.fails("fetch from a consumer that does not exist", s.fetch("S", "zz", 1))
    await t.fails("create on a stream that does not exist", s.consumer_create("T", by_start))
    await t.fails(
        "create d again, otherwise", s.consumer_create("S", ConsumerConfig("d", ("s.0",)))
    )
    await t.ok("create d again, the same", s.consumer_create("S", ConsumerConfig("d")))
    await t.ok("pause d", s.consumer_pause("S", "d", True))
    await t.ok("resume d", s.consumer_pause("S", "d", False))
    return t.steps


async def purge_under_consumers(s: JetStreamScenario) -> list[tuple[str, object]]:
    t = Transcript()
    await t.ok("stream", s.stream_create(StreamConfig("P", ("p.>",))))
    for i in range(1, 11):
        await s.publish("p.x", b"%d" % i)
    for name in ("a", "b", "idle", "r"):
        await s.consumer_create("P", ConsumerConfig(name))
    for name in ("a", "r"):
        await t.ok(f"fetch {name} 6", s.fetch("P", name, 6))
        for seq in (1, 2, 4):
            await s.ack("P", name, seq)
    await t.ok("fetch b 3", s.fetch("P", "b", 3))
    for seq in (1, 2, 3):
        await s.ack("P", "b", seq)

    async def infos(label: str) -> None:
        for name in ("a", "b", "idle"):
            await t.ok(f"{label}: {name}", s.consumer_info("P", name))

    await infos("before")
    await t.ok("purge all but 7", s.stream_purge("P", 7))
    await infos("all but 7")
    # Its store reports ack floor 4; its running floor stays 3, where a reset to 0 goes back.
    await t.ok("reset r to its ack floor", s.consumer_reset("P", "r", 0))
    await t.ok("purge all but 3", s.stream_purge("P", 3))
    await infos("all but 3")
    await t.ok("fetch a", s.fetch("P", "a", 10))
    await t.ok("purge all", s.stream_purge("P"))
    await infos("all purged")
    await t.ok("stream", s.stream_info("P"))
    await t.ok("create after", s.consumer_create("P", ConsumerConfig("n")))
    below = ConsumerConfig("m", (), "by_start_sequence", 3)
    await t.ok("create from below the first", s.consumer_create("P", below))
    above = ConsumerConfig("k", (), "by_start_sequence", 30)
    await t.ok("create from past the end", s.consumer_create("P", above))
    await t.ok("publish", s.publish("p.x", b"11"))
    for name in ("a", "b", "idle", "n", "m", "k"):
        await t.ok(f"after a publish: {name}", s.consumer_info("P", name))
    await t.ok("get a purged message", s.msg_get("P", 3))
    await t.ok("purge all but more than there are", s.stream_purge("P", 5))
    for name in ("idle", "k"):
        await t.ok(f"nothing purged: {name}", s.consumer_info("P", name))
    return t.steps


async def limit_by_count(s: JetStreamScenario) -> list[tuple[str, object]]:
    t = Transcript()
    await t.ok("stream", s.stream_create(StreamConfig("L", ("l.>",), max_msgs=5)))
    for i in range(1, 6):
        await s.publish("l.b" if i == 5 else "l.a", b"%d" % i)
    for name in ("a", "idle", "b"):
        await s.consumer_create("L", ConsumerConfig(name))
    await s.consumer_create("L", ConsumerConfig("f", ("l.b",)))
    await t.ok("fetch a 4", s.fetch("L", "a", 4))
    for seq in (1, 3):
        await s.ack("L", "a", seq)
    await t.ok("fetch b 1", s.fetch("L", "b", 1))
    await s.ack("L", "b", 1)
    await t.ok("fetch f", s.fetch("L", "f", 3))
    for i in range(6, 9):
        await t.ok(f"publish {i}", s.publish("l.a", b"%d" % i))  # removes 1, 2, 3
    await s.wait(200)  # the server terminates removed pending messages in a goroutine
    await t.ok("stream", s.stream_info("L"))
    for name in ("a", "idle", "b", "f"):
        await t.ok(f"three removed: {name}", s.consumer_info("L", name))
    await t.ok("fetch a", s.fetch("L", "a", 10))
    await t.ok("fetch idle", s.fetch("L", "idle", 2))
    await t.ok("next l.b from 1", s.msg_get("L", 1, "l.b"))
    await t.ok("next l.> from 6", s.msg_get("L", 6, "l.>"))
    await t.ok("next l.b from 6", s.msg_get("L", 6, "l.b"))
    for name in ("a", "idle"):
        await t.ok(f"after fetching: {name}", s.consumer_info("L", name))
    return t.steps


async def limit_by_age(s: JetStreamScenario) -> list[tuple[str, object]]:
    t = Transcript()
    await t.ok("stream", s.stream_create(StreamConfig("G", ("g.>",), max_age_ms=1_000)))
    for i in range(1, 6):
        await s.publish("g.a", b"%d" % i)
    for name in ("a", "idle"):
        await s.consumer_create("G", ConsumerConfig(name))
    await t.ok("fetch a 4", s.fetch("G", "a", 4))
    for seq in (1, 3):
        await s.ack("G", "a", seq)
    await s.wait(1_500)
    await t.ok("publish", s.publish("g.a", b"6"))
    await t.ok("stream", s.stream_info("G"))
    for name in ("a", "idle"):
        await t.ok(f"five expired: {name}", s.consumer_info("G", name))
    await t.ok("fetch idle", s.fetch("G", "idle", 1))
    return t.steps


async def kv_ttl(s: JetStreamScenario) -> list[tuple[str, object]]:
    t = Transcript()
    await s.kv_bucket_create("L", ttl_ms=1_000)
    first = await t.ok("put k", s.kv_put("L", "k", b"v1"))
    await t.fails("create k", s.kv_create("L", "k", b"x"))
    await t.fails("update k from 99", s.kv_update("L", "k", b"x", 99))
    await t.ok("update k", s.kv_update("L", "k", b"v2", first))
    await t.ok("get k", s.kv_get("L", "k"))
    await s.kv_delete("L", "k")
    await t.fails("get k deleted", s.kv_get("L", "k"))
    await t.ok("create k again", s.kv_create("L", "k", b"v3"))
    other = await t.ok("put k2", s.kv_put("L", "k2", b"a"))
    await t.fails("delete k2 over another revision", s.kv_delete("L", "k2", other - 1))
    await s.wait(1_500)
    await t.fails("get k expired", s.kv_get("L", "k"))
    await t.fails("get k2 expired", s.kv_get("L", "k2"))
    await t.fails("update k expired", s.kv_update("L", "k", b"v4", other - 1))
    await t.ok("create k expired", s.kv_create("L", "k", b"v5"))
    await t.ok("update k2 expired from 0", s.kv_update("L", "k2", b"b", 0))
    await t.ok("get k2", s.kv_get("L", "k2"))
    await t.ok("the bucket's stream", s.stream_info("KV_L"))
    return t.steps


async def sourcing(s: JetStreamScenario) -> list[tuple[str, object]]:
    """A read stream sourcing two write streams as the virtual-stream layout does
    (docs/topology.md), de-duplicating by `Nats-Msg-Id` within its window; which sources a
    stream has heard from (`active`), one of a stream that does not exist never."""
    t = Transcript()
    east = StreamConfig("W-east", ("foo.east.>", "_m.east"), duplicate_window_ms=500)
    west = StreamConfig("W-west", ("foo.west.>",))
    renamed = (SubjectTransform("foo.*.>", "foo.>"), SubjectTransform("_m.east", "_m.east"))
    read = StreamConfig(
        "R",
        ("local.r",),
        duplicate_window_ms=10_000,
        sources=(
            SourceConfig("W-east", subject_transforms=renamed),
            SourceConfig("W-west", "foo.west.a"),
        ),
    )
    filtered = StreamConfig("R2", ("local.r2",), sources=(SourceConfig("W-east", "foo.east.a"),))
    sources_nowhere = (SourceConfig("W-east"), SourceConfig("W-nowhere"))
    created = {}
    for config in (east, west, read, filtered):
        created[config.name] = (await t.ok(config.name, s.stream_create(config))).created
    identities = {stream_identity(c): f"<identity of {name}>" for name, c in created.items()}
    m1 = {"Nats-Msg-Id": "m1", "X": "y", "Nats-Expected-Stream": "W-east"}
    await t.ok("m1", s.publish("foo.east.a.b", b"1", m1))
    await t.ok("m1 again", s.publish("foo.east.a.b", b"1", {"Nats-Msg-Id": "m1"}))
    await t.ok("m2", s.publish("foo.east.a", b"2", {"Nats-Msg-Id": "m2"}))
    await t.ok("marker", s.publish("_m.east", b"m"))
    await t.fails(
        "expected another stream", s.publish("foo.east.c", b"3", {"Nats-Expected-Stream": "X"})
    )
    await s.wait_sourced("R", 3)
    await t.ok("m1 in the west", s.publish("foo.west.a", b"w", {"Nats-Msg-Id": "m1"}))
    await t.ok("not sourced", s.publish("foo.west.b", b"w"))
    await s.wait(700)  # past the write stream's window, not the read stream's
    await t.ok("m1 once more", s.publish("foo.east.a.b", b"1", {"Nats-Msg-Id": "m1"}))
    await t.ok("m3", s.publish("foo.east.a", b"3", {"Nats-Msg-Id": "m3"}))
    await s.wait_sourced("R", 4)
    await s.wait_sourced("R2", 2)
    # A source whose stream does not exist is never heard from.
    await t.ok("R3", s.stream_create(StreamConfig("R3", ("local.r3",), sources=sources_nowhere)))
    await s.wait(700)
    await t.ok("R3 state", s.stream_info("R3"))
    for name in ("R", "R2"):
        info = await t.ok(f"{name} state", s.stream_info(name))
        for seq in range(1, info.state.last_seq + 1):
            t.steps.append((f"{name} {seq}", _stored(await s.msg_get(name, seq), identities)))
    return t.steps


SCENARIOS: list[Scenario] = [
    consumer_reset,
    purge_under_consumers,
    limit_by_count,
    limit_by_age,
    kv_ttl,
    sourcing,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
async def test_the_simulation_sees_what_a_real_server_does(
    scenario: Scenario, tmp_path: Path
) -> None:
    async with LoneServer(tmp_path, {}) as server:
        nc = await nats.connect(server.url)
        try:
            real = await scenario(RealScenario(nc))
        finally:
            await nc.close()
    simulated = await scenario(SimScenario())
    assert simulated == real
