"""What a stream's rebuild asks the servers: its read stream's state once (one `STREAM.INFO`
for the replays of its markers and data origins and for its positions read), on a real
server, where the requests are heard as any subscriber of the API subjects hears them."""

from __future__ import annotations

import nats
import pytest
from nats.aio.msg import Msg

from rsub_dev.cluster import LocalSuperCluster
from rsub_dev.sidecars import durable_config
from sidecar.config.nats import NatsConfig
from sidecar.metrics import SidecarMetrics
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection
from sidecar.nats.cursors import CursorStore
from sidecar.nats.nats_port import NatsPort
from sidecar.nats.regional_kv import open_regional_kv
from sidecar.nats.topology import apply_topology
from sidecar.protocol import MachineConfig
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.handles import RegionHandles

pytestmark = pytest.mark.integration


async def test_a_rebuild_reads_its_read_streams_state_once(cluster2: LocalSuperCluster) -> None:
    vs = VirtualStream("orders", tuple(cluster2.regions))
    read_stream = vs.read_stream("west")
    watcher = await nats.connect(cluster2.servers("west"))
    conn = NatsConnection(NatsConfig(servers=tuple(cluster2.servers("west"))), name="rebuild")
    try:
        js = watcher.jetstream()
        await apply_topology(watcher, vs)
        await js.add_consumer(read_stream, durable_config(vs, "d"))
        await js.publish(vs.publish_subject("west", "x"), b"stored")
        await conn.connect()
        port = NatsPort(conn)
        handles = RegionHandles("west", conn, port)
        handles.cursor_store = CursorStore(await open_regional_kv(port, "rsub-test", "west"))
        driver = StreamDriver(
            vs, MachineConfig("west", vs.name, vs.regions), handles, SidecarMetrics()
        )
        asked: list[str] = []

        async def note(msg: Msg) -> None:
            asked.append(msg.subject)

        heard = await watcher.subscribe(f"$JS.API.STREAM.INFO.{read_stream}", cb=note)
        await watcher.flush()
        await driver.rebuild()
        await watcher.flush()
        await heard.unsubscribe()
        assert driver.machine is not None
        assert [s.name for s in driver.machine.subscriptions()] == ["d"]
        assert asked == [f"$JS.API.STREAM.INFO.{read_stream}"]
    finally:
        await conn.close()
        await watcher.close()
