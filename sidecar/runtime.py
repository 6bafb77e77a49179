"""The sidecar runtime: NATS and timers in, the PIP-33 machines in the middle, actions out.

Programmatic use (tests, the demo, `rsub run`)::

    runtime = Runtime(config)          # a sidecar.config.Config; nothing happens yet
    await runtime.start()              # serve gRPC + HTTP, then connect etc. in the background
    await runtime.wait_ready(30)       # connected, topology applied, every stream rebuilt
                                       # (raises NatsRefused if NATS refused the credentials)
    runtime.grpc_port, runtime.http_port   # bound ports (listen on port 0 to get free ones)
    runtime.is_leader, runtime.epoch, runtime.readiness
    await runtime.wait_failed()        # returns the NatsRefused that stopped the bring-up
    await runtime.stop()               # stop serving, release the lease, flush and close

`Runtime(config, holder=..., apply_topology=False, serve=False)`: `holder` names this
replica in the lease (default host-pid-random); `apply_topology=False` skips
`apply_topology` at start (the streams must exist); `serve=False` runs without gRPC/HTTP.
`Runtime` implements `sidecar.api.backend.SidecarBackend` and drives `SidecarMetrics`.

How it works, per virtual stream `V` of the configuration:
- start: replay the markers stored in `V`'s read stream, read the subscriptions and their
  positions, and `StreamMachine.restore` a follower from them (DESIGN §5), then tail the
  read stream's markers live from where the replay ended;
- every `snapshot.interval_ms`: read the positions of the durables (one consumer listing)
  and the external cursors (one KV get; a cursor that only markers follow counts as at the
  read stream's end, `TrailingMarkers`), hand them to the machine, then `tick` it;
- one driver task per stream feeds those inputs to the machine in order and carries out the
  outputs in order: markers are published only while the lease says this replica leads
  with the machine's epoch, consumers are moved forward / created, cursors moved.

Leadership is the lease in the region's KV bucket `<lease.bucket>-<region>` (key `leader`);
the same bucket keeps the external cursors (key `cursors.<V>`, see `sidecar.nats.cursors`).
Followers keep their machines up to date from the tail (so reads work on every replica);
a new leader's machine gets `became_leader(epoch)` and carries out what its predecessor
missed. A lost NATS connection is reported (readiness, metrics, UNAVAILABLE for writes) and
retried; a malformed marker is counted and skipped. Only a refusal of the credentials or TLS
settings at the very first connection is final: it is logged as one error line
(`nats_refused`), `runtime.failure` holds it and `wait_failed()` / `wait_ready()` return /
raise it; the caller decides to stop (`rsub run` exits with status 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

import sidecar
from sidecar.api import backend as views
from sidecar.api.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotLeader,
    Unavailable,
)
from sidecar.api.grpc_server import GrpcServerHandle, start_grpc_server
from sidecar.api.http_server import HttpServerHandle, start_http_server
from sidecar.api.metrics import SidecarMetrics
from sidecar.config import Config
from sidecar.nats import consumers
from sidecar.nats.connection import NatsConnection, NatsRefused
from sidecar.nats.cursors import CursorStore, TrailingMarkers
from sidecar.nats.lease import Lease, LeaseState
from sidecar.nats.marker_log import StoredMarker, publish_marker, replay_markers, tail_markers
from sidecar.nats.names import VirtualStream
from sidecar.nats.regional_kv import open_regional_kv
from sidecar.nats.topology import TopologyError, apply_topology
from sidecar.protocol import (
    Action,
    CreateConsumer,
    CreateCursor,
    IgnoreReason,
    LeadershipLost,
    MachineConfig,
    Marker,
    MarkerIgnored,
    MoveConsumer,
    MoveCursor,
    Output,
    PendingView,
    PublishLocal,
    PublishReplicated,
    Rejected,
    RejectReason,
    Request,
    Response,
    Snapshot,
    SnapshotCompleted,
    SnapshotStarted,
    SnapshotTimedOut,
    StreamMachine,
    SubscriptionInfo,
    SubscriptionKind,
    UpdateApplied,
    UpdateSent,
    decode,
    encode,
)
from sidecar.protocol import SubscriptionView as MachineSubscription

log = structlog.get_logger(__name__)

T = TypeVar("T")
Input = Callable[[StreamMachine], list[Output]]

_RETRY_START_S = 0.5
_RETRY_MAX_S = 10.0
_SOURCE_ACTIVE_NS = 10 * 1_000_000_000
_STOP_GRACE_S = 1.0
_CANCEL_ROUNDS = 5
_ACTIONS = (PublishReplicated, PublishLocal, MoveConsumer, MoveCursor, CreateConsumer, CreateCursor)
# Failures worth retrying: NATS trouble, or a topology conflict an operator has to fix.
_RETRIED = (NatsError, asyncio.TimeoutError, OSError, RuntimeError, TopologyError)


def now_ms() -> int:
    return int(time.time() * 1000)


def default_holder() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def marker_msg_id(marker: Marker) -> str:
    """A `Nats-Msg-Id` unique to the marker's content (a retried publish is stored once)."""
    body, prefix = marker.body, f"rsub.{marker.stream}"
    if isinstance(body, Request):
        return f"{prefix}.req.{body.id}.{body.round}"
    if isinstance(body, Response):
        return f"{prefix}.resp.{marker.region}.{body.id}.{body.round}"
    if isinstance(body, Snapshot):
        return f"{prefix}.snap.{body.id}"
    return f"{prefix}.upd.{body.subscription}.{body.snapshot_id}"


