"""Least privilege with stream discovery: the sidecars run with exactly the discovery block of
docs/security.md (read from the page), find a virtual stream laid out while they run and
replicate a durable on it, and the servers log no permission violation."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from nats.js import api
from nats.js.errors import NotFoundError

from rsub_dev.cluster import LocalSuperCluster, find_nats_server
from rsub_dev.ports import HOST, free_ports
from rsub_dev.sidecars import RegionSidecars, sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.naming import VirtualStream
from sidecar.nats.topology import apply_topology
from tests.security.test_security_permissions import consume, violations
from tests.support.nats_users import ADMIN, connect_as, credentials, restrict
from tests.support.permission_blocks import (
    SIDECAR_DISCOVERY_BLOCK,
    UserBlock,
    block_text,
    parse_user,
)

pytestmark = pytest.mark.integration

DURABLE = "app"


def discovery_user(region: str) -> UserBlock:
    return parse_user(SIDECAR_DISCOVERY_BLOCK).for_region(region)


def test_the_discovery_block_is_valid_server_configuration(tmp_path: Path) -> None:
    conf = tmp_path / "check.conf"
    conf.write_text(f"listen: {HOST}:{free_ports(1)[0]}\n" + block_text(SIDECAR_DISCOVERY_BLOCK))
    result = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(conf)],
        env={**os.environ, "RSUB_WEST_NATS_PASSWORD": "x"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_discovery_block_keeps_markers_to_its_region() -> None:
    user = discovery_user("west")
    markers = [s for s in user.publish_allow if s.startswith("_rsub")]
    assert markers == ["_rsub.*.marker.west", "_rsub.*.snapshot.west"]
    # Nothing that creates, changes or purges a stream but the sidecar's own lease bucket.
    writes = [s for s in user.publish_allow if ".STREAM." in s and "INFO" not in s]
    assert set(writes) == {
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.MSG.GET.*",
        "$JS.API.STREAM.CREATE.KV_rsub-leases-west",
        "$JS.API.STREAM.UPDATE.KV_rsub-leases-west",
        "$JS.API.STREAM.PURGE.KV_rsub-leases-west",
    }


class RestrictedDiscoverySidecars(RegionSidecars):
    def config(self, region: str) -> Config:
        settings = sidecar_settings(
            self.cluster,
            region,
            streams=(),
            interval_ms=self.interval_ms,
            credentials=self.credentials.get(region),
        )
        settings["discovery"] = {"enabled": True, "match": ["orders"], "interval_s": 0.5}
        return config_from_mapping(settings)


async def test_restricted_discovering_sidecars_replicate_a_durable(
    cluster2: LocalSuperCluster,
) -> None:
    users = {r: discovery_user(r) for r in cluster2.regions}
    await restrict(cluster2, list(users.values()))
    orders = VirtualStream("orders", tuple(cluster2.regions))
    async with (
        RestrictedDiscoverySidecars(
            cluster2,
            streams=(),
            serve=False,
            credentials={r: credentials(u) for r, u in users.items()},
        ) as sidecars,
        connect_as(cluster2, "west", *ADMIN) as admin_west,
        connect_as(cluster2, "east", *ADMIN) as admin_east,
    ):
        # The operator lays the stream out (as admin) while the sidecars run.
        await apply_topology(admin_west, orders)

        async def found() -> bool:
            return all(sidecars[r].leadership("orders").leader for r in cluster2.regions) and all(
                [(await sidecars[r].status()).streams for r in cluster2.regions]
            )

        await wait_until(found, "both sidecars to run the discovered stream")
        west, east = admin_west.jetstream(), admin_east.jetstream()
        await west.add_consumer(
            orders.read_stream("west"),
            durable_name=DURABLE,
            filter_subject=orders.data_filter(),
            ack_policy=api.AckPolicy.EXPLICIT,
            metadata={"rsub.replicate": "true"},
        )
        for i in range(3):
            await west.publish("orders.west.item", f"m{i}".encode(), stream="orders-write-west")
        assert len(await consume(west, orders.read_stream("west"), 3)) == 3

        async def moved_in_east() -> bool:
            with contextlib.suppress(NotFoundError):
                info = await east.consumer_info(orders.read_stream("east"), DURABLE)
                return info.ack_floor is not None and info.ack_floor.stream_seq > 0
            return False

        await wait_until(moved_in_east, "the durable to be created and moved in east")
        # An external cursor on the discovered stream (its check reads the read stream).
        assert await sidecars["west"].commit_cursor("orders", "spark", 2) == 2
        view = await sidecars["west"].set_replicated("orders", DURABLE, True)
        assert view.replicated
    assert violations(cluster2) == []
