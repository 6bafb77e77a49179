"""Least privilege: the sidecar runs with exactly the permissions docs/security.md documents.

The permission blocks are read from the page (`permission_blocks`), so the page and the
test cannot drift apart. On a real two-region super-cluster whose servers get those users
(written into the servers' configuration and reloaded), both sidecars run as their
restricted users, the application runs as the documented application user, and a
replicated durable consumed in west is created in east and later moved forward there.
No permission violation may appear. A sidecar lacking one documented permission does not
become ready and logs which subject it was refused.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from rsub_dev.cluster import LocalSuperCluster, find_nats_server
from rsub_dev.ports import HOST, free_ports
from rsub_dev.sidecars import sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology
from sidecar.runtime import Runtime
from tests.support.nats_users import (
    ADMIN,
    STREAM,
    connect_as,
    credentials,
    restrict,
    restricted_sidecars,
    sidecar_user,
)
from tests.support.permission_blocks import (
    APP_BLOCK,
    SIDECAR_BLOCK,
    UserBlock,
    block_text,
    parse_user,
)

pytestmark = pytest.mark.integration

DURABLE = "app"
# The client is told `Permissions Violation for Publish to "<subject>"`; the server logs
# `Publish Violation - Subject "<subject>"` (or `Subscription Violation - ...`).
CLIENT_VIOLATION = "Permissions Violation"
SERVER_VIOLATION = " Violation - "


def app_user(region: str) -> UserBlock:
    return parse_user(APP_BLOCK).for_region(region)


# ---- the documented blocks are valid nats-server configuration ---------------------------


def test_documented_blocks_are_valid_server_configuration(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    conf = tmp_path / "check.conf"
    conf.write_text(
        f"listen: {HOST}:{port}\n"
        + block_text(SIDECAR_BLOCK).replace(
            "users = [", "users = [\n" + block_text(APP_BLOCK) + "\n", 1
        )
    )
    env = {
        **os.environ,
        "RSUB_WEST_NATS_PASSWORD": "x",
        "ORDERS_APP_WEST_PASSWORD": "y",
    }
    result = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_blocks_grant_markers_and_lease_only_to_the_sidecar() -> None:
    sidecar, app = sidecar_user("west"), app_user("west")
    assert "_rsub.orders.marker.west" in sidecar.publish_allow
    assert not [s for s in sidecar.publish_allow if "east" in s and "STREAM" not in s]
    assert not [s for s in app.publish_allow if s.startswith(("_rsub", "$KV"))]
    assert {"_rsub.>", "$KV.rsub-leases-west.>"} <= set(app.publish_deny)


# ---- a super-cluster with users ------------------------------------------------------------


def violations(cluster: LocalSuperCluster) -> list[str]:
    return [
        line
        for path in sorted(cluster.directory.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if SERVER_VIOLATION in line
    ]


async def consume(js: JetStreamContext, stream: str, n: int) -> list[bytes]:
    sub = await js.pull_subscribe_bind(DURABLE, stream=stream)
    got: list[bytes] = []
    while len(got) < n:
        with contextlib.suppress(TimeoutError):  # nats-py raises its own or asyncio's
            for msg in await sub.fetch(n - len(got), timeout=2):
                await msg.ack_sync()
                got.append(msg.data)
    await sub.unsubscribe()
    return got


async def publish(js: JetStreamContext, payloads: list[bytes]) -> None:
    for data in payloads:
        await js.publish(f"{STREAM}.west.item", data, stream=f"{STREAM}-write-west")


# ---- the scenario ------------------------------------------------------------------------


async def test_restricted_sidecars_replicate_a_durable(cluster2: LocalSuperCluster) -> None:
    west_app, east_app = app_user("west"), app_user("east")
    users = [sidecar_user("west"), sidecar_user("east"), west_app, east_app]
    async with (
        restricted_sidecars(cluster2, users) as sidecars,
        connect_as(cluster2, "west", *credentials(west_app)) as west_nc,
        connect_as(cluster2, "east", *credentials(east_app)) as east_nc,
        connect_as(cluster2, "east", *ADMIN) as admin_east,
    ):
        west, east, admin = west_nc.jetstream(), east_nc.jetstream(), admin_east.jetstream()
        read_west, read_east = f"{STREAM}-read-west", f"{STREAM}-read-east"
        await west.add_consumer(
            read_west,
            durable_name=DURABLE,
            filter_subject=f"{STREAM}.>",
            ack_policy=api.AckPolicy.EXPLICIT,
            metadata={"rsub.replicate": "true"},
        )
        batch = [f"m{i}".encode() for i in range(6)]
        await publish(west, batch[:3])
        assert await consume(west, read_west, 3) == batch[:3]

        async def created_in_east() -> bool:
            with contextlib.suppress(NotFoundError):
                await admin.consumer_info(read_east, DURABLE)
                return True
            return False

        await wait_until(created_in_east, "the durable to be created in east")
        created_floor = (await admin.consumer_info(read_east, DURABLE)).ack_floor
        assert created_floor is not None

        await publish(west, batch[3:])
        assert await consume(west, read_west, 3) == batch[3:]
        last_data = await admin.get_last_msg(read_east, f"{STREAM}.item")

        async def moved_past_the_batch() -> bool:
            info = await admin.consumer_info(read_east, DURABLE)
            return info.ack_floor is not None and info.ack_floor.stream_seq >= last_data.seq

        await wait_until(moved_past_the_batch, "the durable to move forward in east")
        moved = (await admin.consumer_info(read_east, DURABLE)).ack_floor
        assert moved is not None and moved.stream_seq > created_floor.stream_seq

        # The application continues in east as its own restricted user: nothing old.
        await publish(west, [b"after-failover"])
        assert await consume(east, read_east, 1) == [b"after-failover"]

        # The application cannot forge a marker (it would move durables everywhere).
        with pytest.raises(nats.errors.TimeoutError):
            await west.publish(f"_rsub.{STREAM}.marker.west", b"forged", timeout=1)

        # Restart west: the replay of stored markers and the cleanup run as the user too.
        await sidecars.stop("west")
        await sidecars.start("west")
        await sidecars.wait_leaders()
        # External cursors live in the lease bucket; SetReplicated updates a consumer.
        assert await sidecars["west"].commit_cursor(STREAM, "spark", 2) == 2
        view = await sidecars["west"].set_replicated(STREAM, DURABLE, True)
        assert view.replicated
    # The only refusal is the forged marker: the sidecars never hit a missing permission.
    refused = violations(cluster2)
    forged = f'"$G/user:{west_app.user}" - Publish Violation - Subject "_rsub.{STREAM}.marker.west"'
    assert refused and all(forged in line for line in refused), refused


@pytest.mark.parametrize(
    "missing",
    [
        "$JS.API.STREAM.INFO.orders-write-west",  # the first call of the topology step
        "$JS.API.STREAM.CREATE.KV_rsub-leases-west",  # the lease bucket
        "$JS.API.DIRECT.GET.orders-read-west",  # the replay of what the read stream holds
    ],
)
async def test_a_missing_permission_is_named_at_start(
    cluster2: LocalSuperCluster, missing: str
) -> None:
    cluster = cluster2
    lacking = sidecar_user("west").without(missing)
    await restrict(cluster, [lacking])
    # Something stored in west's read stream, for the replay to read.
    async with connect_as(cluster, "west", *ADMIN) as admin:
        js = admin.jetstream()
        await apply_topology(admin, VirtualStream(STREAM, tuple(cluster.regions)))
        await publish(js, [b"stored"])

        async def sourced() -> bool:
            return (await js.stream_info(f"{STREAM}-read-west")).state.messages > 0

        await wait_until(sourced, "the message in west's read stream")
    settings = sidecar_settings(cluster, "west", streams=[STREAM], credentials=credentials(lacking))
    sidecar = Runtime(config_from_mapping(settings))
    with structlog.testing.capture_logs() as events:
        await sidecar.start()
        try:
            with pytest.raises(TimeoutError):
                await sidecar.wait_ready(5)
        finally:
            await sidecar.stop()
    assert not sidecar.readiness.ready
    refused = f'{CLIENT_VIOLATION} for Publish to "{missing}"'
    # nats-py lower-cases the server's error text, subject included.
    named = [e for e in events if refused.lower() in str(e.get("error")).lower()]
    assert named, _warnings(events)
    assert named[0]["log_level"] == "warning"
    assert any(f'Publish Violation - Subject "{missing}"' in line for line in violations(cluster))


def _warnings(events: list[MutableMapping[str, Any]]) -> list[str]:
    return [str(e) for e in events if e["log_level"] in ("warning", "error")][:10]
