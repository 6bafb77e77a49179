"""Test helpers for the API layer: an in-memory backend, a fixed-state server, certificates.

`MemoryBackend` implements `SidecarBackend` with plain dictionaries. It stands in for the
runtime because these tests check the API layer alone (validation, status codes, auth, TLS,
health, conversions); end-to-end tests with NATS live with the runtime.

`StateServer` is a real gRPC server answering `GetSubscription` with messages given as they go
on the wire, for clients of fields the backend views do not carry (the progress vector read by
the exact client and the Spark source), and for a server built on the released schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sidecar._gen.rsub.v1 import api_pb2
from sidecar.api.grpc_server import CURSOR_SERVICE
from sidecar.protocol import SubscriptionKind
from sidecar.runtime.errors import FailedPrecondition, NotFound, NotLeader, Unavailable
from sidecar.runtime.views import (
    AppliedUpdateView,
    CursorResetView,
    Readiness,
    SnapshotView,
    SourceLinkView,
    StatusView,
    StreamStatusView,
    SubscriptionView,
)

STREAM = "orders"
SUBSCRIPTION = "billing"


def subscription_view(
    name: str,
    *,
    mark_delete: int = 0,
    kind: SubscriptionKind = SubscriptionKind.DURABLE,
    receives_markers: bool = False,
) -> SubscriptionView:
    return SubscriptionView(
        stream=STREAM,
        subscription=name,
        kind=kind,
        replicated=True,
        mark_delete=mark_delete,
        mark_delete_read_unix_ms=None if mark_delete == 0 else 1_700_000_000_000,
        last_snapshot_id=None,
        last_snapshot_local=0,
        last_update_sent_unix_ms=None,
        applied=(),
        cached_snapshots=0,
        progress={},
        failover_exposure=None,
        progress_sent={},
        progress_sent_position=0,
        receives_markers=receives_markers,
        consumed_in=(),
        acked={},
    )


class MemoryBackend:
    """A `SidecarBackend` over dictionaries; flags let tests play follower or outage (as in
    the runtime, a follower refuses only `trigger_snapshot`)."""

    def __init__(self) -> None:
        self.is_leader = True
        self.readiness = Readiness(connected=True, topology_applied=True, leadership_known=True)
        self.unavailable = False
        self.snapshot_counter = 0
        self.subscriptions: dict[str, dict[str, SubscriptionView]] = {
            STREAM: {
                SUBSCRIPTION: dataclasses.replace(
                    subscription_view(SUBSCRIPTION, mark_delete=41),
                    last_snapshot_id="snap-7",
                    last_snapshot_local=40,
                    last_update_sent_unix_ms=1_700_000_000_500,
                    applied=(AppliedUpdateView("east", "snap-3", 17, 1_700_000_000_900),),
                    cached_snapshots=2,
                    progress={"east": 9},
                    failover_exposure=3,
                    progress_sent={"east": 7, "west": 30},
                    progress_sent_position=41,
                ),
                "audit": subscription_view("audit", mark_delete=3),
            }
        }
        self.snapshots: dict[str, list[SnapshotView]] = {
            STREAM: [
                SnapshotView("snap-7", STREAM, 40, {"east": 33, "north": 12}, 1_700_000_000_400, 12)
            ]
        }
        self._changed = asyncio.Condition()

    def make_cursor(self, name: str = SUBSCRIPTION) -> None:
        """Make subscription `name` of `STREAM` an external cursor, its state otherwise as it
        is: what a Spark query commits to (the source refuses a durable at its start)."""
        view = self.subscriptions[STREAM][name]
        self.subscriptions[STREAM][name] = dataclasses.replace(view, kind=SubscriptionKind.EXTERNAL)

    def _check(self, stream: str) -> dict[str, SubscriptionView]:
        if self.unavailable:
            raise Unavailable("NATS connection lost")
        if stream not in self.subscriptions:
            raise NotFound(f"stream {stream!r} is not managed by this sidecar")
        return self.subscriptions[stream]

    def _subscription(self, stream: str, subscription: str) -> SubscriptionView:
        subs = self._check(stream)
        if subscription not in subs:
            raise NotFound(f"subscription {subscription!r} not found on stream {stream!r}")
        return subs[subscription]

    async def _store(self, view: SubscriptionView) -> SubscriptionView:
        async with self._changed:
            self.subscriptions[view.stream][view.subscription] = view
            self._changed.notify_all()
        return view

    async def _wait_for_change(
        self, stream: str, subscription: str, seen: SubscriptionView
    ) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.subscriptions[stream].get(subscription) != seen
            )

    async def status(self) -> StatusView:
        if self.unavailable:
            raise Unavailable("NATS connection lost")
        return StatusView(
            region="west",
            regions=("east", "north", "west"),
            leader=self.is_leader,
            epoch=5,
            holder="west-a",
            connected=self.readiness.connected,
            version="0.1.0",
            streams=(
                StreamStatusView(
                    stream=STREAM,
                    write_stream=f"{STREAM}-write-west",
                    read_stream=f"{STREAM}-read-west",
                    last_snapshot_age_ms=1500,
                    sources=(
                        SourceLinkView("east", True, 250, 3),
                        SourceLinkView("north", False, None, 0),
                    ),
                    replicated_subscriptions=2,
                    snapshot_pending=False,
                    leader_holder="west-a" if self.is_leader else "west-b",
                    leader_epoch=5,
                    leads=self.is_leader,
                    discovered=True,
                ),
            ),
        )

    async def get_subscription(self, stream: str, subscription: str) -> SubscriptionView:
        return self._subscription(stream, subscription)

    async def list_subscriptions(self, stream: str) -> Sequence[SubscriptionView]:
        return sorted(self._check(stream).values(), key=lambda v: v.subscription)

    async def list_snapshots(self, stream: str) -> Sequence[SnapshotView]:
        self._check(stream)
        return self.snapshots[stream]

    async def watch_subscription(
        self, stream: str, subscription: str
    ) -> AsyncIterator[SubscriptionView]:
        current: SubscriptionView | None = self._subscription(stream, subscription)
        while current is not None:
            yield current
            await self._wait_for_change(stream, subscription, current)
            current = self.subscriptions[stream].get(subscription)

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        subs = self._check(stream)
        view = subs.get(subscription) or subscription_view(
            subscription, kind=SubscriptionKind.EXTERNAL
        )
        if sequence > view.mark_delete:
            view = await self._store(dataclasses.replace(view, mark_delete=sequence))
        elif subscription not in subs:
            await self._store(view)
        return view.mark_delete

    async def reset_cursor(self, stream: str, subscription: str, sequence: int) -> CursorResetView:
        view = self._subscription(stream, subscription)
        if view.kind is not SubscriptionKind.EXTERNAL:
            raise NotFound(f"stream {stream!r} has no external cursor {subscription!r} here")
        await self._store(dataclasses.replace(view, mark_delete=sequence))
        return CursorResetView(stream, subscription, view.mark_delete, sequence)

    async def trigger_snapshot(self, stream: str) -> str:
        subs = self._check(stream)
        if not self.is_leader:
            raise NotLeader("TriggerSnapshot needs the leader; this sidecar is a follower")
        if not any(v.replicated for v in subs.values()):
            raise FailedPrecondition(f"stream {stream!r} has no replicated subscription here")
        self.snapshot_counter += 1
        return f"snap-manual-{self.snapshot_counter}"

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> SubscriptionView:
        view = self._subscription(stream, subscription)
        return await self._store(dataclasses.replace(view, replicated=replicated))


class StateServer:
    """A real gRPC server (plain, on its own threads) whose CursorService answers
    GetSubscription with the message of `states` for its stream and subscription, NOT_FOUND
    for others; every other call is UNIMPLEMENTED. Each message goes on the wire as it is
    encoded: a `SubscriptionState` answers as a server built on the released schema does
    (GetSubscription answered SubscriptionState before it had a response message of its own).
    """

    def __init__(
        self, states: Iterable[api_pb2.GetSubscriptionResponse | api_pb2.SubscriptionState]
    ) -> None:
        by_name = {(s.stream, s.subscription): s for s in states}

        def get_subscription(request: Any, context: grpc.ServicerContext) -> Any:
            state = by_name.get((request.stream, request.subscription))
            if state is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"subscription {request.subscription!r}")
            return state

        handler = grpc.unary_unary_rpc_method_handler(
            get_subscription,
            request_deserializer=api_pb2.GetSubscriptionRequest.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(CURSOR_SERVICE, {"GetSubscription": handler})]
        )
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        self._server.stop(0).wait()


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing the server trusts."""
    other_client_cert: Path
    other_client_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _make_leaf(
    directory: Path, name: str, ca: tuple[Path, Path], extensions: str
) -> tuple[Path, Path]:
    cert, key, csr = directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


def make_certs(directory: Path) -> Certs:
    """A CA, a server and a client certificate it signed, and an unrelated CA and client."""
    ca = _make_ca(directory, "rsub-test-ca")
    other_ca = _make_ca(directory, "rsub-other-ca")
    server = _make_leaf(
        directory,
        "server",
        ca,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    client = _make_leaf(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    other_client = _make_leaf(directory, "intruder", other_ca, "extendedKeyUsage=clientAuth\n")
    return Certs(
        ca=ca[0],
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        other_ca=other_ca[0],
        other_client_cert=other_client[0],
        other_client_key=other_client[1],
    )
