"""The pool of shared super-clusters (tests/support/cluster_pool.py): a cluster is lent again
only as it was lent, every stream deleted."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from rsub_dev.cluster import LocalSuperCluster
from tests.support.cluster_pool import ClusterPool

pytestmark = pytest.mark.integration

REGIONS = ("west", "east")


async def _stream_names(cluster: LocalSuperCluster) -> list[str]:
    client = await nats.connect(cluster.servers("east"))
    try:
        return [info.config.name or "" for info in await client.jetstream().streams_info()]
    finally:
        await client.close()


async def test_a_cluster_comes_back_clean_or_not_at_all(tmp_path: Path) -> None:
    pool = ClusterPool(tmp_path)
    try:
        async with pool.lend(REGIONS) as first:
            client = await nats.connect(first.servers("west"))
            await client.jetstream().add_stream(name="left-behind", subjects=["left.>"])
            await client.close()
        async with pool.lend(REGIONS) as second:
            assert second is first
            assert await _stream_names(second) == []
            await second.stop_server("east", 0)
        async with pool.lend(REGIONS) as third:
            assert third is not first  # a server stopped: not lent again
            conf = sorted(third.directory.glob("*.conf"))[0]
            conf.write_text(conf.read_text() + "\n")
        async with pool.lend(REGIONS) as fourth:
            assert fourth is not third  # a configuration changed: not lent again
        assert (pool.started, pool.reused) == (3, 1)
    finally:
        await pool.close()
