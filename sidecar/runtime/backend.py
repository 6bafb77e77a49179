"""`RuntimeBackend`: the runtime's side of the API boundary (`sidecar.api.backend`), held by
the root (`Runtime.backend`) over the same handles and drivers, and the bring-up state it
reads the readiness from.

Reads answer from each stream driver's machine (so they work on followers too) and from
what the driver last read. Writes check the connection first, write to NATS, then hand what
they changed to the driver and wait until this replica's machine has taken it in. A cursor
commit and a change of `rsub.replicate` are NATS writes any replica can make (the leader's
machine reads them at its next positions read); a triggered snapshot needs the replica that
leads that stream (the holder of its shard's lease).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from functools import partial

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

import sidecar
from sidecar.nats import consumers
from sidecar.protocol import MachineSubscription, Output, PendingView, StreamMachine
from sidecar.protocol.leases import LeaseState
from sidecar.runtime import views
from sidecar.runtime.driver import StreamDriver
from sidecar.runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotLeader,
    Unavailable,
)
from sidecar.runtime.handles import RegionHandles

log = structlog.get_logger(__name__)

# A source link counts as active when the server heard from it this recently.
_SOURCE_ACTIVE_NS = 10 * 1_000_000_000
_STREAM_INFO_TIMEOUT_S = 2.0


@dataclass
class BringUpState:
    """How far the root's bring-up got: what the readiness reports beyond the handles."""

    topology_applied: bool
    # Once the bring-up has rebuilt every stream it started with.
    streams_rebuilt: bool = False
    # The streams rebuilt and running (each serves from then on), the bring-up's progress.
    running: set[str] = field(default_factory=set)


