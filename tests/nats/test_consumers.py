"""Positions, forward-only resets and create-if-absent against a real JetStream server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from sidecar.nats import jsapi
from sidecar.nats.consumers import (
    PositionReader,
    create_consumer,
    lets_through,
    move_forward,
    set_replicated,
)
from sidecar.nats.effective import EffectivePositions, Floor
from sidecar.nats.port import JetStreamPort
from tests.support.api_requests import requests_on
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

REPLICATED = {"rsub.replicate": "true"}


@pytest.fixture
async def stream(js: JetStreamContext) -> str:
    """A read-stream-like stream `V` with data on `V.>` and markers on `_rsub.V.>`."""
    name = f"S{uuid.uuid4().hex[:8]}"
    await js.add_stream(name=name, subjects=[f"{name}.>", f"_rsub.{name}.>"], max_consumers=300)
    return name


def reader_of(stream: str) -> PositionReader:
    """The position reader of the stream made by the `stream` fixture (markers `_rsub.V.>`)."""
    return PositionReader(stream, marker_filter=f"_rsub.{stream}.>")


async def publish(js: JetStreamContext, stream: str, data: int, markers: int = 0) -> None:
    for i in range(data):
        await js.publish(f"{stream}.west.x", str(i).encode(), stream=stream)
    for i in range(markers):
        await js.publish(f"_rsub.{stream}.marker.west", str(i).encode(), stream=stream)


async def durable(
    js: JetStreamContext,
    stream: str,
    name: str,
    metadata: Mapping[str, str] | None = REPLICATED,
    **config: Any,
) -> JetStreamContext.PullSubscription:
    """A durable on the data (`V.>`, unless `config` has other filters)."""
    config.setdefault("filter_subject", f"{stream}.>")
    await js.add_consumer(
        stream,
        durable_name=name,
        ack_policy=api.AckPolicy.EXPLICIT,
        metadata=dict(metadata) if metadata is not None else None,
        **config,
    )
    return await js.pull_subscribe_bind(name, stream=stream)


async def consume(sub: JetStreamContext.PullSubscription, n: int, *, ack: bool = True) -> None:
    for msg in await sub.fetch(n, timeout=2):
        if ack:
            await msg.ack_sync()


async def test_positions_follow_the_ack_floor_and_the_stream_end_when_caught_up(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=5, markers=2)  # seqs 1-5 data, 6-7 markers
    behind = await durable(js, stream, "behind")
    caught_up = await durable(js, stream, "caught_up")
    unacked = await durable(js, stream, "unacked")
    await durable(js, stream, "plain", metadata=None)
    await consume(behind, 3)
    await consume(caught_up, 5)
    await consume(unacked, 5, ack=False)

    positions = await reader_of(stream).read(port)

    assert positions.last_seq == 7
    by_name = {c.name: c for c in positions.consumers}
    assert set(by_name) == {"behind", "caught_up", "unacked", "plain"}
    assert [c.name for c in positions.consumers if not c.replicated] == ["plain"]
    assert (by_name["behind"].mark_delete, by_name["behind"].num_pending) == (3, 2)
    # Nothing pending and nothing unacked: everything up to the stream's end is consumed.
    assert by_name["caught_up"].ack_floor == 5
    assert by_name["caught_up"].mark_delete == 7
    assert by_name["unacked"].mark_delete == 0
    assert by_name["unacked"].num_ack_pending == 5
    assert positions.skipped == ()


async def test_a_durable_with_data_pending_stands_past_what_it_does_not_deliver(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=2, markers=2)  # data 1-2, markers 3-4
    await js.publish(f"{stream}.east.x", b"e", stream=stream)  # 5: outside west's filter
    await publish(js, stream, data=1, markers=1)  # data 6 (pending everywhere), marker 7
    # Delivers `V.>`: the markers after its floor are passed, not the data at 5.
    data = await durable(js, stream, "data")
    # Delivers `V.west.>` only: the east message at 5 is passed too, up to the data at 6.
    west = await durable(js, stream, "west", filter_subject=f"{stream}.west.>")
    # Delivers data and markers (several filters): nothing after its floor is passed.
    both = await durable(
        js, stream, "both", filter_subject=None, filter_subjects=[f"{stream}.>", "_rsub.>"]
    )
    # No filter at all: it delivers every message, so nothing is passed (and nothing asked).
    everything = await durable(js, stream, "everything", filter_subject=None)
    plain = await durable(js, stream, "plain", metadata=None, filter_subject=f"{stream}.west.>")
    for sub in (data, west, both, everything, plain):
        await consume(sub, 2)

    positions = await reader_of(stream).read(port)

    by_name = {c.name: c for c in positions.consumers}
    assert {name: c.ack_floor for name, c in by_name.items()} == dict.fromkeys(by_name, 2)
    assert {name: c.mark_delete for name, c in by_name.items()} == {
        "data": 4,
        "west": 5,
        "both": 2,
        "everything": 2,
        "plain": 2,  # not replicated: nobody's position, never scanned
    }
    # Those whose filters let the markers through are named, with their filters.
    assert positions.receiving_markers == {"both": (f"{stream}.>", "_rsub.>"), "everything": ()}


@pytest.mark.parametrize(
    ("filters", "through"),
    [
        ((), True),
        ((">",), True),
        (("*.>",), True),
        (("_rsub.>",), True),
        (("_rsub.V.marker.west",), True),
        (("_rsub.*.snapshot.*",), True),
        (("V.>", "_rsub.V.>"), True),
        (("V.>",), False),
        (("V.west.>", "V.east.>"), False),
        (("_rsub.V",), False),  # one token short of any marker subject
        (("_rsub.W.>",), False),
        (("*.*",), False),
        (("*.V",), False),
        (("*.V.marker",), True),  # no marker has this subject, but the namespace is theirs
    ],
)
def test_lets_through_finds_filters_overlapping_the_markers(
    filters: tuple[str, ...], through: bool
) -> None:
    assert lets_through(filters, "_rsub.V.>") is through


async def test_an_effective_floor_never_reaches_past_last_seq(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=1, markers=2)  # data 1, markers 2-3
    filters = (f"{stream}.west.>", f"{stream}.central.>")
    positions = EffectivePositions(stream)
    assert await positions.read(port, {"d": Floor(1, filters)}, 2) == {"d": 2}
    # What was stored after the caller read `last_seq` is never claimed, data or not.
    await publish(js, stream, data=0, markers=1)  # 4
    await js.publish(f"{stream}.central.x", b"c", stream=stream)  # 5: delivered
    assert await positions.read(port, {"d": Floor(1, filters)}, 4) == {"d": 4}
    assert await positions.read(port, {"d": Floor(1, filters)}, 5) == {"d": 4}
    assert positions.known("d", Floor(1, filters), 9) == 4
    assert positions.known("d", Floor(1, filters[:1]), 9) == 1  # other filters: not known


async def test_a_paused_durable_stands_over_messages_removed_after_its_floor(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    """Its floor stays put (paused: a returned region's hold), the messages after it are
    removed by the stream's limits (which move no floor over messages never delivered): it
    can deliver none of them, so its position passes them once they are gone, though a read
    before learnt the next one was there (`make soak` seed 559096701612,
    tests/dev/test_shell_failback.py)."""
    await publish(js, stream, data=6, markers=0)  # data 1-6
    sub = await durable(js, stream, "d")
    await consume(sub, 2)
    reader = reader_of(stream)
    [position] = (await reader.read(port)).consumers
    assert position.mark_delete == 2  # 3 is next: data pending
    config = (await js.stream_info(stream)).config
    await js.update_stream(dataclasses.replace(config, max_msgs=2))
    await publish(js, stream, data=1, markers=0)  # 7: the stream keeps 6-7
    [position] = (await reader.read(port)).consumers
    assert (position.ack_floor, position.mark_delete) == (2, 5)


async def test_a_read_tells_how_long_a_durables_pause_has_left(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    """The failback guard's successor takes over a hold left standing from it (docs/protocol.md
    §7, `PositionsListing.paused`): the server's `pause_remaining`, in ms; None unpaused."""
    await publish(js, stream, data=3)
    await durable(js, stream, "held")
    await durable(js, stream, "free")
    await port.consumer_pause(stream, "held", 30.0, timeout_s=5)
    positions = {c.name: c for c in (await reader_of(stream).read(port)).consumers}
    remaining = positions["held"].paused_ms
    assert remaining is not None and 25_000 < remaining <= 30_000
    assert positions["free"].paused_ms is None
    await port.consumer_pause(stream, "held", None, timeout_s=5)
    positions = {c.name: c for c in (await reader_of(stream).read(port)).consumers}
    assert positions["held"].paused_ms is None


