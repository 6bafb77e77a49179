"""Moves and creations that fail on a real server (issue 12, seeds 7, 18 and 524).

East's sidecar runs as the documented sidecar user lacking one permission, so the server
refuses its `CONSUMER.RESET` (a move) or its `CONSUMER.CREATE` of a durable (a creation): the
request goes unanswered and the action fails after its timeout, as in the campaign (a
consumer leader lost, a lease lost). Meanwhile the API must not report a position the
durable in east does not have (failover clients resume after it); once the permission is
back, the action is asked for again and carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import pytest
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, durable_config, read_stored, wait_until
from sidecar.naming import VirtualStream
from sidecar.runtime import Runtime
from sidecar.runtime.errors import NotFound
from tests.support.nats_users import (
    ADMIN,
    STREAM,
    connect_as,
    restrict,
    restricted_sidecars,
    sidecar_user,
)
from tests.support.scenario_kit import DEADLINE_S, consume, last_seq, publish

pytestmark = pytest.mark.integration

DURABLE = "app"
RESET = "$JS.API.CONSUMER.RESET.orders-read-east.*"
CREATE = "$JS.API.CONSUMER.CREATE.orders-read-east.>"
# Each refused request waits out the sidecar's request timeout (5 s) before it fails.
FAILURES_S = 60.0


class Failures:
    """`action_failed` events of east's sidecar for the durable, as logged."""

    def __init__(self, events: list[MutableMapping[str, Any]], action: str) -> None:
        self._events = events
        self._action = f"{action}(subscription='{DURABLE}'"

    def count(self) -> int:
        return sum(
            1
            for e in self._events
            if e.get("event") == "action_failed" and self._action in str(e.get("action"))
        )

    async def wait(self, n: int) -> None:
        async def enough() -> bool:
            return self.count() >= n

        await wait_until(enough, f"{n} failed {self._action})", FAILURES_S)


@contextlib.asynccontextmanager
async def east_lacking(
    cluster: LocalSuperCluster, permission: str
) -> AsyncIterator[tuple[RegionSidecars, JetStreamContext, Client]]:
    """Both sidecars as their documented users, east's without `permission`; the test's
    clients as the admin."""
    lacking = [sidecar_user("west"), sidecar_user("east").without(permission)]
    async with (
        restricted_sidecars(cluster, lacking) as sidecars,
        connect_as(cluster, "west", *ADMIN) as west,
        connect_as(cluster, "east", *ADMIN) as east,
    ):
        await sidecars.wait_leaders()
        yield sidecars, west.jetstream(), east


async def standing(nc: Client, vs: VirtualStream) -> int | None:
    """Where the durable stands in east (None: absent): its ack floor, or with nothing
    pending the read stream's end, read after (at least what the sidecar can have read)."""
    js = nc.jetstream()
    try:
        info = await js.consumer_info(vs.read_stream("east"), DURABLE)
    except NotFoundError:
        return None
    if info.num_pending == 0 and info.num_ack_pending == 0:
        return await last_seq(js, vs.read_stream("east"))
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0


async def ack_floor(nc: Client, vs: VirtualStream) -> int:
    """The durable's ack floor in east: only a reset moves it while nobody consumes there
    (its `standing` also moves when data lands after markers it stood on)."""
    info = await nc.jetstream().consumer_info(vs.read_stream("east"), DURABLE)
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0


async def reported(runtime: Runtime) -> int | None:
    """East's `GetSubscription` answer (None: unknown there)."""
    try:
        return (await runtime.get_subscription(STREAM, DURABLE)).mark_delete
    except NotFound:
        return None


async def watch(
    runtime: Runtime, nc: Client, vs: VirtualStream, until: Callable[[], Awaitable[None]]
) -> int:
    """Compare what east's sidecar reports with where the durable stands, every 20 ms until
    `until` returns; returns how many answers were compared. The durable is left alone
    meanwhile (its actions fail), so an answer read right after it is bounded by it, or
    past it only over messages it never delivers: a durable with nothing pending stands at
    the stream's end, markers, and data sourced later lands after them."""
    done = asyncio.ensure_future(until())
    compared = 0
    try:
        while not done.done():
            answer = await reported(runtime)
            there = await standing(nc, vs)
            if answer is not None:
                assert there is not None, f"east reports {DURABLE} at {answer}, absent there"
                if answer > there:
                    data = await read_stored(nc, vs.read_stream("east"), vs.data_filter())
                    passed = [m.seq for m in data if there < m.seq <= answer]
                    assert not passed, (
                        f"east reports {DURABLE} at {answer}, it stands at {there}, "
                        f"before data at {passed}"
                    )
            compared += 1
            await asyncio.sleep(0.02)
        await done
    finally:
        done.cancel()
    return compared


async def test_a_failed_move_is_not_reported_and_is_retried(cluster2: LocalSuperCluster) -> None:
    vs = VirtualStream(STREAM, tuple(cluster2.regions))
    async with east_lacking(cluster2, RESET) as (sidecars, west, east):
        await west.add_consumer(vs.read_stream("west"), durable_config(vs, DURABLE))
        await publish(west, vs, "west", [b"m0", b"m1", b"m2"])
        await consume(west, vs, "west", DURABLE, 3)

        async def created() -> bool:
            return await standing(east, vs) is not None

        await wait_until(created, "the durable created in east", DEADLINE_S)
        created_at = await ack_floor(east, vs)
        with structlog.testing.capture_logs() as events:
            await publish(west, vs, "west", [b"m3", b"m4", b"m5"])
            await consume(west, vs, "west", DURABLE, 3)
            failures = Failures(events, "MoveConsumer")
            # A move in flight, then asked for again: never reported meanwhile.
            assert await watch(sidecars["east"], east, vs, lambda: failures.wait(2)) > 0
        assert await ack_floor(east, vs) == created_at  # never reset meanwhile

        await restrict(cluster2, [sidecar_user("west"), sidecar_user("east")])
        [*_, last] = await read_stored(east, vs.read_stream("east"), vs.data_filter())

        async def moved() -> bool:
            there = await standing(east, vs)
            answer = await reported(sidecars["east"])
            return there is not None and answer is not None and min(there, answer) >= last.seq

        await wait_until(moved, "the move asked for again and reported", DEADLINE_S)


async def test_a_failed_creation_is_asked_for_again_until_the_durable_exists(
    cluster2: LocalSuperCluster,
) -> None:
    vs = VirtualStream(STREAM, tuple(cluster2.regions))
    async with east_lacking(cluster2, CREATE) as (sidecars, west, east):
        with structlog.testing.capture_logs() as events:
            await west.add_consumer(vs.read_stream("west"), durable_config(vs, DURABLE))
            await publish(west, vs, "west", [b"m0", b"m1", b"m2"])
            await consume(west, vs, "west", DURABLE, 3)
            failures = Failures(events, "CreateConsumer")
            # Nothing is consumed any more, so no new update comes to ask for the creation
            # again (seed 18): the sidecar has to, and never report the durable meanwhile.
            assert await watch(sidecars["east"], east, vs, lambda: failures.wait(2)) > 0
        assert await standing(east, vs) is None

        await restrict(cluster2, [sidecar_user("west"), sidecar_user("east")])
        [*_, last] = await read_stored(east, vs.read_stream("east"), vs.data_filter())

        async def created() -> bool:
            return await standing(east, vs) is not None

        await wait_until(created, "the creation asked for again", DEADLINE_S)
        # Created where the update applied meanwhile asked for: after what west consumed.
        there = await standing(east, vs)
        assert there is not None and there >= last.seq
