"""Positions are read when they may have moved, not every interval (real servers, two regions).

The signals (acks, consumer advisories, cursor writes) make a leader read a stream at the next
interval; an idle stream is read only by the sweep, every `snapshot.sweep_intervals`
intervals, which also catches what a missed signal would have started. Reads are counted
with the `rsub_position_reads_total` metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import READY_TIMEOUT_S, sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.naming import VirtualStream
from sidecar.nats import signals
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound
from tests.support.scenario_kit import snapshot_past_data

pytestmark = pytest.mark.integration

STREAM = "orders"
DURABLE = "app"
INTERVAL_MS = 200
NEVER = 100_000  # sweep_intervals: no sweep within a test
VS = VirtualStream(STREAM, ("west", "east"))


def config(cluster: LocalSuperCluster, region: str, sweep_intervals: int) -> Config:
    settings = sidecar_settings(cluster, region, streams=[STREAM], interval_ms=INTERVAL_MS)
    settings["snapshot"]["sweep_intervals"] = sweep_intervals
    return config_from_mapping(settings)


@contextlib.asynccontextmanager
async def sidecars(
    cluster: LocalSuperCluster, sweep_intervals: int
) -> AsyncIterator[dict[str, Runtime]]:
    runtimes = {r: Runtime(config(cluster, r, sweep_intervals)) for r in cluster.regions}
    try:
        for runtime in runtimes.values():
            await runtime.start()
        for runtime in runtimes.values():
            await runtime.wait_ready(READY_TIMEOUT_S)

        async def all_lead() -> bool:
            return all(r.is_leader for r in runtimes.values())

        await wait_until(all_lead, "a leader in every region")
        yield runtimes
    finally:
        for runtime in runtimes.values():
            await runtime.stop()


def reads(runtime: Runtime) -> float:
    value = runtime.metrics.registry.get_sample_value(
        "rsub_position_reads_total", {"stream": STREAM}
    )
    return value or 0.0


async def publish(js: JetStreamContext, payloads: Sequence[bytes]) -> None:
    for data in payloads:
        await js.publish(f"{STREAM}.west.item", data, stream=f"{STREAM}-write-west")


async def settled(runtime: Runtime) -> None:
    """Wait until `runtime` made no position read for five intervals in a row."""
    last, since = reads(runtime), time.monotonic()

    async def quiet() -> bool:
        nonlocal last, since
        now = reads(runtime)
        if now != last:
            last, since = now, time.monotonic()
        return time.monotonic() - since >= 5 * INTERVAL_MS / 1000

    await wait_until(quiet, "no position read for five intervals", poll_s=0.05)


async def consume_all(js: JetStreamContext, n: int) -> None:
    sub = await js.pull_subscribe_bind(DURABLE, stream=f"{STREAM}-read-west")
    got = 0

    async def fetched() -> bool:
        nonlocal got
        with contextlib.suppress(TimeoutError):
            for msg in await sub.fetch(n - got, timeout=1):
                await msg.ack_sync()
                got += 1
        return got >= n

    await wait_until(fetched, f"{n} messages consumed in west")
    await sub.unsubscribe()


async def east_caught_up(east: JetStreamContext) -> None:
    """Wait until east's durable is at or past the last data message of east's read stream."""

    async def caught_up() -> bool:
        read_stream = f"{STREAM}-read-east"
        try:
            info = await east.consumer_info(read_stream, DURABLE)
        except (NotFoundError, nats.errors.TimeoutError):
            return False
        last = (await east.get_last_msg(read_stream, f"{STREAM}.>")).seq or 0
        return info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= last

    await wait_until(caught_up, "east's durable moved past the data consumed in west")


async def west_durable(js: JetStreamContext) -> None:
    await js.add_consumer(
        f"{STREAM}-read-west",
        durable_name=DURABLE,
        filter_subject=f"{STREAM}.>",
        ack_policy=api.AckPolicy.EXPLICIT,
        metadata={"rsub.replicate": "true"},
    )


async def test_acks_on_an_idle_stream_move_the_durable_in_the_other_region(
    cluster2: LocalSuperCluster,
) -> None:
    async with sidecars(cluster2, NEVER) as runtimes:
        west = await nats.connect(cluster2.servers("west"))
        east = await nats.connect(cluster2.servers("east"))
        try:
            js, east_js = west.jetstream(), east.jetstream()
            await west_durable(js)
            for batch in range(2):
                await publish(js, [f"b{batch}m{i}".encode() for i in range(3)])
                # The stream idles (its snapshot done, nothing read any more): only the acks
                # (no sweep in this test) can tell the sidecar the durable moved.
                await settled(runtimes["west"])
                before = reads(runtimes["west"])
                await consume_all(js, 3)
                await east_caught_up(east_js)
                assert reads(runtimes["west"]) > before
        finally:
            await west.close()
            await east.close()


async def test_an_idle_stream_is_read_by_the_sweep_only(cluster2: LocalSuperCluster) -> None:
    sweep = 10
    async with sidecars(cluster2, sweep) as runtimes:
        west = await nats.connect(cluster2.servers("west"))
        try:
            await west_durable(west.jetstream())
            await publish(west.jetstream(), [b"a"])
            runtime = runtimes["west"]
            await settled(runtime)
            started, first = time.monotonic(), reads(runtime)

            async def three_sweeps() -> bool:
                return reads(runtime) >= first + 3

            await wait_until(three_sweeps, "three sweep reads of the idle stream")
            # Read at every interval, the stream would have been read about once per
            # INTERVAL_MS; the sweep reads it once per `sweep` intervals.
            intervals = (time.monotonic() - started) / (INTERVAL_MS / 1000)
            assert reads(runtime) - first <= intervals / 3
        finally:
            await west.close()


async def test_a_missed_ack_is_caught_by_the_sweep(
    cluster2: LocalSuperCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def deaf(*_: object) -> list[object]:
        return []  # every consumer signal is missed

    monkeypatch.setattr(signals, "follow_consumers", deaf)
    async with sidecars(cluster2, 10):
        west = await nats.connect(cluster2.servers("west"))
        east = await nats.connect(cluster2.servers("east"))
        try:
            js = west.jetstream()
            await west_durable(js)
            await publish(js, [b"a", b"b", b"c"])
            await consume_all(js, 3)
            await east_caught_up(east.jetstream())
        finally:
            await west.close()
            await east.close()


async def test_a_cursor_committed_through_a_follower_reaches_the_leader(
    cluster2: LocalSuperCluster,
) -> None:
    async with sidecars(cluster2, NEVER) as runtimes:
        west = await nats.connect(cluster2.servers("west"))
        follower = Runtime(config(cluster2, "west", NEVER))
        try:
            await publish(west.jetstream(), [b"a", b"b"])
            await settled(runtimes["west"])
            await follower.start()
            await follower.wait_ready(READY_TIMEOUT_S)
            assert not follower.is_leader
            last = (await west.jetstream().stream_info(f"{STREAM}-read-west")).state.last_seq
            await follower.commit_cursor(STREAM, "spark", last)

            async def in_east() -> bool:
                try:
                    view = await runtimes["east"].get_subscription(STREAM, "spark")
                except NotFound:
                    return False
                return view.mark_delete > 0

            # Only the leader sends updates, and it learns of the commit from the bucket.
            await wait_until(in_east, "the cursor committed in west's follower to reach east")
        finally:
            await follower.stop()
            await west.close()


async def test_a_durable_with_data_pending_is_not_moved_at_every_read(
    cluster2: LocalSuperCluster,
) -> None:
    """West's durable acked what it got, markers followed, then data it has not fetched yet
    (so it stands at its ack floor, below those markers). East's vector (west's own
    progress, echoed) covers the acked data, so the position it places reaches over the
    markers, up to the new data. Read at its bare ack floor, the durable stood below that
    position at every read: the machine asked to move it each time, and the move found
    nothing of it to skip (east's copy likewise). Another application acking on the same
    stream has the stream read at every interval meanwhile."""
    async with sidecars(cluster2, NEVER) as runtimes:
        conns = {r: await nats.connect(cluster2.servers(r)) for r in ("west", "east")}
        try:
            js = conns["west"].jetstream()
            await west_durable(js)
            await publish(js, [b"a", b"b", b"c"])
            await consume_all(js, 3)
            await east_caught_up(conns["east"].jetstream())

            async def echoed() -> bool:
                view = await runtimes["west"].get_subscription(STREAM, DURABLE)
                return bool(view.progress)

            await wait_until(echoed, "east's vector for the durable in west")
            await js.add_consumer(
                f"{STREAM}-read-west",
                durable_name="other",
                filter_subject=f"{STREAM}.>",
                ack_policy=api.AckPolicy.EXPLICIT,
            )
            # Pending for the durable: its ack floor stays below them; and what `other` acks.
            await publish(js, [f"m{i}".encode() for i in range(60)])
            for runtime in runtimes.values():
                await snapshot_past_data(conns[runtime.region], runtime, VS)
            # A move of the durable begins with its `CONSUMER.INFO` (a listing reads none).
            moves = {r: 0 for r in conns}

            def counter(region: str) -> Callable[[Msg], Awaitable[None]]:
                async def seen(_: Msg) -> None:
                    moves[region] += 1

                return seen

            watches = [
                await nc.subscribe(
                    f"$JS.API.CONSUMER.INFO.{STREAM}-read-{r}.{DURABLE}", cb=counter(r)
                )
                for r, nc in conns.items()
            ]
            # A move still under way when the watch began (an update late on a loaded
            # machine) is not what this counts: first no move for five intervals (never,
            # while every read asks for one), then none at all for twenty reads of west (as
            # many reads, not as much time: on a loaded machine an interval may pass unread).
            last, since = dict(moves), time.monotonic()

            async def quiet() -> bool:
                nonlocal last, since
                if moves != last:
                    last, since = dict(moves), time.monotonic()
                return time.monotonic() - since >= 5 * INTERVAL_MS / 1000

            other = await js.pull_subscribe_bind("other", stream=f"{STREAM}-read-west")

            async def acking() -> None:  # one ack per interval: a read of west per interval
                while True:
                    for msg in await other.fetch(1, timeout=5):
                        await msg.ack()
                    await asyncio.sleep(INTERVAL_MS / 1000)

            app = asyncio.create_task(acking())
            try:
                await wait_until(quiet, "no move of the durable for five intervals", poll_s=0.05)
                moves = {r: 0 for r in conns}
                reads_before = reads(runtimes["west"])

                async def read_twenty_times() -> bool:
                    return reads(runtimes["west"]) - reads_before >= 20

                await wait_until(read_twenty_times, "twenty reads of west", poll_s=0.05)
            finally:
                app.cancel()
                await asyncio.gather(app, return_exceptions=True)
            for watch in watches:
                await watch.unsubscribe()
            assert moves == {"west": 0, "east": 0}, moves
        finally:
            for nc in conns.values():
                await nc.close()