async def test_a_floor_is_scanned_once_per_filter_while_nothing_arrives(
    port: JetStreamPort, js_server: LoneServer, js: JetStreamContext, stream: str
) -> None:
    async with requests_on(js_server.url, f"$JS.API.STREAM.MSG.GET.{stream}") as requests:
        await publish(js, stream, data=3, markers=2)  # data 1-3, markers 4-5
        sub = await durable(
            js,
            stream,
            "d",
            filter_subject=None,
            filter_subjects=[f"{stream}.west.>", f"{stream}.east.>"],
        )
        await consume(sub, 1)
        reader = reader_of(stream)
        for _ in range(3):
            [position] = (await reader.read(port)).consumers
            assert position.mark_delete == 1
        assert await requests.count() == 2  # one per filter subject, for the first read only
        await consume(sub, 2)  # floor 3: only markers after it, nothing pending
        [position] = (await reader.read(port)).consumers
        assert position.mark_delete == 5
        assert await requests.count() == 2  # nothing pending: the stream's end, no scan


async def test_unsupported_deliver_policies_are_skipped_with_a_reason(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=2)
    await durable(js, stream, "newest", deliver_policy=api.DeliverPolicy.NEW)
    await durable(js, stream, "newest_plain", metadata=None, deliver_policy=api.DeliverPolicy.NEW)
    await js.subscribe(f"{stream}.>", stream=stream)  # an ephemeral consumer: not listed
    positions = await reader_of(stream).read(port)
    assert [c.name for c in positions.consumers] == ["newest_plain"]
    [skipped] = positions.skipped
    assert skipped.name == "newest"
    assert "'new'" in skipped.reason


