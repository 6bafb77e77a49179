"""`StreamMachine`: the PIP-33 protocol for one (region, virtual stream), events in, outputs out.

See the package docstring (`sidecar.protocol`) for the API contract.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sidecar.protocol.cache import SnapshotCache
from sidecar.protocol.inputs import Acks, MachineConfig, PositionsListing, SubscriptionInfo
from sidecar.protocol.markers import (
    MAX_ACKED_RANGES,
    Marker,
    Ranges,
    Rejected,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    StoredMarker,
    SubscriptionKind,
    Update,
    read_stored,
)
from sidecar.protocol.origins import DataEntry, OriginIndex
from sidecar.protocol.outputs import (
    CreateConsumer,
    CreateCursor,
    FailbackHeld,
    FailbackReleased,
    HoldConsumer,
    IgnoreReason,
    LeadershipLost,
    MarkerIgnored,
    MarkerRead,
    MarkerRejected,
    MoveConsumer,
    MoveCursor,
    Output,
    PublishLocal,
    PublishReplicated,
    ReadPositions,
    ReadReason,
    ReleaseConsumer,
    SnapshotCompleted,
    SnapshotStarted,
    SnapshotTimedOut,
    SubscriptionAction,
    UpdateApplied,
    UpdateSent,
)
from sidecar.protocol.views import (
    AppliedUpdate,
    MachineSubscription,
    Needs,
    PendingView,
    SentUpdate,
    SubscriptionGauges,
)

# Reads a follower asks for too: it answers the API from them.
_EVERY_REPLICA = (ReadReason.SWEEP, ReadReason.RETRY)
# Read sequences acked above a durable's floor that a leader keeps (ten times the ranges an
# update carries: acks in order fold into few ranges).
_MAX_ACKED_SEQS = 10 * MAX_ACKED_RANGES

# A stream's first leader is elected this soon after its creation at most (the failback
# guard, docs/protocol.md §7): 66 to 153 ms on local servers (bench/bench_first_leader.py),
# more than ten times that; a return's leader comes later (the region lost, then restarted).
_FIRST_LEADER_MS = 2_000


def _first_leader(leader_age_ms: int | None, stream_age_ms: int | None) -> bool:
    """Whether the read stream's current leader was elected with the stream (within
    `_FIRST_LEADER_MS` of its creation): a fresh stream, no region's return. A leader of
    unknown age counts as elected now (as the guard takes it), so such a stream is fresh only
    within `_FIRST_LEADER_MS` of its creation; an unknown creation decides nothing."""
    if stream_age_ms is None:
        return False
    return stream_age_ms - (leader_age_ms or 0) < _FIRST_LEADER_MS


# ---- internal state -----------------------------------------------------------------------


@dataclass(slots=True)
class _Attempt:
    id: SnapshotId
    start_seq: int
    started_ms: int
    round: int
    waiting: set[str]
    positions: dict[str, int] = field(default_factory=dict)
    local_max: int = 0
    own_seen_round: int = 0
    catch_up: bool = False


@dataclass(slots=True)
class _Return:
    """This region returned (the failback guard, docs/protocol.md §7)."""

    since_ms: int
    waiting: set[str]  # the regions that have not answered a catch-up request yet
    held: set[str]  # the durables held
    ids: set[SnapshotId] = field(default_factory=set)  # the catch-up requests' snapshots
    # Per held durable, where the progress merged by the first positions read after every
    # region answered called for it: once there, no new move is asked for it before the
    # release (a region still consuming would ask for one at every read).
    needed: dict[str, int] = field(default_factory=dict)
    # The highest read-stream sequence known to hold data when the last answer counted was
    # read: the data the answering regions' updates call for lies at or below it, so the
    # origin index must reach it before the positions it gives are final.
    data_high: int = 0
    answered_ms: int = 0  # when the last answer counted was read


@dataclass(slots=True)
class _Sub:
    info: SubscriptionInfo
    cache: SnapshotCache[Snapshot]
    exists: bool = True  # as listed, or created by an action reported done
    mark_delete: int | None = None  # as read, or as a move or creation reported done left it
    moving: bool = False  # a move or creation asked for, its outcome not reported yet
    last_sent: Update | None = None  # the query's `SentUpdate` is built from it when asked
    sent_ms: int = 0
    target: int | None = None  # position an applied update asks for, not yet carried out
    progress: dict[str, int] = field(default_factory=dict)  # merged vectors received
    exposure: int | None = None
    # When each region's consumers last passed its data (this one's from positions reads,
    # the others' from their updates), and whether this region's next update says so.
    consumed_ms: dict[str, int] = field(default_factory=dict)
    consumed_unsent: bool = False
    moved_to: int = 0  # the furthest a move or creation this machine asked for may leave it
    # Read sequences its applications acked here above `mark_delete` (as leader), and the
    # acked ranges each other region sent last (§6).
    acked_above: set[int] = field(default_factory=set)
    acked_from: dict[str, Mapping[str, Ranges]] = field(default_factory=dict)


class StreamMachine:
    """PIP-33 for one (region, virtual stream); see `sidecar.protocol` for the contract."""

    def __init__(self, config: MachineConfig) -> None:
        self.config = config
        self._region = config.region
        self._others = tuple(r for r in config.regions if r != config.region)
        self._now = 0
        self._leader = False
        self._epoch = 0
        self._counter = 0
        self._max_epoch: dict[str, int] = {}
        self._last_seq = 0
        self._last_marker_seq = 0
        self._data_high = 0  # an upper bound of a read-stream seq known to hold data
        self._baseline = 0  # data at or below it is covered by the last completed snapshot
        self._next_start_ms = 0
        self._pending: _Attempt | None = None
        self._answered: dict[str, tuple[SnapshotId, int]] = {}
        self._completed: deque[Snapshot] = deque(maxlen=config.history_size)
        self._last_completed_id: SnapshotId | None = None
        self._own_max_id: SnapshotId | None = None  # highest own snapshot id seen in markers
        self._subs: dict[str, _Sub] = {}
        # Per subscription and origin: the last update applied (snapshot id, position here,
        # when); the query's `AppliedUpdate` is built from it when asked.
        self._applied: dict[str, dict[str, tuple[SnapshotId, int, int]]] = {}
        self._index = OriginIndex()
        # Positions reads (`ReadPositions`): creations asked for so far (a listing begun
        # before one may lack it), one read out at most, the reason for the next.
        self._generation = 0
        self._read_out = False
        self._read_wanted: ReadReason | None = None
        self._read_last_seq = 0  # the read stream's end as of the last read
        self._follows_end = True  # whether a position followed that end (`PositionsListing`)
        # The failback guard (docs/protocol.md §7): a leader's first listing tells whether this
        # region returned; answers owed to returning regions wait for a positions read.
        self._first_listing = False
        self._return: _Return | None = None
        # Consumption signs (§8) compare a read with the positions known before it, which
        # must have been read wholly under this leadership too: none yet when it begins.
        self._baseline_held = False
        self._owed: list[Response] = []
        self._active_until = 0  # when the last region counting as consuming stops counting
        self._first_seq = 0  # the read stream's first sequence as last read (listing, move)

    @classmethod
    def restore(
        cls,
        config: MachineConfig,
        markers: Iterable[StoredMarker],
        subscriptions: Mapping[str, SubscriptionInfo],
        positions: Mapping[str, int],
        read_last_seq: int,
        now_ms: int,
        data: Iterable[DataEntry] = (),
    ) -> tuple[StreamMachine, list[MarkerRead | MarkerRejected]]:
        """A follower rebuilt from the read stream: its data messages' origins, the markers
        stored in it, and current positions. With it, what was read of the markers
        (`MarkerRead`, `MarkerRejected`): what the replay derived again is not news."""
        machine = cls(config)
        machine.tick(now_ms)
        machine.data_indexed(data)
        machine.subscriptions_changed(subscriptions)
        read: list[MarkerRead | MarkerRejected] = []
        for stored in markers:
            outputs = machine.marker_read(stored, now_ms)
            read.extend(o for o in outputs if isinstance(o, MarkerRead | MarkerRejected))
        # A replayed sign of consumption is not news: a marker carries no time, and the
        # region may have stopped long ago (docs/protocol.md §8). It counts again from the
        # next update read live.
        for sub in machine._subs.values():
            sub.consumed_ms.clear()
        machine._active_until = 0
        machine.positions_read(positions, read_last_seq)
        return machine, read

    # ---- inputs ---------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Output]:
        self._now = max(self._now, now_ms)
        if not self._leader:
            return []
        out: list[Output] = []
        held = self._return
        if held is not None and self._now - held.since_ms >= self.config.hold_ms:
            out.extend(self._release(sorted(held.held)))
        attempt = self._pending
        if attempt is not None and self._now - attempt.started_ms >= self._timeout_ms(attempt):
            self._pending = None
            out.extend(self._timed_out(attempt))
        if self._pending is None and self._now >= self._next_start_ms and self._should_start():
            out.extend(self._start())
        return out

    def trigger(self, now_ms: int) -> list[Output]:
        """Start a snapshot now (an operator's request): a `tick` that also starts one when the
        interval has not passed or no new data arrived. Still nothing starts on a follower,
        without a replicated subscription, or while an attempt is pending (`pending()`)."""
        out = self.tick(now_ms)
        if self._leader and self._pending is None and self._has_replicated():
            out.extend(self._start())
        return out

    def read_stream_advanced(self, last_seq: int) -> list[Output]:
        self._last_seq = max(self._last_seq, last_seq)
        return []

    def data_indexed(self, entries: Iterable[DataEntry]) -> list[Output]:
        """Data messages of the read stream, in order, with their origins (`origins.DataEntry`:
        from `Nats-Stream-Source`); ones already given (a replay) are skipped."""
        self._index.add(entries)
        return []

    def positions_read(self, positions: Mapping[str, int], read_last_seq: int) -> list[Output]:
        """Mark-delete positions (effective ack floors / external cursors) of local subscriptions."""
        self._last_seq = max(self._last_seq, read_last_seq)
        self._read_last_seq = read_last_seq
        out: list[Output] = []
        for name, position in positions.items():
            sub = self._subs.get(name)
            if sub is None or not sub.exists:
                continue
            sub.mark_delete = position
            self._reconcile(name, sub, out)
            self._maybe_send_update(name, sub, out)
            if sub.progress:
                sub.exposure = self._index.covered_above(sub.mark_delete, sub.progress)
        self._trim_index()
        return out

    def interval(
        self, now_ms: int, last_seq: int, *, moved: bool = False, sweep: bool = False
    ) -> list[Output]:
        """One interval of the runtime's loop: the read stream's end as its tails saw it,
        whether a signal said positions moved since the last one (`Needs.signals`), and
        whether it is this stream's turn in the sweep. A `tick`, then a `ReadPositions` when
        a read is wanted and none is out: at most one read per interval, so a signal during
        a read waits for the next interval, and a burst of signals costs one read.

        Safety does not rest on when positions are read: the machine only ever gets them as
        read from the server, so a read skipped or late only delays an update; it never
        hands over a position the subscription has not reached.
        """
        self.read_stream_advanced(last_seq)
        out = self.tick(now_ms)
        if moved:
            self._want_read(ReadReason.SIGNAL)
        if sweep:
            self._want_read(ReadReason.SWEEP)
        if self._read_out:
            return out
        reason = self._read_wanted
        if reason is None and self._leader and self._grew():
            reason = ReadReason.GREW
        if reason is not None:
            self._read_wanted = None
            self._read_out = True
            out.append(ReadPositions(reason))
        return out

    def read_done(self, listing: PositionsListing) -> list[Output]:
        """The read asked for by `ReadPositions`, as listed (`positions_listed`)."""
        self._read_out = False
        return self.positions_listed(listing)

    def read_failed(self) -> list[Output]:
        """The read asked for by `ReadPositions` failed: asked for again at the next interval."""
        self._read_out = False
        self._want_read(ReadReason.RETRY)
        return []

    def positions_listed(self, listing: PositionsListing) -> list[Output]:
        """One read of the subscriptions and their positions: the set of subscriptions (unless
        the read began before a creation asked for since: it would take the one created for
        deleted and forget what it holds for it, updates received and sent; the next read has
        it), then the positions."""
        # Before anything below asks for a move. Only a read wholly under this machine's
        # epoch is a sign, and only against one that was too (a leader's first such read is
        # its baseline: from a follower's reads, or one begun before it led, the moves of the
        # leader before it look like consumption; so do another replica's after it lost the
        # lease, read by a replica woken from a pause before it hears of the loss).
        self._first_seq = max(self._first_seq, listing.first_seq)
        held = self._leader and self._held(listing.lease_epoch)
        if held and self._baseline_held and not self._away(listing.read_ms):
            for name, position in listing.positions.items():
                sub = self._subs.get(name)
                if sub is not None and sub.exists and self._consumed_here(sub, position):
                    self._signed(sub)
        self._baseline_held = held
        self._place(listing.positions)
        out: list[Output] = []
        if listing.generation == self._generation:
            out = self.subscriptions_changed(listing.subscriptions)
        if self._leader:  # a durable listed for the first time included
            self._take_acks(listing.acked)
        self._follows_end = listing.follows_end
        if self._first_listing and self._leader:
            self._first_listing = False
            out += self._check_return(listing)
        out += self.positions_read(listing.positions, listing.last_seq)
        if self._leader:
            out += self._answer_catch_ups()
            out += self._end_holds()
        return out

    def _place(self, positions: Mapping[str, int]) -> None:
        """The listed positions of the durables the failback guard holds, taken before the
        listing's set of subscriptions reconciles them. Judged from where its last move left
        it, a held durable the read lists where the progress called for it once every region
        answered (its floor followed the read stream's removals past that move) was asked
        another move and stayed held (`make soak` seed 9746887200, docs/protocol.md §7)."""
        held = self._return
        for name in held.held if held is not None else ():
            sub, position = self._subs.get(name), positions.get(name)
            if sub is not None and sub.exists and position is not None:
                sub.mark_delete = position

    def marker_read(self, stored: StoredMarker, now_ms: int) -> list[Output]:
        """A message read from this region's read stream on the marker subjects (tail order),
        at `now_ms`: decoded, its writer checked against its subject (`read_stored`), between
        two ticks at that time. The first stamps what the marker completes with the time it
        was read; the second starts the next snapshot at once when the marker completed one
        later than an interval after it started (else it would wait for the next interval)."""
        decoded = read_stored(stored, stream=self.config.stream, regions=self.config.regions)
        out = self.tick(now_ms)
        if isinstance(decoded, Marker):
            out.append(MarkerRead(stored.seq, decoded.region))
            out += self.marker_seen(stored.seq, decoded)
        else:
            out += self.marker_rejected(stored.seq, decoded)
        return out + self.tick(now_ms)

    def action_done(
        self,
        action: SubscriptionAction,
        mark_delete: int,
        done_ms: int = 0,
        *,
        first_seq: int = 0,
        lease_epoch: int | None = None,
    ) -> list[Output]:
        """The runtime carried out a move or creation this machine asked for; `mark_delete`
        is the subscription's position as the runtime read it back (below `ack_floor` when
        the runtime left a consumer alone that had delivered up to it already), at `done_ms`
        on the machine's clock (0: not known), `first_seq` the read stream's first
        sequence read after it (0: not known): a purge or the stream's limits move the floor
        to `first_seq - 1` at most, which is no consumption (docs/protocol.md §8), and
        `lease_epoch` the epoch this replica's lease held when the position was read back
        (0: none; None: not known; the runtime carries an action out only under the
        machine's epoch, so the same one then held throughout)."""
        sub = self._subs.get(action.subscription)
        if sub is None:
            return []
        sub.moving = False
        sub.exists = True
        self._first_seq = max(self._first_seq, first_seq)
        if (
            self._leader
            and self._baseline_held
            and self._held(lease_epoch)
            and not self._away(done_ms)
            and self._consumed_here(sub, mark_delete)
        ):
            # Read back beyond the move's target over data: its consumers passed it while
            # the move was under way (taken as is, the next read would not see it).
            self._signed(sub)
        if sub.mark_delete is None or mark_delete > sub.mark_delete:
            sub.mark_delete = mark_delete
        if sub.target is not None and sub.target <= action.ack_floor:
            sub.target = None
        if mark_delete >= action.ack_floor:
            # It moved: where it stands now, read at the next interval. One left alone
            # (delivered up to the position already, or none of its messages before it)
            # did not move: its acks signal when it does, and a read now would only ask for
            # the same move again, every interval.
            self._want_read(ReadReason.OUTCOME)
        return []

    def action_failed(self, action: SubscriptionAction) -> list[Output]:
        """A move or creation this machine asked for was not carried out (failed, or dropped
        by a replica that no longer leads): it is asked for again at the next positions read
        (or leadership), the position reported stays where it was."""
        sub = self._subs.get(action.subscription)
        if sub is not None:
            sub.moving = False
        self._want_read(ReadReason.OUTCOME)
        return []

    def subscriptions_changed(self, subscriptions: Mapping[str, SubscriptionInfo]) -> list[Output]:
        """The full set of local subscriptions of this stream. One known only from updates
        (not created yet: its creation failed or was not asked for yet) is kept, and its
        creation asked for again."""
        for name in [n for n, s in self._subs.items() if s.exists and n not in subscriptions]:
            del self._subs[name]
        out: list[Output] = []
        for name, info in subscriptions.items():
            sub = self._subs.get(name)
            if sub is None:
                sub = self._subs[name] = _Sub(info, SnapshotCache(self.config.cache_size))
                if info.replicated:
                    for snapshot in self._completed:
                        sub.cache.add(snapshot.local_position, snapshot)
            else:
                if sub.info.replicated and not info.replicated:
                    sub.cache = SnapshotCache(self.config.cache_size)
                sub.info = info
                sub.exists = True
            self._reconcile(name, sub, out)
        for name, sub in self._subs.items():
            if name not in subscriptions:  # absent here: create it (retried at every read)
                self._reconcile(name, sub, out)
        return out

    def became_leader(self, epoch: int) -> list[Output]:
        """`epoch` must be fresh for this leadership term (a lease revision)."""
        if epoch < self._max_epoch.get(self._region, 0):
            raise ValueError(
                f"epoch {epoch} of region {self._region} is older than the seen "
                f"{self._max_epoch[self._region]}"
            )
        # Never reuse an id, even when an epoch is handed out again (same term, or a
        # restarted sidecar whose markers with this epoch are already in the stream).
        counter = self._counter if epoch == self._epoch else 0
        seen = self._own_max_id
        if seen is not None and seen.epoch == epoch:
            counter = max(counter, seen.counter)
        self._leader = True
        self._epoch = epoch
        self._max_epoch[self._region] = epoch
        self._counter = counter
        self._pending = None
        self._next_start_ms = self._now
        self._first_listing = True
        self._baseline_held = False
        self._want_read(ReadReason.LEADERSHIP)
        out: list[Output] = []
        for name, sub in self._subs.items():
            sub.moving = False  # an action of an earlier term that was never reported
            self._reconcile(name, sub, out)
            self._maybe_send_update(name, sub, out)
        return out

    def became_follower(self) -> list[Output]:
        """A hold in progress is left standing (its pause lapses at `HoldConsumer.hold_ms`):
        the leader after this one decides from its own first listing, and takes over a pause
        it finds standing (`_adopt`). A consumption sign not yet sent
        is dropped: it goes out only in the term that took it, a later term taking its
        signs from its own baseline (shell simulation, seed 31 of `make soak` seed
        161639543428's parameters: a leader froze before its next update, lost its lease,
        led again and sent the 4 s old sign)."""
        self._leader = False
        self._pending = None
        self._first_listing = False
        self._baseline_held = False
        self._return = None
        self._owed.clear()
        for sub in self._subs.values():
            sub.consumed_unsent = False
        return []

    def marker_rejected(self, read_seq: int, rejected: Rejected) -> list[Output]:
        """A message on the marker subjects that `decode` rejected (still a marker seq)."""
        self._note_marker_seq(read_seq)
        return [MarkerRejected(read_seq, rejected)]

    def marker_seen(self, read_seq: int, marker: Marker) -> list[Output]:
        """A decoded marker at `read_seq` in this region's read stream (tail order)."""
        self._note_marker_seq(read_seq)
        region = marker.region
        seen = self._max_epoch.get(region, 0)
        if marker.epoch < seen:
            return [
                MarkerIgnored(
                    IgnoreReason.STALE_EPOCH, region, f"epoch {marker.epoch} < seen {seen}"
                )
            ]
        out: list[Output] = []
        if marker.epoch > seen:
            self._max_epoch[region] = marker.epoch
            if region == self._region and self._leader:
                out.append(LeadershipLost(self._epoch, marker.epoch))
                self.became_follower()
        body = marker.body
        if region == self._region:
            sid = body.snapshot_id if isinstance(body, Update) else body.id
            if sid is not None and (self._own_max_id is None or sid > self._own_max_id):
                self._own_max_id = sid
        if type(body) is Request:
            if region == self._region:
                attempt = self._pending
                if attempt is not None and body.id == attempt.id:
                    self._own_request_seen(attempt, body.round, read_seq)
                    out.extend(self._progress(attempt))
            elif self._leader:
                out.extend(self._respond(region, body, read_seq))
        elif type(body) is Response:
            if body.id.region == self._region:
                out.extend(self._on_response(region, body, read_seq))
        elif type(body) is Update:
            if region == self._region:
                self._own_update_seen(body)
            else:
                out.extend(self._on_update(region, body))
        elif type(body) is Snapshot:
            if region != self._region:
                out.append(MarkerIgnored(IgnoreReason.NOT_LOCAL, region, f"snapshot {body.id}"))
            elif self._last_completed_id is None or body.id > self._last_completed_id:
                self._record_snapshot(body)
                self._baseline = max(self._baseline, body.local_position)
        return out

    # ---- queries --------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def generation(self) -> int:
        """Creations asked for so far (a `PositionsListing` carries it from its start)."""
        return self._generation

    def needs(self) -> Needs:
        """When the next `interval` is wanted, and whether signals matter (`Needs`)."""
        due: int | None = None
        if self._leader:
            attempt = self._pending
            if attempt is not None:
                due = attempt.started_ms + self._timeout_ms(attempt)
            elif self._should_start():
                due = self._next_start_ms
            held = self._return
            if held is not None:
                expiry = held.since_ms + self.config.hold_ms
                due = expiry if due is None else min(due, expiry)
        active = self._next_expiry()
        if active is not None:
            due = active if due is None else min(due, active)
        wanted = self._read_wanted is not None or (self._leader and self._grew())
        if wanted and not self._read_out:
            due = self._now if due is None else min(due, self._now)
        return Needs(due, self._leader)

    @property
    def held(self) -> int:
        """Durables the failback guard holds now (docs/protocol.md §7)."""
        return len(self._return.held) if self._return is not None else 0

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def origin_index_runs(self) -> int:
        """Runs held by the origin index (24 bytes each, `origins.OriginIndex`)."""
        return self._index.runs

    @property
    def last_completed_ms(self) -> int | None:
        return self._completed[-1].completed_ms if self._completed else None

    def completed_snapshots(self) -> list[Snapshot]:
        return list(self._completed)

    def pending(self) -> PendingView | None:
        a = self._pending
        if a is None:
            return None
        return PendingView(a.id, a.round, a.started_ms, tuple(sorted(a.waiting)))

    def subscription(self, name: str) -> MachineSubscription | None:
        sub = self._subs.get(name)
        if sub is None:
            return None
        u = sub.last_sent
        sent = None
        if u is not None:
            sent = SentUpdate(
                u.snapshot_id,
                u.local_position,
                u.positions,
                sub.sent_ms,
                u.progress,
                u.progress_position,
            )
        applied = self._applied.get(name, {})
        return MachineSubscription(
            name,
            sub.info.kind,
            sub.info.replicated,
            sub.exists,
            sub.mark_delete,
            sent,
            tuple(AppliedUpdate(o, sid, p, ms) for o, (sid, p, ms) in applied.items()),
            len(sub.cache),
            dict(sub.progress),
            sub.exposure,
            self._consumed_in(sub),
            self._acked_elsewhere(sub),
        )

    def subscriptions(self) -> list[MachineSubscription]:
        return [v for n in sorted(self._subs) if (v := self.subscription(n)) is not None]

    def gauges(self) -> Iterator[SubscriptionGauges]:
        """Per subscription, only what its gauges show: read every interval of every stream,
        it builds none of `subscription`'s copies."""
        for name, sub in self._subs.items():
            sent = sub.last_sent
            if sub.info.replicated and sent is not None and sub.mark_delete is not None:
                gap = max(0, sub.mark_delete - sent.local_position)
                yield SubscriptionGauges(
                    name, sub.exposure, gap, tuple(sent.positions), len(self._consumed_in(sub))
                )
            else:
                yield SubscriptionGauges(name, sub.exposure, None, (), len(self._consumed_in(sub)))

    # ---- overridable steps (the simulator's broken variants replace these) -----------------

    def _response_position(self, read_seq: int) -> int:
        """Where the request landed: never the read stream's last sequence."""
        return read_seq

    def _rounds(self) -> int:
        return 1 if len(self._others) <= 1 else 2

    def _vector_at(self, mark_delete: int) -> dict[str, int]:
        """The progress vector at `mark_delete` (DESIGN §7): never above it."""
        return self._index.vector_at(mark_delete)

    def _position_for(self, progress: Mapping[str, int], after: int) -> int | None:
        """How far past `after` every data message is covered by `progress`."""
        return self._index.position_for(progress, after)

    def _trim_index(self) -> None:
        """Forget origins below every replicated subscription's mark-delete: no vector is read
        below it (`_maybe_send_update` checks), and no move goes back past it."""
        lowest = self._index.indexed_through
        for sub in self._subs.values():
            if sub.exists and sub.info.replicated:
                if sub.mark_delete is None:
                    return
                lowest = min(lowest, sub.mark_delete)
        self._index.trim(lowest)

    def _asked(self, sub: _Sub, action: SubscriptionAction) -> None:
        """A move or creation was just asked for: in flight until its outcome is reported.
        Neither the position nor the existence changes before (`action_done`)."""
        sub.moving = True

    def _own_request_seen(self, attempt: _Attempt, round_: int, read_seq: int) -> None:
        attempt.local_max = max(attempt.local_max, read_seq)
        attempt.own_seen_round = max(attempt.own_seen_round, round_)

    def _timeout_ms(self, attempt: _Attempt) -> int:
        """A catch-up request may be lost with the write stream's messages it expired with
        before sourcing resumed: asked again after the activity window."""
        if attempt.catch_up:
            return min(self.config.timeout_ms, self.config.active_window_ms)
        return self.config.timeout_ms

    def _timed_out(self, attempt: _Attempt) -> list[Output]:
        return [SnapshotTimedOut(attempt.id, attempt.round, tuple(sorted(attempt.waiting)))]

    # ---- requester ------------------------------------------------------------------------

    def _has_replicated(self) -> bool:
        return any(s.exists and s.info.replicated for s in self._subs.values())

    def _should_start(self) -> bool:
        if not self._has_replicated():
            return False
        if self._return is not None and self._return.waiting:
            return True  # catch-up requests, until every region answered one
        data_high = self._data_high
        if self._last_seq > self._last_marker_seq:
            data_high = self._last_seq
        return data_high > self._baseline

    def _start(self) -> list[Output]:
        self._counter += 1
        sid = SnapshotId(self._region, self._epoch, self._counter)
        held = self._return
        catch_up = held is not None and bool(held.waiting)
        if held is not None and catch_up:
            held.ids.add(sid)
        self._pending = _Attempt(
            sid, self._last_seq, self._now, 1, set(self._others), catch_up=catch_up
        )
        self._next_start_ms = self._now + self.config.interval_ms
        return [SnapshotStarted(sid, self._now), self._publish(Request(sid, 1, catch_up))]

    def _on_response(self, responder: str, body: Response, read_seq: int) -> list[Output]:
        held = self._return
        if held is not None and body.id in held.ids and responder in held.waiting:
            # Every update `responder` wrote before this answer has been read (origin order),
            # and the data before it lies at or below `_data_high` (gaps between markers).
            held.waiting.discard(responder)
            held.data_high = max(held.data_high, self._data_high)
            held.answered_ms = self._now
            if not held.waiting:
                self._want_read(ReadReason.CATCH_UP)
        attempt = self._pending
        if attempt is None or body.id != attempt.id:
            return [MarkerIgnored(IgnoreReason.LATE_RESPONSE, responder, f"snapshot {body.id}")]
        if body.round != attempt.round or responder not in attempt.waiting:
            return [
                MarkerIgnored(
                    IgnoreReason.DUPLICATE, responder, f"snapshot {body.id} round {body.round}"
                )
            ]
        attempt.waiting.discard(responder)
        if body.round == 1:
            attempt.positions[responder] = body.position
        attempt.local_max = max(attempt.local_max, read_seq)
        return self._progress(attempt)

    def _progress(self, attempt: _Attempt) -> list[Output]:
        if attempt.waiting or not self._leader:
            return []
        if attempt.round < self._rounds():
            attempt.round += 1
            attempt.waiting = set(self._others)
            return [self._publish(Request(attempt.id, attempt.round, attempt.catch_up))]
        if attempt.own_seen_round < attempt.round:
            return []
        return self._complete(attempt)

    def _complete(self, attempt: _Attempt) -> list[Output]:
        self._pending = None
        self._baseline = max(self._baseline, attempt.start_seq)
        snapshot = Snapshot(
            attempt.id, attempt.local_max, dict(attempt.positions), attempt.started_ms, self._now
        )
        out: list[Output] = [
            PublishLocal(Marker(self._region, self.config.stream, self._epoch, snapshot)),
            SnapshotCompleted(snapshot, self._now - attempt.started_ms),
        ]
        self._record_snapshot(snapshot)
        for name, sub in self._subs.items():
            self._maybe_send_update(name, sub, out)
        return out

    def _record_snapshot(self, snapshot: Snapshot) -> None:
        self._completed.append(snapshot)
        self._last_completed_id = snapshot.id
        for sub in self._subs.values():
            if not sub.info.replicated:
                continue
            sent = sub.last_sent
            if sent is None or snapshot.local_position > sent.local_position:
                sub.cache.add(snapshot.local_position, snapshot)

    def _maybe_send_update(
        self, name: str, sub: _Sub, out: list[Output], *, now: bool = False
    ) -> None:
        """Send an update when `sub` passed a newer snapshot, or its vector changed (at most
        once per interval, unless `now`)."""
        if not self._leader or not sub.info.replicated or sub.mark_delete is None:
            return
        mark_delete, sent = sub.mark_delete, sub.last_sent
        snapshot = sub.cache.advance(mark_delete)
        if snapshot is not None and sent is not None and sent.snapshot_id is not None:
            snapshot = snapshot if snapshot.local_position > sent.local_position else None
        sent_progress = sent.progress if sent is not None else {}
        sent_acked = sent.acked if sent is not None else {}
        # A vector read below the trim point could name messages above `mark_delete`.
        readable = self.config.progress and mark_delete >= self._index.trimmed_through
        progress = self._vector_at(mark_delete) if readable else {}
        acked = self._acked_ranges(sub, mark_delete) if progress else {}
        # A changed vector goes out at most once per progress interval (a snapshot carries it
        # at once).
        due = now or sent is None or self._now - sub.sent_ms >= self.config.vector_interval_ms
        changed = progress != sent_progress or acked != sent_acked
        if snapshot is None and not (progress and changed and due):
            return
        sid: SnapshotId | None = None
        local, positions = 0, {}  # type: tuple[int, Mapping[str, int]]
        if snapshot is not None:
            sid, local, positions = snapshot.id, snapshot.local_position, snapshot.positions
        elif sent is not None:
            sid, local, positions = sent.snapshot_id, sent.local_position, sent.positions
        at = mark_delete
        if not progress:
            progress, at = dict(sent_progress), sent.progress_position if sent is not None else 0
            acked = dict(sent_acked)
        consuming, sub.consumed_unsent = sub.consumed_unsent, False
        update = Update(
            name,
            sub.info.kind,
            sid,
            local,
            positions,
            sub.info.config,
            progress,
            at,
            consuming,
            acked,
        )
        sub.last_sent, sub.sent_ms = update, self._now
        out.append(self._publish(update))
        out.append(UpdateSent(name, sid, positions, progress))

    def _own_update_seen(self, body: Update) -> None:
        sub = self._subs.get(body.subscription)
        if sub is None:
            return
        sent = sub.last_sent
        newer_snapshot = body.snapshot_id is not None and (
            sent is None or sent.snapshot_id is None or body.local_position > sent.local_position
        )
        newer_progress = body.progress_position > (sent.progress_position if sent else 0)
        if sent is None or newer_snapshot or newer_progress:
            sub.last_sent, sub.sent_ms = body, self._now
            if body.snapshot_id is not None:
                sub.cache.advance(body.local_position)

    # ---- responder and receiver -----------------------------------------------------------

    def _respond(self, requester: str, body: Request, read_seq: int) -> list[Output]:
        key = (body.id, body.round)
        last = self._answered.get(requester)
        if last is not None and key <= last:
            return [
                MarkerIgnored(
                    IgnoreReason.DUPLICATE, requester, f"request {body.id} round {body.round}"
                )
            ]
        self._answered[requester] = key
        response = Response(body.id, body.round, self._response_position(read_seq))
        if body.catch_up and self.config.progress:
            # Answered after the next positions read, behind the progress read then.
            self._owed.append(response)
            self._want_read(ReadReason.CATCH_UP)
            return []
        return [self._publish(response)]

    def _on_update(self, origin: str, body: Update) -> list[Output]:
        name = body.subscription
        sub = self._subs.get(name)
        if sub is not None and not sub.info.replicated:
            return [MarkerIgnored(IgnoreReason.NOT_REPLICATED, origin, f"update of {name}")]
        if body.consuming and sub is not None:
            self._consumed(sub, origin)
        sid = body.snapshot_id
        position = body.positions.get(self._region) if sid is not None else None
        applied = self._applied.setdefault(name, {})
        previous = applied.get(origin)
        ignored: MarkerIgnored | None = None
        if sid is None:
            pass
        elif position is None:
            ignored = MarkerIgnored(IgnoreReason.NOT_NAMED, origin, f"update of {name}")
        elif previous is not None and sid <= previous[0]:
            reason = IgnoreReason.DUPLICATE if sid == previous[0] else IgnoreReason.OLDER_UPDATE
            ignored = MarkerIgnored(reason, origin, f"update of {name} {sid}")
            position = None
        progress = body.progress if self.config.progress else {}
        if sub is not None and self.config.progress:
            self._note_acked_from(sub, origin, body.acked)
        known = sub.progress if sub is not None else None
        if (
            progress
            and known is not None
            and all(known.get(o, 0) >= s for o, s in progress.items())
        ):
            progress = {}  # nothing this region does not know already
        if position is None and not progress:
            return [ignored] if ignored is not None else []
        if sub is None:
            info = SubscriptionInfo(body.kind, True, body.config)
            sub = self._subs[name] = _Sub(info, SnapshotCache(self.config.cache_size), False)
            if self.config.progress:
                self._note_acked_from(sub, origin, body.acked)
        elif not sub.exists:  # to be created: with the newest configuration
            sub.info = SubscriptionInfo(body.kind, True, body.config)
        if position is not None and sid is not None:
            applied[origin] = (sid, position, self._now)
            if sub.target is None or position > sub.target:
                sub.target = position
        for o, s in progress.items():
            sub.progress[o] = max(sub.progress.get(o, 0), s)
        if progress:
            self._want_read(ReadReason.VECTOR)
        out: list[Output] = [
            UpdateApplied(name, origin, sid if position else None, position, progress)
        ]
        # A vector alone moves an existing subscription at the next positions read: at most
        # one move per interval however many updates arrive (a move is several requests).
        self._reconcile(name, sub, out, progress=position is not None or not sub.exists)
        return out

    def _reconcile(self, name: str, sub: _Sub, out: list[Output], *, progress: bool = True) -> None:
        """Carry out applied updates: create if absent, move forward only, to the further of
        the snapshot's position and the position the progress vector covers (`progress=False`:
        the snapshot's only; the vector's waits for the next positions read). One action at a
        time per subscription: none while the outcome of the last one is not reported. The
        target is kept until an action reaching it is reported done (or a read shows the
        subscription there), so a failed one is asked for again."""
        if not self._leader or sub.moving or self._ready_for_release(name, sub):
            return
        target = sub.target
        if progress and sub.progress and (not sub.exists or sub.mark_delete is not None):
            after = sub.mark_delete if sub.exists and sub.mark_delete is not None else 0
            covered = self._position_for(sub.progress, after)
            if covered is not None and (not sub.exists or covered > after):
                target = covered if target is None else max(target, covered)
        if target is None:
            return
        external = sub.info.kind is SubscriptionKind.EXTERNAL
        action: SubscriptionAction
        if not sub.exists:
            create = CreateCursor if external else CreateConsumer
            action = create(name, sub.info.config, target)
        elif sub.mark_delete is None:
            return
        elif sub.mark_delete < target:
            action = (MoveCursor if external else MoveConsumer)(name, target)
        else:
            sub.target = None  # already there
            return
        out.append(action)
        if not isinstance(action, MoveConsumer):  # a cursor's write creates one deleted
            self._generation += 1
        # Asked, it may land whatever the machine hears of it (a reply lost, a timeout).
        sub.moved_to = max(sub.moved_to, target)
        self._asked(sub, action)

    # ---- the failback guard (docs/protocol.md §7) ------------------------------------------

    def _check_return(self, listing: PositionsListing) -> list[Output]:
        """A leader's first listing: this region returned when its read stream's leader was
        elected less than `hold_ms` ago (or the server does not say) but not with the stream
        (its first leader: a fresh stream, `_first_leader`), and the stream has not heard
        from some other region since (its sources resume one by one: waiting for all of
        them to be silent missed returns where one resumed first). A stream whose leader
        is older is not returning, whatever region is down: a sidecar restart there holds
        nothing. Its replicated durables are then held until every other region answered a
        catch-up request. When every source was heard already, the hold of a leader before
        this one may still stand (`_adopt`)."""
        sources, leader_age_ms = listing.sources, listing.leader_age_ms
        recent = leader_age_ms is None or leader_age_ms < self.config.hold_ms
        if not self.config.hold_ms or not recent:
            return []
        if _first_leader(leader_age_ms, listing.stream_age_ms):
            return []
        durables = sorted(
            name
            for name, sub in self._subs.items()
            if sub.exists and sub.info.replicated and sub.info.kind is SubscriptionKind.DURABLE
        )
        if not any(r in sources and sources[r] is None for r in self._others):
            return self._adopt(listing, durables)
        if not durables:
            return []
        out: list[Output] = [HoldConsumer(name, self.config.hold_ms) for name in durables]
        return out + self._hold(self._now, durables, adopted=False)

    def _adopt(self, listing: PositionsListing, durables: list[str]) -> list[Output]:
        """A leader that steps down holding leaves its pause standing to its deadline, and by
        its successor's first listing every source may have been heard: that one held and
        released nothing, and the durables stayed paused to the deadline (the shell
        simulation, a leader stalled past its lease as sourcing resumed). The successor, in a
        region whose stream leader is recent, takes over each replicated durable listed
        paused for no longer than a hold: catch-up requests again, the release once every
        other region answered, by the latest deadline at most (no new pause). Safe as the hold
        is, since the guard only pauses and resumes. The cost: an operator's pause taken over
        this way (a region returned within `hold_ms` and its leader changed since) is resumed
        early, and so may be a move's pause of the leader before (`consumers.move_forward`):
        a move unpaused can only rewind its durable, never pass unconsumed data."""
        remaining = {
            name: ms
            for name in durables
            if 0 < (ms := listing.paused.get(name, 0)) <= self.config.hold_ms
        }
        if not remaining:
            return []
        since = self._now - (self.config.hold_ms - max(remaining.values()))
        return self._hold(since, sorted(remaining), adopted=True)

    def _hold(self, since_ms: int, held: list[str], *, adopted: bool) -> list[Output]:
        """Hold `held` from `since_ms` until every other region answered a catch-up request,
        which goes out at the next tick: a pending attempt is not one."""
        self._return = _Return(since_ms, set(self._others), set(held))
        out: list[Output] = [FailbackHeld(tuple(held), tuple(sorted(self._others)), adopted)]
        attempt = self._pending
        if attempt is not None:
            self._pending = None
            out.extend(self._timed_out(attempt))
        self._next_start_ms = self._now
        return out

    def _answer_catch_ups(self) -> list[Output]:
        """After a positions read: every subscription's progress as read now, then the
        answers owed to returning regions (published in that order, so they read the progress
        before the answer)."""
        if not self._owed:
            return []
        out: list[Output] = []
        for name, sub in self._subs.items():
            self._maybe_send_update(name, sub, out, now=True)
        out.extend(self._publish(response) for response in self._owed)
        self._owed.clear()
        return out

    def _end_holds(self) -> list[Output]:
        """After a positions read, once every region answered: release each held durable
        with no move in flight (the read just asked for any its progress calls for). One with
        a move in flight notes where the progress calls for it now (`_Return.needed`): once
        there, it is asked no further move, and the next read releases it."""
        held = self._return
        if held is None or held.waiting:
            return []
        lag_ms = self._now - held.answered_ms
        if self._index.indexed_through < held.data_high and lag_ms < self.config.active_window_ms:
            # The data tail lags the markers: positions from the index are not final yet
            # (shell simulation seed 108). Read again once it has caught up, for ten
            # intervals at most: a gap between markers may also be a message the data tail
            # never indexes (another subject, one removed meanwhile), and the hold must end.
            self._want_read(ReadReason.CATCH_UP)
            return []
        done: list[str] = []
        for name in sorted(held.held):
            sub = self._subs.get(name)
            if sub is None or not sub.exists or not sub.moving:
                done.append(name)
            elif name not in held.needed and sub.mark_delete is not None:
                held.needed[name] = max(sub.mark_delete, self._called_for(sub))
        released = self._release(done)
        # A durable that reached `needed` was asked no move since (an update applied
        # meanwhile included): what is called for now goes before its release, which then
        # lands once the move's outcome is in (`make soak` seed 31537660956: asked only at
        # the read after, the released durable delivered what that update said was consumed).
        moves: list[Output] = []
        for name in done:
            sub = self._subs.get(name)
            if sub is not None:
                self._reconcile(name, sub, moves)
        return moves + released

    def _called_for(self, sub: _Sub) -> int:
        """The furthest position an applied update or the merged progress calls `sub` to."""
        target = sub.target or 0
        if sub.progress and sub.mark_delete is not None:
            covered = self._position_for(sub.progress, sub.mark_delete)
            if covered is not None:
                target = max(target, covered)
        return target

    def _ready_for_release(self, name: str, sub: _Sub) -> bool:
        """Held, and where the progress called for it once every region answered (one
        released while another stays held is moved again as its updates call for)."""
        held = self._return
        if held is None or name not in held.held:
            return False
        needed = held.needed.get(name)
        return needed is not None and sub.mark_delete is not None and sub.mark_delete >= needed

    def _release(self, names: list[str]) -> list[Output]:
        held = self._return
        assert held is not None
        out: list[Output] = []
        missing = tuple(sorted(held.waiting))
        for name in names:
            held.held.discard(name)
            out.append(ReleaseConsumer(name))
            out.append(FailbackReleased(name, self._now - held.since_ms, missing))
        if not held.held:
            self._return = None
        return out

    # ---- acks above the floor (docs/protocol.md §6) -----------------------------------------

    def _take_acks(self, acked: Mapping[str, Acks]) -> None:
        """Acks come from applications only, never from moves: each consumer's a sign (one
        heard long ago, before this replica led, is a sign of then if still recent), and
        what they settled above its floor is noted."""
        for name, acks in acked.items():
            sub = self._subs.get(name)
            if sub is None or not sub.exists or not sub.info.replicated:
                continue
            if acks.heard_ms > self._now - self.config.active_window_ms:
                self._signed(sub, acks.heard_ms)
            self._note_acked(sub, acks.seqs)

    def _note_acked(self, sub: _Sub, seqs: Sequence[int]) -> None:
        """Its applications acked `seqs` here: those above its floor are kept (the lowest
        `_MAX_ACKED_SEQS`: one left out is only a message not covered, which is safe)."""
        floor = sub.mark_delete or 0
        above = sub.acked_above
        above.update(s for s in seqs if s > floor)
        if len(above) > _MAX_ACKED_SEQS:
            sub.acked_above = set(sorted(above)[:_MAX_ACKED_SEQS])

    def _acked_ranges(self, sub: _Sub, mark_delete: int) -> dict[str, Ranges]:
        """Per origin, the origin sequences acked here above `mark_delete` (which its vector
        there does not cover), as ranges of consecutive sequences, the lowest
        `MAX_ACKED_RANGES`. What the index does not place yet waits; what it places as no data
        of a known origin (a marker) goes."""
        index = self._index
        kept: set[int] = set()
        by_origin: dict[str, list[int]] = {}
        for seq in sorted(sub.acked_above):
            if seq <= mark_delete:
                continue
            if seq > index.indexed_through:
                kept.add(seq)
                continue
            found = index.origin_of(seq)
            if found is not None:
                kept.add(seq)
                by_origin.setdefault(found[0], []).append(found[1])
        sub.acked_above = kept
        ranges: dict[str, Ranges] = {}
        left = MAX_ACKED_RANGES
        for origin in sorted(by_origin):
            pairs: list[tuple[int, int]] = []
            for origin_seq in by_origin[origin]:
                if pairs and origin_seq == pairs[-1][1] + 1:
                    pairs[-1] = (pairs[-1][0], origin_seq)
                elif len(pairs) < left:
                    pairs.append((origin_seq, origin_seq))
                else:
                    break
            left -= len(pairs)
            if pairs:
                ranges[origin] = tuple(pairs)
        return ranges

    def _note_acked_from(self, sub: _Sub, writer: str, acked: Mapping[str, Ranges]) -> None:
        """The ranges `writer` sent last replace those it sent before."""
        if acked:
            sub.acked_from[writer] = acked
        else:
            sub.acked_from.pop(writer, None)

    def _acked_elsewhere(self, sub: _Sub) -> dict[str, Ranges]:
        """Per origin, the ranges the other regions sent last, merged, above the merged
        progress (what it covers already left out)."""
        merged: dict[str, list[tuple[int, int]]] = {}
        for acked in sub.acked_from.values():
            for origin, pairs in acked.items():
                merged.setdefault(origin, []).extend(pairs)
        out: dict[str, Ranges] = {}
        for origin, received in sorted(merged.items()):
            covered = sub.progress.get(origin, 0)
            joined: list[tuple[int, int]] = []
            for first, last in sorted(received):
                first = max(first, covered + 1)
                if first > last:
                    continue
                if joined and first <= joined[-1][1] + 1:
                    joined[-1] = (joined[-1][0], max(last, joined[-1][1]))
                else:
                    joined.append((first, last))
            if joined:
                out[origin] = tuple(joined)
        return out

    # ---- consumption in two regions (docs/protocol.md §8) -----------------------------------

    def _consumed_here(self, sub: _Sub, position: int) -> bool:
        """Whether a read finding `sub` at `position` shows its own consumers passed data:
        it stands beyond where the last read left it and where any move or creation this
        machine asked for may have (done, failed with its reply lost, or in flight), over at
        least one data message (markers and removed messages alone do not count: an idle
        durable follows the stream's end over markers)."""
        if sub.mark_delete is None:
            return False
        # A floor that followed the stream's removals (limits, purges) moved over nothing
        # consumed: only data at or above the first stored message counts.
        before = max(sub.mark_delete, sub.moved_to, self._first_seq - 1)
        if position <= before or not sub.info.replicated or before < self._index.trimmed_through:
            return False
        return self._index.vector_at(position) != self._index.vector_at(before)

    def _held(self, lease_epoch: int | None) -> bool:
        """Whether this replica's lease held the machine's epoch throughout an observation
        (`lease_epoch`; None: not known). While one epoch holds, no other replica of the
        region leads (a lease lapsed is lost, and taken again only under a higher epoch), so
        what moved the durables meanwhile is this machine's moves or its consumers (`make
        soak` seed 702622929322: a replica woken after its lease lapsed, ticked before it
        heard of the loss, read another replica's moves)."""
        return lease_epoch is None or lease_epoch == self._epoch

    def _away(self, observed_ms: int) -> bool:
        """Whether a position observed at `observed_ms` (0: not known) came a lease's time or
        more after this machine last heard the clock: it may have been frozen meanwhile, its
        lease lost and another replica leading and moving the durables, which it would take
        for its consumers' (shell simulation, `make soak` seed 161639543428)."""
        return observed_ms - self._now >= self.config.lease_ttl_ms if observed_ms else False

    def _signed(self, sub: _Sub, at_ms: int | None = None) -> None:
        """Its own region's consumers passed `sub`'s data (now, or at `at_ms`): told to the
        others with its next update."""
        self._consumed(sub, self._region, at_ms)
        sub.consumed_unsent = True

    def _consumed(self, sub: _Sub, region: str, at_ms: int | None = None) -> None:
        at = self._now if at_ms is None else min(at_ms, self._now)
        sub.consumed_ms[region] = max(at, sub.consumed_ms.get(region, at))
        self._active_until = max(self._active_until, at + self.config.active_window_ms)

    def _next_expiry(self) -> int | None:
        """When the next region stops counting as consuming a subscription (the gauges
        change then), or None."""
        if self._active_until <= self._now:
            return None
        window = self.config.active_window_ms
        return min(
            (
                ms + window
                for sub in self._subs.values()
                for ms in sub.consumed_ms.values()
                if ms + window > self._now
            ),
            default=None,
        )

    def _consumed_in(self, sub: _Sub) -> tuple[str, ...]:
        """The regions whose consumers passed `sub`'s data within the activity window."""
        since = self._now - self.config.active_window_ms
        return tuple(sorted(r for r, ms in sub.consumed_ms.items() if ms > since))

    # ---- helpers --------------------------------------------------------------------------

    def _want_read(self, reason: ReadReason) -> None:
        """Ask for a positions read at the next interval (a follower only sweeps: it does not
        act on what it reads, it only answers the API from it)."""
        if self._read_wanted is None and (self._leader or reason in _EVERY_REPLICA):
            self._read_wanted = reason

    def _grew(self) -> bool:
        """The read stream grew past the last read while a position followed its end."""
        return self._follows_end and self._last_seq > self._read_last_seq

    def _publish(self, body: Request | Response | Update) -> PublishReplicated:
        return PublishReplicated(Marker(self._region, self.config.stream, self._epoch, body))

    def _note_marker_seq(self, read_seq: int) -> None:
        if read_seq > self._last_marker_seq:
            if read_seq > self._last_marker_seq + 1:
                self._data_high = max(self._data_high, read_seq - 1)
            self._last_marker_seq = read_seq
        if read_seq > self._last_seq:
            self._last_seq = read_seq
