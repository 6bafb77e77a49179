"""Helpers of the Spark plugin tests: stream layouts on a real nats-server, a sidecar double.

`orders_layout` (session-scoped) starts a JetStream nats-server of its own (`LoneServer`) holding the streams
of the virtual stream `orders` for regions `west` and `east`, created by `apply_topology`, so the
read stream `orders-read-west` sources both write streams for real (real
`Nats-Stream-Source` headers, markers and snapshot markers interleaved with data).

`sidecar_double` serves the project's real gRPC API (`start_grpc_server`) over an in-memory
cursor backend: it answers GetSubscription and CommitCursor like the sidecar does. To test
against the real sidecar runtime instead, start the runtime and pass its address as the
`sidecar` option; nothing else changes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS

from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.naming import DEFAULT_READ_STREAM, DEFAULT_WRITE_STREAM, VirtualStream
from sidecar.nats.topology import apply_topology
from sidecar.protocol import SubscriptionKind
from sidecar.runtime.errors import NotFound, Unavailable
from sidecar.runtime.views import (
    CursorResetView,
    Readiness,
    SnapshotView,
    StatusView,
    SubscriptionView,
)

REGIONS = ("west", "east")


@dataclass
class Published:
    """One data message as published in its origin region."""

    region: str
    origin_sequence: int
    subject: str
    data: bytes
    headers: dict[str, str] | None


@dataclass
class Layout:
    url: str
    vstream: VirtualStream
    read_stream: str
    published: list[Published] = field(default_factory=list)
    # The read stream as stored: (sequence, subject, data) of every message, markers included.
    stored: list[tuple[int, str, bytes]] = field(default_factory=list)

    def options(self, **extra: str) -> dict[str, str]:
        return {"servers": self.url, "stream": self.vstream.name, "region": "west", **extra}

    def data_between(self, start: int, end: int) -> list[tuple[int, str, bytes]]:
        """The ground truth of a range: stored data messages with start < seq <= end."""
        prefix = f"{self.vstream.name}."
        return [m for m in self.stored if start < m[0] <= end and m[1].startswith(prefix)]


async def set_direct_get(nc: NATS, stream: str, allow: bool) -> None:
    """Sets allow_direct on `stream`, every other field of its configuration untouched."""
    info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)).data)
    config = {**info["config"], "allow_direct": allow}
    reply = await nc.request(f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(config).encode(), 5)
    if "error" in json.loads(reply.data):
        raise RuntimeError(f"cannot set allow_direct on {stream}: {reply.data!r}")


async def create_layout(
    nc: NATS,
    name: str,
    *,
    direct: bool = True,
    write_pattern: str = DEFAULT_WRITE_STREAM,
    read_pattern: str = DEFAULT_READ_STREAM,
) -> VirtualStream:
    """The streams of `name` in regions west and east on one server; the read streams allow
    direct get (as the topology makes them) unless `direct` is False (then the reader falls
    back to a consumer)."""
    vstream = VirtualStream(name, REGIONS, write_pattern=write_pattern, read_pattern=read_pattern)
    await apply_topology(nc, vstream, cluster_for_region=lambda _: None)
    for region in REGIONS:
        await set_direct_get(nc, vstream.read_stream(region), direct)
    return vstream


async def publish_orders(
    nc: NATS,
    vstream: VirtualStream,
    count: int,
    *,
    first_index: int = 0,
    markers: bool = True,
) -> list[Published]:
    """Publishes `count` orders alternating between regions, with fake markers in between
    (leave them out when real sidecars run: they would read them)."""
    js = nc.jetstream()
    out: list[Published] = []
    for i in range(first_index, first_index + count):
        region = REGIONS[i % len(REGIONS)]
        data = json.dumps({"key": f"k{i % 7}", "amount": i % 5 + 1}).encode()
        headers: dict[str, str] | None = None
        if i % 3 == 0:
            headers = {"Rsub-Published-At": str(1_700_000_000_000 + i), "App": f"a{i}"}
        elif i % 3 == 1:
            headers = {"Rsub-Published-At": "2024-05-06T07:08:09.123456789Z"}
        subject = vstream.publish_subject(region, f"k{i % 7}")
        ack = await js.publish(subject, data, headers=headers)
        out.append(Published(region, ack.seq, subject, data, headers))
        if markers and i % 10 == 9:
            marker_id = f"{vstream.name}-m-{region}-{i}"
            await js.publish(
                vstream.marker_subject(region), b"marker", headers={"Nats-Msg-Id": marker_id}
            )
        if markers and i % 25 == 24:
            await js.publish(
                vstream.snapshot_subject("west"),
                b"snapshot",
                headers={"Nats-Msg-Id": f"{vstream.name}-s-{i}"},
            )
    return out


async def wait_sourced(
    nc: NATS, vstream: VirtualStream, data_count: int, timeout_s: float = 20, region: str = "west"
) -> int:
    """Waits until `region`'s read stream holds `data_count` data messages; its last seq."""
    js = nc.jetstream()
    read_stream = vstream.read_stream(region)
    deadline = time.monotonic() + timeout_s
    while True:
        info = await js.stream_info(read_stream, subjects_filter=vstream.data_filter())
        held = sum((info.state.subjects or {}).values())
        if held >= data_count:
            return int(info.state.last_seq)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{read_stream} holds {held} of {data_count} data messages")
        await asyncio.sleep(0.05)