@dataclass
class _Job:
    apply: Input
    done: asyncio.Future[None] | None = None


@dataclass
class _Stream:
    """Everything the runtime keeps for one virtual stream."""

    vs: VirtualStream
    config: MachineConfig
    reader: consumers.PositionReader
    trailing: TrailingMarkers
    machine: StreamMachine | None = None
    jobs: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    tail_seq: int = 0
    durables: dict[str, SubscriptionInfo] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    positions_read_ms: int | None = None
    last_seq: int = 0
    last_marker_ms: dict[str, int] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)
    gap_series: set[str] = field(default_factory=set)

    def subscriptions(self) -> dict[str, SubscriptionInfo]:
        external = SubscriptionInfo(SubscriptionKind.EXTERNAL, True, b"")
        return {**{name: external for name in self.cursors}, **self.durables}


class Runtime:
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
        self.region = config.region
        self.holder = holder or default_holder()
        self.metrics = metrics or SidecarMetrics()
        self._apply_topology = apply_topology
        self._serve = serve
        self._conn = NatsConnection(
            config.nats, name=f"rsub-{self.region}-{self.holder}", on_change=self._on_connection
        )
        self._streams = {
            vs.name: _Stream(
                vs,
                MachineConfig(
                    region=config.region,
                    stream=vs.name,
                    regions=tuple(config.regions),
                    interval_ms=config.snapshot.interval_ms,
                    timeout_ms=int(config.snapshot.timeout_s * 1000),
                    cache_size=config.snapshot.cache_size,
                ),
                consumers.PositionReader(vs.read_stream(config.region)),
                TrailingMarkers(vs.read_stream(config.region), vs.data_filter()),
            )
            for vs in config.virtual_streams
        }
        self._lease: Lease | None = None
        self._cursor_store: CursorStore | None = None
        self._topology_applied = not apply_topology
        self._leadership: tuple[bool, int] = (False, 0)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._ready = asyncio.Event()
        self._failed = asyncio.Event()
        self.failure: NatsRefused | None = None
        self._grpc: GrpcServerHandle | None = None
        self._http: HttpServerHandle | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    @property
    def grpc_port(self) -> int | None:
        return self._grpc.port if self._grpc is not None else None

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http is not None else None

    @property
    def epoch(self) -> int:
        return self._lease.epoch if self._lease is not None else 0

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
        await self._cancel_tasks()
        if self._lease is not None and self._conn.connected:
            await self._lease.release()
        self._lease = None
        await self._conn.close()
        log.info("runtime_stopped", region=self.region, holder=self.holder)

    async def _cancel_tasks(self) -> None:
        # Cancel again while tasks remain: a cancellation racing a finished inner future can
        # be swallowed on Python 3.11 (`asyncio.wait_for`), and loops also watch `_stopping`.
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

    async def _bring_up(self) -> None:
        try:
            await self._conn.connect()
        except NatsRefused as err:
            log.error("nats_refused", region=self.region, error=str(err))
            self.failure = err
            self._failed.set()
            return
        if self._apply_topology:
            for st in self._streams.values():
                await self._retry(f"topology {st.vs.name}", partial(self._topology, st.vs))
            self._topology_applied = True
        bucket = f"{self.config.lease.bucket}-{self.region}"
        kv = await self._retry(
            f"kv bucket {bucket}",
            lambda: open_regional_kv(self._conn.js, bucket, self.config.cluster_for(self.region)),
        )
        self._cursor_store = CursorStore(kv)
        self._lease = Lease(kv, self.holder, self.config.lease.ttl_s, on_change=self._on_lease)
        self._spawn(self._lease.run(), "lease")
        for st in self._streams.values():
            await self._retry(f"rebuild {st.vs.name}", partial(self._rebuild, st))
            self._spawn(self._drive(st), f"drive-{st.vs.name}")
            self._spawn(self._tail(st), f"tail-{st.vs.name}")
            self._spawn(self._tick(st), f"tick-{st.vs.name}")
        self._ready.set()
        log.info("runtime_ready", region=self.region, streams=list(self._streams))

    async def _topology(self, vs: VirtualStream) -> None:
        report = await apply_topology(
            self._conn.nc,
            vs,
            cluster_for_region=self.config.cluster_for,
            replicas=self.config.stream(vs.name).replicas,
        )
        log.info("topology_applied", stream=vs.name, report=str(report))

    # ---- connection and leadership ------------------------------------------------------

    def _on_connection(self, connected: bool) -> None:
        self.metrics.set_nats_connected(connected)

    def _on_lease(self, state: LeaseState) -> None:
        leadership = (state.leader, state.epoch)
        if leadership == self._leadership:
            return
        self._leadership = leadership
        self.metrics.set_leader(state.leader, state.epoch)
        log.info("leadership_changed", leader=state.leader, epoch=state.epoch)
        for st in self._streams.values():
            if state.leader:
                st.jobs.put_nowait(_Job(partial(self._become_leader, st, state.epoch)))
            else:
                st.jobs.put_nowait(_Job(StreamMachine.became_follower))

    def _become_leader(self, st: _Stream, epoch: int, machine: StreamMachine) -> list[Output]:
        try:
            return machine.became_leader(epoch)
        except ValueError as err:
            # The lease bucket was reset: its revisions restarted below epochs already seen.
            log.error("stale_lease_epoch", stream=st.vs.name, epoch=epoch, error=str(err))
            return []

    def _leads_with(self, machine: StreamMachine) -> bool:
        lease = self._lease
        return lease is not None and lease.is_leader and lease.epoch == machine.epoch

    # ---- per stream: rebuild, tail, tick, drive -------------------------------------------

    async def _rebuild(self, st: _Stream) -> None:
        js, vs = self._conn.js, st.vs
        markers: list[tuple[int, Marker]] = []
        async for stored in replay_markers(js, vs.read_stream(self.region), vs.marker_filter()):
            decoded = self._decode(st, stored)
            if isinstance(decoded, Marker):
                markers.append((stored.seq, decoded))
            st.tail_seq = stored.seq
        positions = await self._read_positions(st)
        # Leadership reaches the machine through its job queue (`_on_lease`), never here:
        # `became_leader` twice with one epoch would reuse snapshot ids.
        st.machine = StreamMachine.restore(
            st.config, markers, st.subscriptions(), positions, st.last_seq, now_ms()
        )
        log.info(
            "stream_rebuilt",
            stream=vs.name,
            markers=len(markers),
            snapshots=len(st.machine.completed_snapshots()),
            subscriptions=len(st.machine.subscriptions()),
        )

    def _decode(self, st: _Stream, stored: StoredMarker) -> Marker | Rejected:
        """Decode a marker; a rejected one is counted and logged (once per reason)."""
        decoded = decode(stored.data, stream=st.vs.name, regions=self.config.regions)
        subject_region = stored.subject.rsplit(".", 1)[-1]
        if isinstance(decoded, Marker) and decoded.region != subject_region:
            decoded = Rejected(
                RejectReason.INVALID_FIELD,
                f"region: {decoded.region!r} wrote on the subject of {subject_region!r}",
            )
        if isinstance(decoded, Rejected):
            self.metrics.marker_rejected(st.vs.name, decoded.reason.value)
            self._report_once(
                st,
                f"rejected:{decoded.reason.value}",
                "marker_rejected",
                seq=stored.seq,
                reason=decoded.reason.value,
                detail=decoded.detail,
            )
            return decoded
        st.last_marker_ms[decoded.region] = now_ms()
        self.metrics.marker_seen(st.vs.name, decoded.region)
        return decoded

    def _report_once(self, st: _Stream, key: str, event: str, **fields: Any) -> None:
        if key in st.reported:
            log.debug(event, stream=st.vs.name, **fields)
        else:
            st.reported.add(key)
            log.warning(event, stream=st.vs.name, **fields)

    async def _tail(self, st: _Stream) -> None:
        vs = st.vs
        while not self._stopping:
            try:
                tail = tail_markers(
                    self._conn.js, vs.read_stream(self.region), vs.marker_filter(), st.tail_seq + 1
                )
                async with contextlib.aclosing(tail):
                    async for stored in tail:
                        st.tail_seq = stored.seq
                        st.jobs.put_nowait(_Job(_marker_job(stored.seq, self._decode(st, stored))))
                log.warning("marker_tail_ended", stream=vs.name, last_seq=st.tail_seq)
            except (TimeoutError, NatsError, OSError) as err:
                log.warning("marker_tail_failed", stream=vs.name, error=repr(err))
            await asyncio.sleep(_RETRY_START_S)

    async def _read_positions(self, st: _Stream) -> dict[str, int]:
        """Durables (one listing) and external cursors (one KV get) with their positions."""
        assert self._cursor_store is not None
        read = await st.reader.read(self._conn.nc)
        st.cursors = await self._cursor_store.load(st.vs.name)
        # `read.last_seq` was read before the scan for trailing markers, as it must be.
        cursors = await st.trailing.effective(self._conn.nc, st.cursors, read.last_seq)
        st.durables = {
            c.name: SubscriptionInfo(
                SubscriptionKind.DURABLE, c.replicated, json.dumps(c.config).encode()
            )
            for c in read.consumers
        }
        st.last_seq = read.last_seq
        st.positions_read_ms = now_ms()
        return {**cursors, **{c.name: c.mark_delete for c in read.consumers if c.replicated}}

    def _positions_job(self, st: _Stream, positions: Mapping[str, int]) -> Input:
        subscriptions, last_seq = st.subscriptions(), st.last_seq

        def apply(machine: StreamMachine) -> list[Output]:
            return machine.subscriptions_changed(subscriptions) + machine.positions_read(
                positions, last_seq
            )

        return apply

    async def _tick(self, st: _Stream) -> None:
        interval_s = self.config.snapshot.interval_ms / 1000
        while not self._stopping:
            await asyncio.sleep(interval_s)
            if self._conn.connected:
                try:
                    positions = await self._read_positions(st)
                    st.jobs.put_nowait(_Job(self._positions_job(st, positions)))
                except (TimeoutError, NatsError, OSError) as err:
                    log.warning("positions_read_failed", stream=st.vs.name, error=repr(err))
            st.jobs.put_nowait(_Job(partial(StreamMachine.tick, now_ms=now_ms())))

    async def _submit(self, st: _Stream, apply: Input) -> None:
        """Queue `apply` for the stream's driver and wait until its outputs are carried out."""
        done = asyncio.get_running_loop().create_future()
        st.jobs.put_nowait(_Job(apply, done))
        await done

    async def _drive(self, st: _Stream) -> None:
        assert st.machine is not None
        machine = st.machine
        while not self._stopping:
            job = await st.jobs.get()
            try:
                await self._carry_out(st, job.apply(machine))
            except Exception:
                log.exception("stream_job_failed", stream=st.vs.name)
            finally:
                if job.done is not None and not job.done.done():
                    job.done.set_result(None)
            self._update_gauges(st, machine)
            async with st.changed:
                st.changed.notify_all()

    async def _carry_out(self, st: _Stream, outputs: Sequence[Output]) -> None:
        assert st.machine is not None
        for output in outputs:
            if isinstance(output, _ACTIONS):
                if not self._leads_with(st.machine):
                    log.info("action_dropped_not_leader", stream=st.vs.name, action=repr(output))
                    continue
                try:
                    await self._act(st, output)
                except (TimeoutError, NatsError, OSError, RuntimeError) as err:
                    log.warning(
                        "action_failed", stream=st.vs.name, action=repr(output), error=repr(err)
                    )
            else:
                self._record(st, output)

    async def _act(self, st: _Stream, action: Action) -> None:
        vs, nc, region = st.vs, self._conn.nc, self.region
        read_stream = vs.read_stream(region)
        if isinstance(action, PublishReplicated):
            await publish_marker(
                self._conn.js,
                vs.write_stream(region),
                vs.marker_subject(region),
                encode(action.marker),
                marker_msg_id(action.marker),
            )
        elif isinstance(action, PublishLocal):
            await publish_marker(
                self._conn.js,
                read_stream,
                vs.snapshot_subject(region),
                encode(action.marker),
                marker_msg_id(action.marker),
            )
        elif isinstance(action, MoveConsumer):
            try:
                await consumers.move_forward(nc, read_stream, action.subscription, action.ack_floor)
            except NotFoundError:
                log.warning("subscription_gone", stream=vs.name, subscription=action.subscription)
        elif isinstance(action, CreateConsumer):
            origin = _consumer_config(action.config)
            if origin is None:
                log.error(
                    "update_config_unreadable", stream=vs.name, subscription=action.subscription
                )
                return
            created = await consumers.create_consumer(
                nc, read_stream, action.subscription, origin, action.ack_floor
            )
            if not created:
                await consumers.move_forward(nc, read_stream, action.subscription, action.ack_floor)
        else:
            assert self._cursor_store is not None
            value = await self._cursor_store.advance(vs.name, action.subscription, action.ack_floor)
            st.cursors[action.subscription] = value

    def _record(self, st: _Stream, event: Output) -> None:
        name = st.vs.name
        if isinstance(event, SnapshotStarted):
            self.metrics.snapshot_started(name)
        elif isinstance(event, SnapshotCompleted):
            self.metrics.snapshot_completed(name, event.duration_ms / 1000)
            log.debug("snapshot_completed", stream=name, id=str(event.snapshot.id))
        elif isinstance(event, SnapshotTimedOut):
            self.metrics.snapshot_timed_out(name)
            log.warning("snapshot_timed_out", stream=name, id=str(event.id), missing=event.missing)
        elif isinstance(event, UpdateSent):
            self.metrics.update_sent(name)
        elif isinstance(event, UpdateApplied):
            self.metrics.update_applied(name, event.from_region)
            log.info(
                "update_applied",
                stream=name,
                subscription=event.subscription,
                origin=event.from_region,
                position=event.position,
            )
        elif isinstance(event, MarkerIgnored):
            if event.reason is IgnoreReason.STALE_EPOCH:
                self.metrics.marker_rejected(name, event.reason.value)
                self._report_once(
                    st,
                    f"ignored:{event.region}",
                    "marker_stale_epoch",
                    origin=event.region,
                    detail=event.detail,
                )
            else:
                log.debug(
                    "marker_ignored", stream=name, reason=event.reason.value, detail=event.detail
                )
        elif isinstance(event, LeadershipLost):
            log.warning("leadership_lost", stream=name, epoch=event.epoch, newer=event.newer_epoch)

    def _update_gauges(self, st: _Stream, machine: StreamMachine) -> None:
        live: set[str] = set()
        for sub in machine.subscriptions():
            sent = sub.last_update_sent
            if not sub.replicated or sent is None or sub.mark_delete is None:
                continue
            live.add(sub.name)
            gap = max(0, sub.mark_delete - sent.local_position)
            for region in sent.positions:
                self.metrics.set_replay_gap(st.vs.name, sub.name, region, gap)
        for gone in st.gap_series - live:
            self.metrics.forget_subscription(st.vs.name, gone)
        st.gap_series = live

    # ---- SidecarBackend -----------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._lease is not None and self._lease.is_leader

    @property
    def readiness(self) -> views.Readiness:
        return views.Readiness(
            connected=self._conn.connected,
            topology_applied=self._topology_applied,
            leadership_known=self._lease is not None and self._lease.known,
        )

    def _stream(self, stream: str) -> tuple[_Stream, StreamMachine]:
        st = self._streams.get(stream)
        if st is None:
            raise NotFound(f"stream {stream!r} is not configured (known: {sorted(self._streams)})")
        if st.machine is None:
            raise Unavailable(f"stream {stream!r} is still being rebuilt")
        return st, st.machine

    def _require_writable(self) -> None:
        if not self._conn.connected:
            raise Unavailable("not connected to NATS")
        if not self.is_leader:
            raise NotLeader()

    def _view(self, st: _Stream, sub: MachineSubscription) -> views.SubscriptionView:
        sent = sub.last_update_sent
        return views.SubscriptionView(
            stream=st.vs.name,
            subscription=sub.name,
            kind=views.SubscriptionKind(sub.kind.value),
            replicated=sub.replicated,
            mark_delete=sub.mark_delete or 0,
            mark_delete_read_unix_ms=st.positions_read_ms,
            last_snapshot_id=str(sent.snapshot_id) if sent is not None else None,
            last_snapshot_local=sent.local_position if sent is not None else 0,
            last_update_sent_unix_ms=sent.sent_ms if sent is not None else None,
            applied=tuple(
                views.AppliedUpdateView(a.from_region, str(a.snapshot_id), a.position, a.applied_ms)
                for a in sub.applied
            ),
            cached_snapshots=sub.cached,
        )

    def _subscription(self, stream: str, subscription: str) -> views.SubscriptionView:
        st, machine = self._stream(stream)
        sub = machine.subscription(subscription)
        if sub is None or not sub.exists:
            raise NotFound(f"subscription {subscription!r} of stream {stream!r} is unknown here")
        return self._view(st, sub)

    async def get_subscription(self, stream: str, subscription: str) -> views.SubscriptionView:
        return self._subscription(stream, subscription)

    async def list_subscriptions(self, stream: str) -> Sequence[views.SubscriptionView]:
        st, machine = self._stream(stream)
        return [self._view(st, s) for s in machine.subscriptions() if s.exists]

    async def list_snapshots(self, stream: str) -> Sequence[views.SnapshotView]:
        st, machine = self._stream(stream)
        return [
            views.SnapshotView(
                id=str(s.id),
                stream=st.vs.name,
                local_position=s.local_position,
                positions=dict(s.positions),
                completed_unix_ms=s.completed_ms,
                duration_ms=max(0, s.completed_ms - s.started_ms),
            )
            for s in machine.completed_snapshots()
        ]

    async def watch_subscription(
        self, stream: str, subscription: str
    ) -> AsyncGenerator[views.SubscriptionView, None]:
        st, _ = self._stream(stream)
        last = self._subscription(stream, subscription)
        yield last
        while True:
            async with st.changed:
                await st.changed.wait()
            try:
                view = self._subscription(stream, subscription)
            except NotFound:
                return
            if view != last:
                last = view
                yield view

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        st, _ = self._stream(stream)
        self._require_writable()
        if st.durables.get(subscription) is not None:
            raise InvalidArgument(
                "subscription", f"{subscription!r} is a durable consumer, not an external cursor"
            )
        assert self._cursor_store is not None
        try:
            value = await self._cursor_store.advance(stream, subscription, sequence)
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot store the cursor: {err!r}") from err
        st.cursors[subscription] = value
        position = st.trailing.known(subscription, value, st.last_seq)
        await self._submit(st, self._positions_job(st, {subscription: position}))
        return value

    async def trigger_snapshot(self, stream: str) -> str:
        """Start a snapshot now; the pending attempt's id when one is already under way."""
        st, _ = self._stream(stream)
        self._require_writable()
        now = now_ms()
        seen: list[tuple[PendingView | None, bool]] = []

        def apply(machine: StreamMachine) -> list[Output]:
            out = machine.trigger(now)
            replicated = any(s.exists and s.replicated for s in machine.subscriptions())
            seen.append((machine.pending(), replicated))
            return out

        await self._submit(st, apply)
        [(attempt, replicated)] = seen
        if attempt is not None:
            return str(attempt.id)
        if not replicated:
            raise FailedPrecondition(
                f"stream {stream!r} has no replicated subscription in region {self.region!r}: "
                "a snapshot would serve nobody (replicate a durable or commit a cursor first)"
            )
        raise NotLeader()

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> views.SubscriptionView:
        st, _ = self._stream(stream)
        self._require_writable()
        if subscription in st.cursors:
            raise InvalidArgument("subscription", "external cursors are always replicated")
        try:
            await consumers.set_replicated(
                self._conn.nc, st.vs.read_stream(self.region), subscription, replicated
            )
            positions = await self._read_positions(st)
        except NotFoundError as err:
            raise NotFound(
                f"subscription {subscription!r} of stream {stream!r} is unknown here"
            ) from err
        except ValueError as err:
            raise InvalidArgument("replicated", str(err)) from err
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot update the consumer: {err!r}") from err
        await self._submit(st, self._positions_job(st, positions))
        return self._subscription(stream, subscription)

    async def status(self) -> views.StatusView:
        streams = [await self._stream_status(st) for st in self._streams.values()]
        return views.StatusView(
            region=self.region,
            regions=tuple(self.config.regions),
            leader=self.is_leader,
            epoch=self.epoch,
            connected=self._conn.connected,
            streams=tuple(streams),
            version=sidecar.__version__,
        )

    async def _stream_status(self, st: _Stream) -> views.StreamStatusView:
        vs, machine, now = st.vs, st.machine, now_ms()
        last_completed = machine.last_completed_ms if machine is not None else None
        return views.StreamStatusView(
            stream=vs.name,
            write_stream=vs.write_stream(self.region),
            read_stream=vs.read_stream(self.region),
            last_snapshot_age_ms=now - last_completed if last_completed is not None else None,
            sources=tuple(await self._sources(st, now)),
            replicated_subscriptions=sum(
                1 for s in (machine.subscriptions() if machine else []) if s.exists and s.replicated
            ),
            snapshot_pending=machine is not None and machine.pending() is not None,
        )

    async def _sources(self, st: _Stream, now: int) -> list[views.SourceLinkView]:
        if not self._conn.connected:
            return []
        try:
            info = await consumers.api_request(
                self._conn.nc, f"STREAM.INFO.{st.vs.read_stream(self.region)}", timeout_s=2.0
            )
        except (TimeoutError, NatsError):
            return []
        links: list[views.SourceLinkView] = []
        for source in info.get("sources") or []:
            origin = st.vs.region_of_write_stream(str(source.get("name", "")))
            if origin is None:
                continue
            active_ns = int(source.get("active", -1))
            seen = st.last_marker_ms.get(origin)
            links.append(
                views.SourceLinkView(
                    origin_region=origin,
                    active="error" not in source and 0 <= active_ns < _SOURCE_ACTIVE_NS,
                    last_marker_age_ms=now - seen if seen is not None else None,
                    lag_messages=int(source.get("lag", 0)),
                )
            )
        return links


def _marker_job(seq: int, decoded: Marker | Rejected) -> Input:
    """The machine's input for one tailed marker, preceded by a tick with the time it was seen
    (the machine records the last tick's time: completions are stamped when they happen)."""
    seen_ms = now_ms()

    def apply(machine: StreamMachine) -> list[Output]:
        out = machine.tick(seen_ms)
        if isinstance(decoded, Marker):
            return out + machine.marker_seen(seq, decoded)
        return out + machine.marker_rejected(seq, decoded)

    return apply


def _consumer_config(raw: bytes) -> dict[str, Any] | None:
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    return config if isinstance(config, dict) else None
