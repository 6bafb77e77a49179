"""A purge during a positions read (`LocalSubscriptions.read`, one real server).

An operator purges the read stream (1 to 6) while a read takes a position from it: before
the consumer listing (the durable's floor moves over what the purge removed), or before a
scan past a durable's floor or a cursor (the scan finds the next message still stored and
runs over the removed ones). Each position lands at 6, where the purge put it; the first
sequence the listing carries is read after them all (7), so the machine takes none of them
for its consumers' (no position at or below the first sequence less one is a sign,
docs/protocol.md §8). Read with the last sequence, before the listing, it was 1: `make
soak` seed 874624534575 (tests/dev/test_shell_sim.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import api

from sidecar.naming import VirtualStream
from sidecar.nats import jsapi
from sidecar.nats.consumers import REPLICATE_KEY
from sidecar.nats.cursors import CursorStore
from sidecar.nats.nats_port import NatsPort
from sidecar.runtime.clock import wall_clock_ms
from sidecar.runtime.positions import LocalSubscriptions

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("purged_at", "subscription"),
    [("CONSUMER.LIST.", "app"), ("STREAM.MSG.GET.", "app"), ("STREAM.MSG.GET.", "job")],
    ids=["durable-listed", "durable-scanned", "cursor-scanned"],
)
async def test_a_purge_during_a_read_lies_below_the_first_sequence_it_lists(
    nc: Client, monkeypatch: pytest.MonkeyPatch, purged_at: str, subscription: str
) -> None:
    vs = VirtualStream(f"o{uuid.uuid4().hex[:8]}", ("west",))
    read_stream = vs.read_stream("west")
    js = nc.jetstream()
    await js.add_stream(name=read_stream, subjects=[vs.data_filter(), vs.marker_filter()])
    for i in range(10):
        await js.publish(f"{vs.name}.west.item", str(i).encode(), stream=read_stream)
    bucket = f"cursors-{vs.name}"
    await js.create_key_value(bucket=bucket)
    store = CursorStore(await js.key_value(bucket))
    if subscription == "app":  # a durable that acked 1 to 3, 7 pending
        await js.add_consumer(
            read_stream,
            durable_name="app",
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=vs.data_filter(),
            metadata={REPLICATE_KEY: "true"},
        )
        pulled = await js.pull_subscribe_bind("app", read_stream)
        for msg in await pulled.fetch(3, timeout=2):
            await msg.ack_sync(timeout=2)
    else:  # an external cursor committed at 3
        await store.advance(vs.name, "job", 3)
    real_request = jsapi.request
    purged = False

    async def purge_during_the_read(
        conn: Client, op: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        nonlocal purged
        if op.startswith(purged_at) and not purged:
            purged = True
            await js.purge_stream(read_stream, seq=7)
        return await real_request(conn, op, payload, **kw)

    monkeypatch.setattr(jsapi, "request", purge_during_the_read)
    listing = await LocalSubscriptions(vs, "west", wall_clock_ms, lambda: 0).read(
        NatsPort(nc), store, 0
    )
    monkeypatch.undo()

    assert purged
    assert listing.positions == {subscription: 6}, listing
    assert listing.first_seq == 7, listing