async def test_listing_pages_through_many_consumers(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    for i in range(260):
        await js.add_consumer(
            stream, durable_name=f"d{i}", filter_subject=f"{stream}.>", metadata=REPLICATED
        )
    positions = await reader_of(stream).read(port)
    assert len(positions.consumers) == 260


async def test_move_forward_resets_only_forward_and_clamps_to_the_end(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=10)
    sub = await durable(js, stream, "d")
    await consume(sub, 4)

    back = await move_forward(port, stream, "d", 2)
    assert not back.moved and back.ack_floor_after == 4

    ahead = await move_forward(port, stream, "d", 7)
    assert ahead.moved and (ahead.ack_floor_before, ahead.ack_floor_after) == (4, 7)
    [msg] = await sub.fetch(1, timeout=2)
    assert msg.metadata.sequence.stream == 8
    await msg.ack_sync()

    beyond = await move_forward(port, stream, "d", 1000)
    assert beyond.moved and beyond.ack_floor_after == 10
    await publish(js, stream, data=1)
    [msg] = await sub.fetch(1, timeout=2)
    assert msg.metadata.sequence.stream == 11


async def test_a_consumer_in_use_is_not_reset_over_markers_alone(
    port: JetStreamPort, nc: Client, js: JetStreamContext, stream: str
) -> None:
    """Chaos seed 508 (docs/reliability.md): the update east's own consumption echoed back
    from west named the markers after the last message east's application had acked, and
    the reset over them left every later ack of that application unanswered. Between a
    consumer and such a position lies nothing it delivers: it is left alone, its delivery
    sequence goes on, and a move over data still happens."""
    await publish(js, stream, data=5, markers=3)  # seqs 1-5 data, 6-8 markers
    sub = await durable(js, stream, "d")
    await consume(sub, 5)
    waiting = asyncio.create_task(sub.fetch(1, timeout=5))  # the application, waiting
    await asyncio.sleep(0.2)

    outcome = await move_forward(port, stream, "d", 8)

    assert not outcome.moved and outcome.ack_floor_after == 5
    await publish(js, stream, data=1)  # seq 9
    [msg] = await waiting
    assert (msg.metadata.sequence.stream, msg.metadata.sequence.consumer) == (9, 6)
    await msg.ack_sync(timeout=2)
    info = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.d", timeout_s=5)
    assert info["ack_floor"]["stream_seq"] == 9 and info["ack_floor"]["consumer_seq"] == 6

    await publish(js, stream, data=2, markers=1)  # seqs 10-11 data, 12 a marker
    over_data = await move_forward(port, stream, "d", 12)
    assert over_data.moved and over_data.ack_floor_after == 12


@pytest.mark.parametrize("after_info", [1, 2])
async def test_a_client_fetching_while_its_consumer_is_moved_is_never_rewound(
    port: JetStreamPort,
    js: JetStreamContext,
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
    after_info: int,
) -> None:
    """A client fetches right after the move's first or second look at the consumer. Either
    the move sees the delivery and leaves the consumer alone, or the fetch gets nothing until
    the move is done; never a rewind: every message comes once and every ack is answered."""
    await publish(js, stream, data=10)
    sub = await durable(js, stream, "d")
    infos = 0
    real_request = jsapi.request
    during: list[Msg] = []

    async def fetch_after_a_look(
        conn: Client, op: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        nonlocal infos
        reply = await real_request(conn, op, payload, **kw)
        infos += op.startswith("CONSUMER.INFO.")
        if op.startswith("CONSUMER.INFO.") and infos == after_info:
            with contextlib.suppress(TimeoutError):
                during.extend(await sub.fetch(6, timeout=0.5))
        return reply

    monkeypatch.setattr(jsapi, "request", fetch_after_a_look)
    await move_forward(port, stream, "d", 3)
    monkeypatch.undo()
    with contextlib.suppress(TimeoutError):
        during.extend(await sub.fetch(10, timeout=2))
    seen = [msg.metadata.sequence.stream for msg in during]
    for msg in during:
        await msg.ack_sync(timeout=2)

    assert sorted(seen) == seen and len(set(seen)) == len(seen)
    assert seen[-1] == 10
    assert not (await js.consumer_info(stream, "d")).paused


@pytest.mark.parametrize("purged_at", ["STREAM.INFO.", "CONSUMER.PAUSE.", "CONSUMER.RESET."])
async def test_a_moves_outcome_carries_the_first_sequence_read_after_its_floor(
    port: JetStreamPort,
    js: JetStreamContext,
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
    purged_at: str,
) -> None:
    """An operator purges the stream (1 to 6) during a move to 3: before its look at the
    stream (after its first look at the consumer), before its pause, or before its reset.
    Whatever floor the outcome reports, the stream's first sequence it carries was read
    after that floor, so the machine tells a floor the purge moved from consumption (the
    shell simulation's seed 21, `make soak` seed 1067974121501). A reset's reply puts the
    floor at the reset's start less one, whatever was purged."""
    await publish(js, stream, data=10)
    await durable(js, stream, "d")
    real_request = jsapi.request
    purged = False

    async def purge_during_the_move(
        conn: Client, op: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        nonlocal purged
        if op.startswith(purged_at) and not purged:
            purged = True
            await js.purge_stream(stream, seq=7)
        return await real_request(conn, op, payload, **kw)

    monkeypatch.setattr(jsapi, "request", purge_during_the_move)
    outcome = await move_forward(port, stream, "d", 3)
    monkeypatch.undo()

    assert purged
    expected = {  # (moved, floor): the floor as last read, before or after the purge
        "STREAM.INFO.": (False, 0),
        "CONSUMER.PAUSE.": (False, 6),
        "CONSUMER.RESET.": (True, 3),
    }
    assert (outcome.moved, outcome.ack_floor_after) == expected[purged_at], outcome
    # Beyond the target only where the purge put it, which the first sequence shows.
    assert outcome.ack_floor_after <= max(3, outcome.first_seq - 1), outcome


async def test_a_move_goes_on_unpaused_when_the_server_cannot_pause(
    port: JetStreamPort, js: JetStreamContext, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause needs the JetStream meta leader, which a region that lost most of the others
    lacks; a reset does not. The move must not depend on it."""
    await publish(js, stream, data=10)
    await durable(js, stream, "d")
    real_request = jsapi.request

    async def no_meta_leader(
        conn: Client, op: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        if op.startswith("CONSUMER.PAUSE."):
            raise APIError(code=503, err_code=10008, description="JetStream system unavailable")
        return await real_request(conn, op, payload, **kw)

    monkeypatch.setattr(jsapi, "request", no_meta_leader)
    outcome = await move_forward(port, stream, "d", 6)
    assert outcome.moved and outcome.ack_floor_after == 6


async def test_moving_a_consumer_its_user_paused_leaves_it_paused(
    port: JetStreamPort, nc: Client, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=5)
    await durable(js, stream, "d")
    until = (datetime.now(UTC) + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    await jsapi.request(nc, f"CONSUMER.PAUSE.{stream}.d", {"pause_until": until}, timeout_s=5)

    outcome = await move_forward(port, stream, "d", 2)

    assert outcome.moved and outcome.ack_floor_after == 2
    info = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.d", timeout_s=5)
    assert info["paused"] is True


async def test_move_forward_of_a_missing_durable_raises_not_found(
    port: JetStreamPort, stream: str
) -> None:
    with pytest.raises(NotFoundError):
        await move_forward(port, stream, "missing", 3)


async def test_create_consumer_copies_the_origin_config_and_starts_after_the_position(
    port: JetStreamPort, nc: Client, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=6)
    await durable(js, stream, "origin", max_ack_pending=17, description="from west")
    origin = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.origin", timeout_s=2)

    assert await create_consumer(port, stream, "copy", origin["config"], 4) == 4
    info = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.copy", timeout_s=2)
    config = info["config"]
    assert config["durable_name"] == "copy"
    assert config["deliver_policy"] == "by_start_sequence"
    assert config["opt_start_seq"] == 5
    assert config["max_ack_pending"] == 17
    assert config["filter_subject"] == f"{stream}.>"
    assert config["metadata"]["rsub.replicate"] == "true"
    assert info["ack_floor"]["stream_seq"] == 4
    sub = await js.pull_subscribe_bind("copy", stream=stream)
    [msg] = await sub.fetch(1, timeout=2)
    assert msg.metadata.sequence.stream == 5


async def test_create_consumer_never_replaces_an_existing_one(
    port: JetStreamPort, nc: Client, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=6)
    await durable(js, stream, "d")
    origin = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.d", timeout_s=2)
    assert await create_consumer(port, stream, "d", origin["config"], 4) is None
    info = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.d", timeout_s=2)
    assert info["config"]["deliver_policy"] == "all"


async def test_create_consumer_clamps_the_start_to_the_stream_end(
    port: JetStreamPort, nc: Client, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=3)
    await durable(js, stream, "origin")
    origin = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.origin", timeout_s=2)
    # Clamped to the stream's end (3): it starts at 4, its ack floor is 3.
    floor = await create_consumer(port, stream, "copy", origin["config"], 50)
    info = await jsapi.request(nc, f"CONSUMER.INFO.{stream}.copy", timeout_s=2)
    assert info["config"]["opt_start_seq"] == 4 and floor == 3


async def test_set_replicated_toggles_the_metadata_and_keeps_the_rest(
    port: JetStreamPort, js: JetStreamContext, stream: str
) -> None:
    await publish(js, stream, data=3)
    await durable(js, stream, "d", metadata={"team": "blue"}, max_ack_pending=9)
    on = await set_replicated(port, stream, "d", True)
    assert on.replicated and on.config["metadata"]["team"] == "blue"
    assert on.config["max_ack_pending"] == 9
    off = await set_replicated(port, stream, "d", False)
    assert not off.replicated and off.config["metadata"]["team"] == "blue"
    await durable(js, stream, "n", metadata=None, deliver_policy=api.DeliverPolicy.NEW)
    with pytest.raises(ValueError, match="deliver policy 'new'"):
        await set_replicated(port, stream, "n", True)
    with pytest.raises(NotFoundError):
        await set_replicated(port, stream, "missing", True)
