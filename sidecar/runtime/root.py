"""`Runtime`: the composition root of a sidecar (see the package docstring for the use)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import structlog
from nats.errors import Error as NatsError

from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.api.http_server import HttpServerHandle, start_http_server
from sidecar.api.metrics import SidecarMetrics
from sidecar.config import Config
from sidecar.naming import VirtualStream
from sidecar.nats.connection import NatsConnection, NatsRefused
from sidecar.nats.cursors import CursorStore
from sidecar.nats.lease import Lease, LeaseState
from sidecar.nats.regional_kv import open_regional_kv
from sidecar.nats.topology import TopologyError, apply_topology
from sidecar.protocol import MachineConfig
from sidecar.runtime.backend import RuntimeBackend
from sidecar.runtime.driver import IntervalLoop, StreamDriver
from sidecar.runtime.handles import RegionHandles

log = structlog.get_logger(__name__)

T = TypeVar("T")

_RETRY_START_S = 0.5
_RETRY_MAX_S = 10.0
_STOP_GRACE_S = 1.0
_CANCEL_ROUNDS = 5
# Failures worth retrying: NATS trouble, or a topology conflict an operator has to fix.
_RETRIED = (NatsError, asyncio.TimeoutError, OSError, RuntimeError, TopologyError)


def default_holder() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def machine_config(config: Config, vs: VirtualStream) -> MachineConfig:
    return MachineConfig(
        region=config.region,
        stream=vs.name,
        regions=tuple(config.regions),
        interval_ms=config.snapshot.interval_ms,
        timeout_ms=int(config.snapshot.timeout_s * 1000),
        cache_size=config.snapshot.cache_size,
        progress=config.progress.enabled,
    )


class Runtime(RuntimeBackend):
    def __init__(
        self,
        config: Config,
        *,
        holder: str | None = None,
        apply_topology: bool = True,
        serve: bool = True,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.config = config
        self.holder = holder or default_holder()
        self.metrics = metrics or SidecarMetrics()
        conn = NatsConnection(
            config.nats,
            name=f"rsub-{config.region}-{self.holder}",
            on_change=self.metrics.set_nats_connected,
        )
        handles = RegionHandles(config.region, conn)
        drivers = {
            vs.name: StreamDriver(vs, machine_config(config, vs), handles, self.metrics)
            for vs in config.virtual_streams
        }
        super().__init__(config.regions, handles, drivers, topology_applied=not apply_topology)
        self._apply_topology = apply_topology
        self._serve = serve
        self._leadership: tuple[bool, int] = (False, 0)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._ready = asyncio.Event()
        self._failed = asyncio.Event()
        self.failure: NatsRefused | None = None
        self._grpc: GrpcServerHandle | None = None
        self._http: HttpServerHandle | None = None

    @property
    def grpc_port(self) -> int | None:
        return self._grpc.port if self._grpc is not None else None

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the API (not ready yet), then bring everything up in the background."""
        if self._serve:
            grpc_cfg = self.config.grpc
            token = grpc_cfg.auth_token.reveal() if grpc_cfg.auth_token is not None else None
            self._grpc = await start_grpc_server(
                self, grpc_cfg.listen, auth_token=token, tls=grpc_cfg.tls
            )
            self._http = await start_http_server(self, self.metrics, self.config.http.listen)
        self._spawn(self._bring_up(), "bring-up")
        log.info("runtime_started", region=self.region, holder=self.holder)

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until connected, the topology applied and every stream rebuilt and tailing.

        Raises the `NatsRefused` error as soon as NATS refuses the first connection.
        """
        async with asyncio.timeout(timeout_s):
            ready = asyncio.create_task(self._ready.wait())
            failed = asyncio.create_task(self._failed.wait())
            try:
                await asyncio.wait({ready, failed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                failed.cancel()
        if self.failure is not None and not self._ready.is_set():
            raise self.failure

    async def wait_failed(self) -> NatsRefused:
        """Wait until the bring-up gives up for good (NATS refused the first connection)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    async def stop(self) -> None:
        """Stop serving, stop the tasks, give the lease up, flush and close (idempotent)."""
        if self._grpc is not None:
            await self._grpc.stop(_STOP_GRACE_S)
            self._grpc = None
        if self._http is not None:
            await self._http.stop()
            self._http = None
        self._stopping = True
        for driver in self._drivers.values():
            driver.stop()
        await self._cancel_tasks()
        handles = self._handles
        if handles.lease is not None and handles.conn.connected:
            await handles.lease.release()
        handles.lease = None
        await handles.conn.close()
        log.info("runtime_stopped", region=self.region, holder=self.holder)

    async def _cancel_tasks(self) -> None:
        # Cancel again while tasks remain: a cancellation racing a finished inner future can
        # be swallowed on Python 3.11 (`asyncio.wait_for`), and loops also watch a stop flag.
        pending = {t for t in self._tasks if not t.done()}
        for _ in range(_CANCEL_ROUNDS):
            if not pending:
                break
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_STOP_GRACE_S)
        if pending:
            log.error("tasks_not_stopping", tasks=sorted(t.get_name() for t in pending))
        self._tasks.clear()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("task_failed", task=name)

        self._tasks.append(asyncio.create_task(guarded(), name=f"rsub-{name}"))

    async def _retry(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` until it succeeds, with back-off; every failure is logged."""
        delay = _RETRY_START_S
        while not self._stopping:
            try:
                return await attempt()
            except _RETRIED as err:
                log.warning("retrying", what=what, error=repr(err), retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)
        raise asyncio.CancelledError

    # ---- bring-up -----------------------------------------------------------------------

    async def _bring_up(self) -> None:
        """Connect, apply the topology, open the lease bucket, rebuild and run every stream."""
        conn = self._handles.conn
        try:
            await conn.connect()
        except NatsRefused as err:
            log.error("nats_refused", region=self.region, error=str(err))
            self.failure = err
            self._failed.set()
            return
        if self._apply_topology:
            for driver in self._drivers.values():
                vs = driver.vs
                await self._retry(f"topology {vs.name}", partial(self._topology, vs))
            self._topology_applied = True
        bucket = f"{self.config.lease.bucket}-{self.region}"
        kv = await self._retry(
            f"kv bucket {bucket}",
            lambda: open_regional_kv(conn.js, bucket, self.config.cluster_for(self.region)),
        )
        # The same bucket keeps the lease (key `leader`) and the cursors (`cursors.<V>`).
        self._handles.cursor_store = CursorStore(kv)
        lease = Lease(kv, self.holder, self.config.lease.ttl_s, on_change=self._on_lease)
        self._handles.lease = lease
        self._spawn(lease.run(), "lease")
        intervals = IntervalLoop(
            list(self._drivers.values()),
            self._handles,
            self.config.snapshot.interval_ms,
            self.config.snapshot.sweep_intervals,
        )
        await self._retry("consumer signals", intervals.follow_consumers)
        self._spawn(intervals.follow_cursors(bucket), "cursor-signals")
        for name, driver in self._drivers.items():
            await self._retry(f"rebuild {name}", driver.rebuild)
            self._spawn(driver.drive(), f"drive-{name}")
            self._spawn(driver.tail(), f"tail-{name}")
            self._spawn(driver.index(), f"index-{name}")
        self._spawn(intervals.run(), "intervals")
        self._ready.set()
        log.info("runtime_ready", region=self.region, streams=list(self._drivers))

    async def _topology(self, vs: VirtualStream) -> None:
        report = await apply_topology(
            self._handles.conn.nc,
            vs,
            cluster_for_region=self.config.cluster_for,
            replicas=self.config.stream(vs.name).replicas,
        )
        # Per stream the details went out as `topology.stream_applied`; here the counts.
        actions = Counter(s.action for s in report.streams)
        log.info(
            "topology_applied",
            stream=vs.name,
            created=actions["created"],
            updated=actions["updated"],
            unchanged=actions["unchanged"],
        )

    def _on_lease(self, state: LeaseState) -> None:
        # A follower shows the leader's epoch: both replicas of a region report the same one.
        self.metrics.set_leader(state.leader, state.leader_epoch)
        leadership = (state.leader, state.epoch)
        if leadership == self._leadership:
            return
        self._leadership = leadership
        log.info("leadership_changed", leader=state.leader, epoch=state.epoch)
        for driver in self._drivers.values():
            driver.leadership(state.leader, state.epoch)
