"""Sidecars configured with custom stream-name patterns, on a real local super-cluster.

The patterns in `streams[]` are the only place the names come from: the sidecars lay the
streams out under them, read markers through them and create the replicated durable in the
other region's custom read stream.
"""

from __future__ import annotations

import contextlib

import nats
import pytest
from nats.js import api
from nats.js.errors import NotFoundError, ServiceUnavailableError

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import RegionSidecars, sidecar_settings, wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import Config
from sidecar.naming import VirtualStream

pytestmark = pytest.mark.integration

VS = VirtualStream(
    "orders",
    ("west", "east"),
    write_pattern="in_{region}_{name}",
    read_pattern="{name}_at_{region}",
)
DURABLE = "app"


class PatternSidecars(RegionSidecars):
    """`RegionSidecars` whose one virtual stream uses the patterns of `VS`."""

    def config(self, region: str) -> Config:
        settings = sidecar_settings(self.cluster, region, interval_ms=self.interval_ms)
        settings["streams"] = [
            {"name": VS.name, "write_stream": VS.write_pattern, "read_stream": VS.read_pattern}
        ]
        return config_from_mapping(settings)


async def test_a_durable_is_replicated_between_custom_named_streams(
    cluster2: LocalSuperCluster,
) -> None:
    async with PatternSidecars(cluster2, serve=False) as sidecars:
        assert sidecars["west"].config.virtual_stream(VS.name) == VS
        west = await nats.connect(cluster2.servers("west"))
        east = await nats.connect(cluster2.servers("east"))
        try:
            names = {str(info.config.name) for info in await west.jsm().streams_info()}
            assert {"in_west_orders", "in_east_orders", "orders_at_west", "orders_at_east"} <= names

            js_west, js_east = west.jetstream(), east.jetstream()

            async def created_in_west() -> bool:
                with contextlib.suppress(ServiceUnavailableError, nats.errors.TimeoutError):
                    await js_west.add_consumer(
                        VS.read_stream("west"),
                        durable_name=DURABLE,
                        filter_subject=VS.data_filter(),
                        ack_policy=api.AckPolicy.EXPLICIT,
                        metadata={"rsub.replicate": "true"},
                    )
                    return True
                return False

            await wait_until(created_in_west, "the durable in west")
            sub = await js_west.pull_subscribe_bind(DURABLE, stream=VS.read_stream("west"))
            for i in range(3):
                await js_west.publish(VS.publish_subject("west", "item"), f"m{i}".encode())
            got: list[bytes] = []

            async def consumed() -> bool:
                with contextlib.suppress(TimeoutError):  # nats-py raises its own or asyncio's
                    for msg in await sub.fetch(3 - len(got), timeout=1):
                        await msg.ack_sync()
                        got.append(msg.data)
                return len(got) == 3

            await wait_until(consumed, "3 messages in west")

            # West's sidecar snapshots through the custom names and sends the update; east's
            # creates the durable in its own custom-named read stream.
            async def created_in_east() -> bool:
                try:
                    await js_east.consumer_info(VS.read_stream("east"), DURABLE)
                except (NotFoundError, nats.errors.TimeoutError):
                    return False
                return True

            await wait_until(created_in_east, "the durable in east's custom read stream")
            info = await js_east.consumer_info(VS.read_stream("east"), DURABLE)
            assert info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE
            assert info.config.metadata is not None
            assert info.config.metadata["rsub.replicate"] == "true"
        finally:
            await west.close()
            await east.close()