class RuntimeBackend:
    """Implements `sidecar.api.backend.SidecarBackend`; the root (`Runtime`) brings up and
    runs the streams it answers for, and tells it how far it got (`bring_up`)."""

    def __init__(
        self,
        regions: Sequence[str],
        handles: RegionHandles,
        drivers: dict[str, StreamDriver],
        *,
        holder: str,
        bring_up: BringUpState,
    ) -> None:
        self.region = handles.region
        # This replica's name in the leases and the members (host-pid-suffix).
        self.holder = holder
        self._regions = tuple(regions)
        self._handles = handles
        # The streams it runs: the root adds and removes those that discovery finds and drops.
        self._drivers = drivers
        self._listed = frozenset(drivers)
        self._bring_up = bring_up

    # ---- reads ----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads at least one of the streams it runs."""
        return any(self.leadership(name).leader for name in self._drivers)

    def leadership(self, stream: str) -> LeaseState:
        """Who leads `stream` as this replica sees it: its shard lease's state."""
        leases = self._handles.leases
        if leases is None:
            return LeaseState(False, 0, None)
        return leases.for_stream(stream).state

    @property
    def readiness(self) -> views.Readiness:
        leases = self._handles.leases
        return views.Readiness(
            connected=self._handles.conn.connected,
            topology_applied=self._bring_up.topology_applied,
            leadership_known=leases is not None and leases.known,
            streams_rebuilt=self._bring_up.streams_rebuilt,
            rebuilt=len(self._bring_up.running),
            streams=len(self._drivers),
        )

    async def get_subscription(self, stream: str, subscription: str) -> views.SubscriptionView:
        return self._subscription(stream, subscription)

    async def list_subscriptions(self, stream: str) -> Sequence[views.SubscriptionView]:
        driver, machine = self._driver(stream)
        return [_view(driver, s) for s in machine.subscriptions() if s.exists]

    async def list_snapshots(self, stream: str) -> Sequence[views.SnapshotView]:
        driver, machine = self._driver(stream)
        return [
            views.SnapshotView(
                id=str(s.id),
                stream=driver.vs.name,
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
        driver, _ = self._driver(stream)
        last = self._subscription(stream, subscription)
        yield last
        while True:
            async with driver.changed:
                await driver.changed.wait()
            try:
                view = self._subscription(stream, subscription)
            except NotFound:
                return
            if view != last:
                last = view
                yield view

    async def status(self) -> views.StatusView:
        # A copy: discovery may add or drop a stream while the source links are read.
        streams = [await self._stream_status(driver) for driver in list(self._drivers.values())]
        return views.StatusView(
            region=self.region,
            regions=self._regions,
            leader=any(s.leads for s in streams),
            epoch=max((s.leader_epoch for s in streams if s.leads), default=0),
            holder=self.holder,
            connected=self._handles.conn.connected,
            streams=tuple(streams),
            version=sidecar.__version__,
        )

    # ---- writes ---------------------------------------------------------------------------

    async def commit_cursor(self, stream: str, subscription: str, sequence: int) -> int:
        """Any replica: the KV compare-and-set orders concurrent writers and only moves the
        cursor forward; the answer is the value stored."""
        driver, _ = self._driver(stream)
        self._require_connected()
        if driver.subscriptions.durables.get(subscription) is not None:
            raise InvalidArgument(
                "subscription",
                f"{subscription!r} is a durable consumer, not an external cursor: commit to a "
                f"cursor of its own (create one with `rsub create-cursor {stream} NAME`)",
            )
        await self._check_cursor_value(driver, sequence)
        try:
            value = await self._handles.cursors().advance(stream, subscription, sequence)
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot store the cursor: {err!r}") from err
        position = driver.subscriptions.cursor_stored(subscription, value)
        listing = driver.subscriptions.listing({subscription: position})
        await driver.submit(partial(StreamMachine.positions_listed, listing=listing))
        return value

    async def reset_cursor(
        self, stream: str, subscription: str, sequence: int
    ) -> views.CursorResetView:
        """Any replica: set an existing external cursor to `sequence`, backwards too (an
        operator's repair of a cursor committed wrong); logged. As for `set_replicated`, the
        positions are read again and taken in before the answer."""
        driver, _ = self._driver(stream)
        self._require_connected()
        await self._check_cursor_value(driver, sequence)
        try:
            previous = await self._handles.cursors().reset(stream, subscription, sequence)
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot reset the cursor: {err!r}") from err
        if previous is None:
            durable = driver.subscriptions.durables.get(subscription) is not None
            raise NotFound(
                f"stream {stream!r} has no external cursor {subscription!r} here"
                + (" (it is a durable consumer: its position is its consumer's)" if durable else "")
            )
        log.warning(
            "cursor_reset",
            stream=stream,
            subscription=subscription,
            previous=previous,
            sequence=sequence,
            replica=self.holder,
        )
        try:
            listing = await driver.read_positions()
        except (TimeoutError, NatsError) as err:
            raise Unavailable(
                f"the cursor was reset from {previous} to {sequence}, but reading the positions "
                f"back failed: {err!r}"
            ) from err
        await driver.submit(partial(StreamMachine.positions_listed, listing=listing))
        return views.CursorResetView(stream, subscription, previous, sequence)

    async def trigger_snapshot(self, stream: str) -> str:
        """Start a snapshot now; the pending attempt's id when one is already under way."""
        driver, _ = self._driver(stream)
        self._require_connected()
        if not self.leadership(stream).leader:
            raise self._not_leader("TriggerSnapshot", stream)
        now = self._handles.clock()
        seen: list[tuple[PendingView | None, bool]] = []

        def apply(machine: StreamMachine) -> list[Output]:
            out = machine.trigger(now)
            replicated = any(s.exists and s.replicated for s in machine.subscriptions())
            seen.append((machine.pending(), replicated))
            return out

        await driver.submit(apply)
        [(attempt, replicated)] = seen
        if attempt is not None:
            return str(attempt.id)
        if not replicated:
            raise FailedPrecondition(
                f"stream {stream!r} has no replicated subscription in region {self.region!r}: "
                "a snapshot would serve nobody (replicate a durable or commit a cursor first)"
            )
        if self.leadership(stream).leader:
            # The lease is ours but the machine has not taken it in yet, or saw a newer epoch.
            raise Unavailable("leadership is changing hands in this sidecar; try again shortly")
        raise self._not_leader("TriggerSnapshot", stream)

    async def set_replicated(
        self, stream: str, subscription: str, replicated: bool
    ) -> views.SubscriptionView:
        """Any replica: it edits the durable's metadata, as `nats consumer edit` would."""
        driver, _ = self._driver(stream)
        self._require_connected()
        if subscription in driver.subscriptions.cursors:
            raise InvalidArgument("subscription", "external cursors are always replicated")
        try:
            await consumers.set_replicated(
                self._handles.port, driver.vs.read_stream(self.region), subscription, replicated
            )
            listing = await driver.read_positions()
        except NotFoundError as err:
            raise NotFound(
                f"subscription {subscription!r} of stream {stream!r} is unknown here"
            ) from err
        except ValueError as err:
            raise InvalidArgument("replicated", str(err)) from err
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot update the consumer: {err!r}") from err
        await driver.submit(partial(StreamMachine.positions_listed, listing=listing))
        return self._subscription(stream, subscription)

    # ---- helpers --------------------------------------------------------------------------

    def _driver(self, stream: str) -> tuple[StreamDriver, StreamMachine]:
        driver = self._drivers.get(stream)
        if driver is None:
            raise NotFound(f"stream {stream!r} is not run here (known: {sorted(self._drivers)})")
        if driver.machine is None:
            raise Unavailable(f"stream {stream!r} is still being rebuilt")
        return driver, driver.machine

    async def _check_cursor_value(self, driver: StreamDriver, sequence: int) -> None:
        """Refuse a cursor beyond the read stream's last sequence + 1 (`InvalidArgument`
        naming the limit): it would claim messages not written yet as consumed, and commits
        only move a cursor forward. The last sequence of the last positions read is a lower
        bound (a stream only grows at its end), so the server is asked only beyond it."""
        if sequence <= driver.subscriptions.last_seq + 1:
            return
        read_stream = driver.vs.read_stream(self.region)
        try:
            last_seq = await consumers.stream_last_seq(
                self._handles.port, read_stream, timeout_s=_STREAM_INFO_TIMEOUT_S
            )
        except (TimeoutError, NatsError) as err:
            raise Unavailable(f"cannot read where {read_stream!r} ends: {err!r}") from err
        if sequence > last_seq + 1:
            raise InvalidArgument(
                "sequence",
                f"{sequence} is beyond read stream {read_stream!r}: at most {last_seq + 1} (its "
                f"last sequence, {last_seq}, + 1)",
            )

    def _require_connected(self) -> None:
        if not self._handles.conn.connected:
            raise Unavailable("not connected to NATS")

    def _not_leader(self, method: str, stream: str) -> NotLeader:
        """The refusal of a leader-only `method` on a replica that does not lead `stream`,
        naming the stream's lease holder (a holder name begins with its host's name: the
        pod's, in Kubernetes)."""
        holder = self.leadership(stream).holder
        leader = f"its leader is {holder!r}" if holder else "no leader of it is known right now"
        return NotLeader(
            f"{method} needs the leader of stream {stream!r} in region {self.region!r}, and "
            f"this sidecar is a follower of that stream: {leader}; call that replica directly "
            "(retrying here cannot succeed)"
        )

    def _subscription(self, stream: str, subscription: str) -> views.SubscriptionView:
        driver, machine = self._driver(stream)
        sub = machine.subscription(subscription)
        if sub is None or not sub.exists:
            raise NotFound(f"subscription {subscription!r} of stream {stream!r} is unknown here")
        return _view(driver, sub)

    async def _stream_status(self, driver: StreamDriver) -> views.StreamStatusView:
        vs, machine, now = driver.vs, driver.machine, self._handles.clock()
        last_completed = machine.last_completed_ms if machine is not None else None
        subscriptions = machine.subscriptions() if machine is not None else []
        leadership = self.leadership(vs.name)
        return views.StreamStatusView(
            stream=vs.name,
            write_stream=vs.write_stream(self.region),
            read_stream=vs.read_stream(self.region),
            last_snapshot_age_ms=now - last_completed if last_completed is not None else None,
            sources=tuple(await self._sources(driver, now)),
            replicated_subscriptions=sum(1 for s in subscriptions if s.exists and s.replicated),
            snapshot_pending=machine is not None and machine.pending() is not None,
            leader_holder=leadership.holder,
            leader_epoch=leadership.leader_epoch,
            leads=leadership.leader,
            discovered=vs.name not in self._listed,
            rebuilding=vs.name not in self._bring_up.running,
        )

    async def _sources(self, driver: StreamDriver, now: int) -> list[views.SourceLinkView]:
        """The read stream's source links as the server reports them (none while offline)."""
        handles, vs = self._handles, driver.vs
        if not handles.conn.connected:
            return []
        try:
            info = await handles.port.stream_info(
                vs.read_stream(self.region), timeout_s=_STREAM_INFO_TIMEOUT_S
            )
        except (TimeoutError, NatsError):
            return []
        links: list[views.SourceLinkView] = []
        for source in info.get("sources") or []:
            origin = vs.region_of_write_stream(str(source.get("name", "")))
            if origin is None:
                continue
            active_ns = int(source.get("active", -1))
            links.append(
                views.SourceLinkView(
                    origin_region=origin,
                    active="error" not in source and 0 <= active_ns < _SOURCE_ACTIVE_NS,
                    last_marker_age_ms=driver.observer.last_marker_age_ms(origin, now),
                    lag_messages=int(source.get("lag", 0)),
                )
            )
        return links


def _view(driver: StreamDriver, sub: MachineSubscription) -> views.SubscriptionView:
    sent = sub.last_update_sent
    # An update carries a progress vector, a snapshot, or both (`SentUpdate`).
    snapshot_id = sent.snapshot_id if sent is not None else None
    return views.SubscriptionView(
        stream=driver.vs.name,
        subscription=sub.name,
        kind=sub.kind,
        replicated=sub.replicated,
        mark_delete=sub.mark_delete or 0,
        mark_delete_read_unix_ms=driver.subscriptions.read_ms,
        last_snapshot_id=str(snapshot_id) if snapshot_id is not None else None,
        last_snapshot_local=sent.local_position if sent is not None else 0,
        last_update_sent_unix_ms=sent.sent_ms if sent is not None else None,
        applied=tuple(
            views.AppliedUpdateView(a.from_region, str(a.snapshot_id), a.position, a.applied_ms)
            for a in sub.applied
        ),
        cached_snapshots=sub.cached,
        progress=dict(sub.progress),
        failover_exposure=sub.exposure,
        progress_sent=dict(sent.progress) if sent is not None else {},
        progress_sent_position=sent.progress_position if sent is not None else 0,
        receives_markers=sub.name in driver.subscriptions.receiving_markers,
        consumed_in=sub.consumed_in,
        acked=sub.acked,
    )
