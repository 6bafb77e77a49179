"""The port's stream operations of the bring-up and discovery (`stream_names`,
`stream_create`, `stream_update`, `stream_info`) over a real nats-server (`NatsPort`) and
over the simulated JetStream (`SimPort`): the same scenario, the same outcomes.

Where they could disagree: a listing filtered by a subject (overlap, wildcards), creating
a stream again with the same or another configuration, subjects that overlap another
stream's (on create and update), an update or info of a missing stream, and what an
update changes. Compared: the names, the error codes, and of a stream its name, subjects,
per-subject limit and message count (simjs models no other field: docs/simulation.md)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import APIError

from rsub_dev.sim.port import LoopClock, SimNet, SimPort
from rsub_dev.simjs import SimJetStream
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.port import JetStreamPort
from tests.support.nats_servers import LoneServer

pytestmark = pytest.mark.integration

T = 5.0
NS = 1_000_000_000
ORDERS: dict[str, Any] = {
    "name": "orders",
    "subjects": ["orders.>"],
    "max_msgs_per_subject": 3,
    "duplicate_window": 60 * NS,
}


def _seen(value: object) -> object:
    if isinstance(value, dict) and "config" in value:
        config = value["config"]
        return (
            config["name"],
            sorted(config["subjects"]),
            config.get("max_msgs_per_subject"),
            value["state"]["messages"],
        )
    if isinstance(value, list):
        return sorted(str(v) for v in value)
    return value


async def streams(port: JetStreamPort) -> list[tuple[str, object]]:
    steps: list[tuple[str, object]] = []

    async def step(label: str, call: Awaitable[object]) -> None:
        try:
            value = await call
        except APIError as err:
            steps.append((label, ("error", err.err_code)))
        else:
            steps.append((label, _seen(value)))

    await step("no streams", port.stream_names(timeout_s=T))
    await step("info, missing", port.stream_info("orders", timeout_s=T))
    await step("create", port.stream_create(ORDERS, timeout_s=T))
    await step("create again, the same", port.stream_create(ORDERS, timeout_s=T))
    other_subjects = {**ORDERS, "subjects": ["orders.>", "more.>"]}
    await step("create again, another", port.stream_create(other_subjects, timeout_s=T))
    overlapping = {"name": "east", "subjects": ["orders.east.>"]}
    await step("create, overlapping", port.stream_create(overlapping, timeout_s=T))
    kv = {"name": "KV_b", "subjects": ["$KV.b.>"], "max_msgs_per_subject": 1}
    await step("create another", port.stream_create(kv, timeout_s=T))
    await step("names", port.stream_names(timeout_s=T))
    await step("names, by subject", port.stream_names(subject="orders.east.1", timeout_s=T))
    await step("names, by wildcard", port.stream_names(subject="$KV.b.*", timeout_s=T))
    await step("names, by a wider one", port.stream_names(subject=">", timeout_s=T))
    await step("names, none matches", port.stream_names(subject="nothing.here", timeout_s=T))
    await step("update", port.stream_update(other_subjects, timeout_s=T))
    await step("info after the update", port.stream_info("orders", timeout_s=T))
    await step("names after the update", port.stream_names(subject="more.x", timeout_s=T))
    clash = {**kv, "subjects": ["$KV.b.>", "more.x"]}
    await step("update, overlapping", port.stream_update(clash, timeout_s=T))
    missing = {"name": "missing", "subjects": ["missing.>"]}
    await step("update, missing", port.stream_update(missing, timeout_s=T))
    return steps


async def test_the_simulated_port_lists_creates_and_updates_streams_as_a_server_does(
    tmp_path: Path,
) -> None:
    async with LoneServer(tmp_path, {}) as server:
        nc = await nats.connect(server.url)
        try:
            real = await streams(NatsPort(nc))
        finally:
            await nc.close()
    js = SimJetStream(LoopClock(asyncio.get_running_loop()))
    simulated = await streams(SimPort(SimNet(js, random.Random(0), max_delay_ms=0)))
    assert simulated == real
    # The scenario says something: errors and listings both came up.
    outcomes = dict(real)
    assert outcomes["create again, another"] == ("error", 10058)
    assert outcomes["update, missing"] == ("error", 10059)
    assert outcomes["names, by subject"] == ["orders"]