async def stored_messages(nc: NATS, stream: str, last_seq: int) -> list[tuple[int, str, bytes]]:
    js = nc.jetstream()
    out = []
    for seq in range(1, last_seq + 1):
        msg = await js.get_msg(stream, seq)
        out.append((seq, str(msg.subject), bytes(msg.data or b"")))
    return out


class CursorBackend:
    """An in-memory SidecarBackend answering only what the Spark source uses."""

    def __init__(self) -> None:
        self.cursors: dict[tuple[str, str], int] = {}
        self.commits: list[tuple[str, str, int]] = []

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def readiness(self) -> Readiness:
        return Readiness(connected=True, topology_applied=True, leadership_known=True)

    def _view(self, stream: str, subscription: str) -> SubscriptionView:
        if (stream, subscription) not in self.cursors:
            raise NotFound(f"subscription {subscription!r} of stream {stream!r}")
        return SubscriptionView(
            stream=stream,
            subscription=subscription,
            kind=SubscriptionKind.EXTERNAL,
            replicated=True,
            mark_delete=self.cursors[(stream, subscription)],
            mark_delete_read_unix_ms=None,
            last_snapshot_id=None,
            last_snapshot_local=0,
            last_update_sent_unix_ms=None,
            applied=(),
            cached_snapshots=0,
            progress={},
            failover_exposure=None,
            progress_sent={},
            progress_sent_position=0,
            receives_markers=False,
            consumed_in=(),
            acked={},
        )

    async def status(self) -> StatusView:
        raise Unavailable("the test double serves cursors only")

    async def get_subscription(self, stream: str, subscription: str) -> SubscriptionView:
        return self._view(stream, subscription)

    async def list_subscriptions(self, stream: str) -> Sequence[SubscriptionView]:
        return [self._view(s, n) for (s, n) in self.cursors if s == stream]

    async def list_snapshots(self, stream: str) -> Sequence[SnapshotView]:
        return []

    async def watch_subscription(
        self, stream: str, subscription: str
    ) -> AsyncIterator[SubscriptionView]:
        yield self._view(stream, subscription)

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        self.commits.append((stream, subscription, sequence))
        key = (stream, subscription)
        self.cursors[key] = max(self.cursors.get(key, 0), sequence)
        return self.cursors[key]

    async def reset_cursor(self, stream: str, subscription: str, sequence: int) -> CursorResetView:
        raise Unavailable("the test double serves the Spark source's calls only")

    async def trigger_snapshot(self, stream: str) -> str:
        raise Unavailable("the test double serves cursors only")

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> SubscriptionView:
        raise Unavailable("the test double serves cursors only")


class SidecarDouble:
    """The real gRPC server over `CursorBackend`, on its own event-loop thread."""

    def __init__(self) -> None:
        self.backend = CursorBackend()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._handle: GrpcServerHandle = self._call(start_grpc_server(self.backend, "127.0.0.1:0"))
        self.address = f"127.0.0.1:{self._handle.port}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def stop(self) -> None:
        self._call(self._handle.stop(0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
