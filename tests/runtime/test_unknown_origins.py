"""The runtime's count of data of unknown origin (`rsub_data_unknown_origin_total`) and its
one log line, over a read stream that also sources a stream of no region and takes messages
published to it directly (the layout of `tests.support.origin_layout`; how the origin log
reads them: tests/nats/test_origin_log.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import structlog
from nats.aio.client import Client

from rsub_dev.sidecars import wait_until
from sidecar.config.loading import config_from_mapping
from sidecar.naming import VirtualStream
from sidecar.runtime import Runtime
from tests.support.nats_servers import LoneServer
from tests.support.origin_layout import fill, lay_out, write

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def sidecar(server: LoneServer, vs: VirtualStream) -> AsyncIterator[Runtime]:
    config = config_from_mapping(
        {
            "region": "west",
            "regions": list(vs.regions),
            "nats": {"servers": [server.url]},
            "streams": [{"name": vs.name}],
            "snapshot": {"interval_ms": 100},
            "lease": {"ttl_s": 3},
            "grpc": {"listen": "127.0.0.1:0"},
            "http": {"listen": "127.0.0.1:0"},
        }
    )
    runtime = Runtime(config, apply_topology=False)
    try:
        await runtime.start()
        await runtime.wait_ready(30)
        yield runtime
    finally:
        await runtime.stop()


def sample(runtime: Runtime, name: str, stream: str) -> float:
    value = runtime.metrics.registry.get_sample_value(name, {"stream": stream})
    return value if value is not None else 0.0


async def test_the_sidecar_counts_unknown_origins_and_logs_the_first_only(
    js_server: LoneServer, nc: Client
) -> None:
    js = nc.jetstream()
    vs = await lay_out(js)
    await fill(js, vs)
    with structlog.testing.capture_logs() as events:
        async with sidecar(js_server, vs) as runtime:
            # Replayed at the rebuild: north's and the local message.
            assert sample(runtime, "rsub_data_unknown_origin_total", vs.name) == 2
            await write(js, vs, "local", 2)
            await write(js, vs, "west", 1)

            async def tailed() -> bool:
                return sample(runtime, "rsub_data_unknown_origin_total", vs.name) == 4

            await wait_until(tailed, "the tailed unknown origins to be counted", 20)

            async def indexed() -> bool:
                # Origins west, east and unknown (north, local): at least one run each.
                return sample(runtime, "rsub_origin_index_bytes", vs.name) >= 3 * 24

            await wait_until(indexed, "the origin index to be reported", 20)
    logged = [e for e in events if e["event"] == "data_unknown_origin"]
    assert len(logged) == 1 and logged[0]["stream"] == vs.name
