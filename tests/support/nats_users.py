"""A `LocalSuperCluster` whose servers require users: the documented permission blocks
(`permission_blocks`) given to every server by a configuration reload, plus an unrestricted
admin for the test's own clients.

Shared by the security tests (least privilege) and the scenario tests that take one
permission away from a sidecar to make its actions fail on a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator

import nats
import nats.errors
from nats.aio.client import Client

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars
from tests.support.permission_blocks import SIDECAR_BLOCK, UserBlock, parse_user

ADMIN = ("admin", "admin-pw")
STREAM = "orders"  # the documented permission blocks name it


def password_of(user: str) -> str:
    return f"pw-{user}"


def credentials(user: UserBlock) -> tuple[str, str]:
    return user.user, password_of(user.user)


def sidecar_user(region: str) -> UserBlock:
    """The documented sidecar user of `region` (the `orders` stream)."""
    return parse_user(SIDECAR_BLOCK).for_region(region)


async def restrict(cluster: LocalSuperCluster, users: list[UserBlock]) -> None:
    """Give every server the users (plus an unrestricted admin) and reload them. Called
    again with other users, it replaces them (a reload applies to connected clients too)."""
    authorization = {
        "users": [
            {"user": ADMIN[0], "password": ADMIN[1]},
            *(u.server_user(password_of(u.user)) for u in users),
        ]
    }
    for path in sorted(cluster.directory.glob("*.conf")):
        config = json.loads(path.read_text())
        config["authorization"] = authorization
        path.write_text(json.dumps(config, indent=2) + "\n")
    for pid in cluster.pids():
        os.kill(pid, signal.SIGHUP)
    for region in cluster.regions:
        await _wait_auth_required(cluster.servers(region))


@contextlib.asynccontextmanager
async def restricted_sidecars(
    cluster: LocalSuperCluster, users: list[UserBlock]
) -> AsyncIterator[RegionSidecars]:
    """`restrict` to `users`, then run a sidecar of `STREAM` per region (not serving) as its
    documented sidecar user, with whatever permissions `users` gives that user."""
    await restrict(cluster, users)
    logins = {r: credentials(sidecar_user(r)) for r in cluster.regions}
    async with RegionSidecars(
        cluster, streams=[STREAM], serve=False, credentials=logins
    ) as sidecars:
        yield sidecars


async def _wait_auth_required(servers: list[str]) -> None:
    for _ in range(100):
        try:
            nc = await nats.connect(
                servers, allow_reconnect=False, connect_timeout=1, error_cb=_quiet
            )
        except (nats.errors.Error, OSError, TimeoutError):
            return
        await nc.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{servers}: the reload did not turn authorization on")


async def _quiet(error: Exception) -> None:
    """An expected refusal: not worth nats-py's default traceback."""


@contextlib.asynccontextmanager
async def connect_as(
    cluster: LocalSuperCluster, region: str, user: str, password: str
) -> AsyncIterator[Client]:
    nc = await nats.connect(cluster.servers(region), user=user, password=password)
    try:
        yield nc
    finally:
        await nc.close()
