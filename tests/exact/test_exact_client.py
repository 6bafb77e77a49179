"""The exact client (`sidecar.exact`) on a real read stream, its vector from a real gRPC server.

One nats-server holds the streams of `orders` for regions west and east (`apply_topology`):
the read stream `orders-read-west` (region b) sources both write streams, and also a stream
that is no write stream of `orders` (its messages have an unknown origin). Messages are
published one at a time, each sourced before the next, so the read order is the one below.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import DeliverPolicy, StreamConfig, StreamSource
from nats.js.client import JetStreamContext

from rsub_dev.sidecars import durable_config, wait_until
from rsub_dev.workload import busy_event_loop
from sidecar._gen.rsub.v1 import api_pb2
from sidecar.exact import ExactConsumer, progress_of
from sidecar.naming import SOURCE_HEADER, VirtualStream
from sidecar.nats.topology import apply_topology
from tests.support.api_fakes import StateServer
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

VS = VirtualStream("orders", ("west", "east"))
READ = VS.read_stream("west")
FOREIGN = "orders-legacy"
PROGRESS = {"west": 5, "east": 3}
# The read stream in order, as (origin, origin sequence); "?" is the foreign stream. With
# PROGRESS, the first four are covered and the foreign message is not: P_b = 4. Above it,
# covered messages interleave with uncovered ones, boundaries (e3, w5) included.
READ_ORDER = [
    ("west", 1), ("east", 1), ("west", 2), ("east", 2),  # covered: P_b = 4
    ("?", 1), ("east", 3), ("east", 4), ("west", 3),
    ("?", 2), ("west", 4), ("west", 5), ("west", 6),
]  # fmt: skip
P_B = 4
# What the exact consumer hands over (read-stream sequences), and how many it skipped then.
DELIVERED = [(5, 0), (7, 1), (9, 2), (12, 4)]


async def publish_in_read_order(js: JetStreamContext) -> None:
    for held, (origin, seq) in enumerate(READ_ORDER, start=1):
        subject = (
            f"orders.legacy.m{seq}" if origin == "?" else VS.publish_subject(origin, f"m{seq}")
        )
        ack = await js.publish(subject, f"{origin}-{seq}".encode())
        assert ack.seq == seq

        async def sourced(held: int = held) -> bool:
            return (await js.stream_info(READ)).state.messages >= held

        await wait_until(sourced, f"{READ} holds {held} messages", 10, poll_s=0.01)


async def test_exact_consumer_skips_exactly_the_covered_messages(tmp_path: Path) -> None:
    state = api_pb2.GetSubscriptionResponse(
        stream=VS.name, subscription="billing", kind="durable", mark_delete=P_B, progress=PROGRESS
    )
    sidecar = StateServer([state])
    async with LoneServer(tmp_path, {}) as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await apply_topology(nc, VS, cluster_for_region=lambda _: None)
            await js.add_stream(StreamConfig(name=FOREIGN, subjects=["orders.legacy.>"]))
            read = (await js.stream_info(READ)).config
            await js.update_stream(
                dataclasses.replace(read, sources=[*(read.sources or []), StreamSource(FOREIGN)])
            )
            await publish_in_read_order(js)
            stored = [await js.get_msg(READ, s) for s in range(1, len(READ_ORDER) + 1)]
            sources = [(m.headers or {})[SOURCE_HEADER].split(" ")[:2] for m in stored]
            assert [
                (VS.region_of_write_stream(name) or "?", int(seq)) for name, seq in sources
            ] == READ_ORDER

            progress = await progress_of(sidecar.address, VS.name, "billing")
            assert progress == PROGRESS
            durable = dataclasses.replace(
                durable_config(VS, "billing"),
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=P_B + 1,
                ack_wait=1.0,
            )
            await js.add_consumer(READ, durable)
            assert (await js.consumer_info(READ, "billing")).ack_floor.stream_seq == P_B
            exact = ExactConsumer(await js.pull_subscribe_bind("billing", READ), progress, VS)

            for sequence, skipped in DELIVERED:
                (msg,) = await exact.fetch(1, timeout=5)
                assert (msg.metadata.sequence.stream, exact.skipped) == (sequence, skipped)
                await msg.ack_sync()
                # The floor only moves over contiguous acks: the covered messages below were
                # acked by the exact consumer.
                info = await js.consumer_info(READ, "billing")
                assert info.ack_floor.stream_seq == sequence
            # Nothing more, and no covered message comes back after ack_wait.
            with pytest.raises(nats.errors.TimeoutError):
                await exact.fetch(4, timeout=1.5)
            assert exact.skipped == 4
            info = await js.consumer_info(READ, "billing")
            assert (info.ack_floor.stream_seq, info.num_ack_pending) == (len(READ_ORDER), 0)
        finally:
            await nc.close()
            sidecar.stop()


def from_bare(err: TimeoutError) -> bool:
    """Whether nats-py raised a bare timeout (not a `nats.errors.TimeoutError`): `err` itself,
    or its cause where `ExactConsumer.fetch` raised the documented error instead."""
    nats_py = err.__cause__ if isinstance(err.__cause__, TimeoutError) else err
    return not isinstance(nats_py, nats.errors.TimeoutError)


async def test_a_fetch_on_a_busy_event_loop_times_out_with_the_documented_error(
    tmp_path: Path,
) -> None:
    """nats-py's `fetch` of a batch raises a bare `asyncio.TimeoutError` when a pull's answer
    from the server is handled after the fetch's deadline (`_fetch_n`, nats-py 2.16): on a
    busy event loop, often. `ExactConsumer.fetch` raises `nats.errors.TimeoutError` in every
    case (the bare error as its cause), as docs/exact-client.md's loop expects."""
    async with LoneServer(tmp_path, {}) as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await apply_topology(nc, VS, cluster_for_region=lambda _: None)
            await js.add_consumer(READ, durable_config(VS, "billing"))
            exact = ExactConsumer(await js.pull_subscribe_bind("billing", READ), {}, VS)
            raised: list[TimeoutError] = []
            async with busy_event_loop(seed=3, longest_s=0.002):
                # Each fetch of the empty read stream times out; about half of nats-py's
                # timeouts are bare ones here. Fetch until a few of those were seen.
                for _ in range(400):
                    try:
                        await exact.fetch(2, timeout=0.02)
                    except TimeoutError as err:
                        raised.append(err)
                    if sum(map(from_bare, raised)) >= 5:
                        break
            assert [type(e) for e in raised if not isinstance(e, nats.errors.TimeoutError)] == []
            assert sum(map(from_bare, raised)) >= 5  # the bare error was really provoked
        finally:
            await nc.close()
