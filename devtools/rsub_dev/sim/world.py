"""A deterministic multi-region world driving real `StreamMachine`s, with safety checks.

Model (one virtual stream `V`, regions r0..rN-1):
- every region has a write stream W and a read stream Q (lists; seq = index + 1);
- a FIFO channel from every W to every Q, a region's own included, each with its own latency,
  random per-batch delays and stalls, so read streams interleave origins differently;
- producers in every region append data (`Data`: a unique id and its origin sequence: the
  entry's position in its W, whose markers take sequences too) to their W;
- per region a sidecar: a leader instance and possibly zombie instances (old leaders still
  running with a stale epoch); each instance ticks, tails the markers of Q and, apart,
  the origins of its data messages (`data_indexed`), each lagging by a random amount, and
  reads positions (effective ones, as the runtime reads them: the stream's end when nothing
  is left to deliver, else the ack floor extended over the markers and removed messages
  right after it); its outputs are carried out at once (publishes, moves, creates); a
  restarted one is rebuilt with `StreamMachine.restore` from the markers and data in Q;
- replicated subscriptions with a home region whose consumer delivers and acks data in
  order, in bursts, out of order or stalls; copies elsewhere are moved only by updates;
- chaos: channel stalls, sidecar crashes and restarts (rebuilt from the markers in Q),
  leadership changes (the old leader lives on as a zombie for a while), partitions of one
  region, failovers of a subscription's home, garbage on the marker subjects; then a healed
  phase checks liveness. Some runs send every marker through the protobuf codec;
- outages (some runs): one region cut off (its own clients still write) with its sidecar
  stopped for 20 to 50 intervals, while the others stay calm; consumers fail over away from
  it, and once more between live regions midway. With three regions or more no snapshot
  completes meanwhile: only progress vectors move positions. Some runs are long and busy
  enough for the sidecars to trim their origin indexes;
- the edge cases of DESIGN §7, each drawn in some runs: producers publishing a message again
  in another region with the same id (`Data.msg_id`), which every read stream stores once
  per de-duplication window (both copies once it expired); write streams removing entries by
  age, sourced everywhere or not (those never reach the read streams that had not sourced
  them); read streams removing entries by age, read or not (JetStream drops them from a
  consumer's pending acks and moves its ack floor over them, a consumer skips them, an idle
  one stays, and a sidecar no longer reads them); users resetting a consumer backwards in its
  home (a replay, possibly below what the sidecar trimmed from its index);
- failed actions (some runs): a fraction of the moves and creations fail or are dropped at
  random, and the machine is told so (`action_failed`), as the runtime's driver does; the
  others are reported done with where the copy stands after them (`action_done`);
- what else real servers and users do (issue 12, item 3), each drawn in some runs: limits by
  count (`max_msgs`, markers counted too) on write and read streams, with the consumers
  treated as for limits by age; operators purging a stream (all of it, or all but its last
  entries): in a read stream every consumer's ack floor moves over the purge, idle ones too,
  and pending acks below it are dropped (nats-server 2.15.1); users deleting a replicated
  durable in one region (a move then finds nothing and is reported failed, as the runtime's
  `subscription_gone`; the next update creates it again; in its home the user creates it
  again, delivering all, unless the sidecar did first); sidecar processes frozen (a GC pause,
  a VM stall): shorter than the lease the leader resumes; longer, a new leader takes over at
  the lease's expiry and the old one wakes later with its stale state and epoch, acting until
  it reads its region's newer epoch or its lease loop deposes it.

Properties (checked when the state they depend on changes, which is after every step that
could break them; read streams are append-only and consumption only grows, so a property that
held stays true):
- snapshot safety: a completed snapshot of `a` names every other region `x`, and every data
  message at or below its position in Q_x lies at or below its local position in Q_a;
- no loss: whenever a subscription's copy in a region is moved, created or becomes the home,
  every data message at or below its ack floor there is a logical message (an id) of which
  some copy was consumed, or one the guarantee excuses (`_excuse`): a copy of it never
  reached the read stream of a region where the subscription passed that point (limits on
  the write stream; passed by its floor, or by an effective position standing over removed
  messages), or it was removed from a read stream under a copy of the subscription
  before that copy passed it (the documented rule; under a copy nobody reads, and by a
  purge, it is counted apart), or it lies removed in the region moved (it can never be
  delivered there); a copy deleted by its user still counts for how far it got;
- monotonic: a machine never asks to move a subscription to or below the position it last
  reported; the runtime applies moves forward only; consumers never receive markers;
- applied: after a leader accepted an update naming its region at position p, the copy
  there stands at or beyond p (unless its user reset or deleted it since the sidecar read
  it: then the next update creates it again);
- claim 1 (DESIGN §7), when an update with a progress vector `v` read at `M` is published
  in `a`: every data message `(o, s)` with `s <= v[o]` that Q_a holds or will hold lies at
  or below `M`, and every one Q_a dropped as a duplicate was dropped for a copy stored at or
  below `M` (docs/protocol.md §6, case 2);
- covered means consumed: whenever a region accepts a vector, every message its merged
  progress covers has been consumed (or is excused as above); an exact client (after a
  failover it skips what the new home's progress covers) therefore skips only those.
  Duplicates are counted for a native consumer and for the exact client, replays after a
  user reset apart;
- not data: what a sidecar is fed as data is sourced data, never a local snapshot marker;
- reported: the mark-delete a machine reports for an existing subscription
  (`subscription(name).mark_delete`, what the API answers) is never above where its copy
  stands, and names only copies there (unless its user reset, deleted or created it since
  that instance last read it: a frozen one wakes with such stale views); checked whenever a
  machine returns outputs, reads positions or learns an action's outcome;
- retried: a move or creation that failed at random is asked for again by the leader that
  asked for it within `_RETRY_WINDOW_MS` of running (frozen time not counted), unless the
  copy got there by itself, its user deleted it, before or after the failure (the machine
  then forgets it; the next update creates it again) or that leader is gone;
- fencing: a marker whose epoch is below one its region already wrote (as fed to that
  instance) changes nothing, and an instance fed a marker its own region wrote with a newer
  epoch than its own never publishes or moves again (data safety does not rest on it: a
  deposed leader's markers state truths; the data properties above hold regardless);
- liveness (healed phase): every region holding a subscription when healed completes a
  snapshot, and every remote copy of every subscription (one its user deleted included) is
  created or advances, unless the home's copy was deleted by its user and stood below where
  it had got when healed (created again delivering all, it redelivers for as long as it takes);
- vector liveness (outages): when the home's position covers the next data message above a
  copy in another live region (one its user deleted: above where it had got), that copy
  advances within `_vector_window`.
No loss covers the moves vectors cause: a message reaching Q_b late (from a region back
from an outage) is appended above every position there, and any later move across it is
checked like the others.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rsub_dev.sim.outcome import SimResult, Violation
from sidecar.naming import VirtualStream
from sidecar.protocol import (
    Action,
    CreateConsumer,
    CreateCursor,
    IgnoreReason,
    MachineConfig,
    Marker,
    MarkerIgnored,
    MarkerRejected,
    MoveConsumer,
    Output,
    PublishLocal,
    PublishReplicated,
    Rejected,
    Response,
    Snapshot,
    SnapshotCompleted,
    SnapshotTimedOut,
    StoredMarker,
    StreamMachine,
    SubscriptionAction,
    SubscriptionInfo,
    SubscriptionKind,
    Update,
    UpdateApplied,
    UpdateSent,
    decode,
    encode,
)
from sidecar.protocol.origins import DataEntry

STREAM = "V"
LEASE_MS = 400  # a frozen leader's lease expires after this long; a new leader takes over
MAX_LAG_MS = 300  # the longest a sidecar's marker tail or data index lags its read stream
POSITIONS_GAP_MS = 100  # the longest between two reads of a region's consumer positions
_NOT_HELD = 2**62  # the read position of a message a read stream does not hold yet
# A failed move or creation is asked for again at the leader's next positions read (or
# sooner, on an update): within two reads, and slack.
_RETRY_WINDOW_MS = 3 * POSITIONS_GAP_MS


@dataclass(frozen=True, slots=True)
class Data:
    """A data message: a unique `id` per copy, written at `origin_seq` of region `origin`'s
    write stream (markers written there take origin sequences too, so data sequences have
    gaps). `msg_id` is its `Nats-Msg-Id`, the logical message: the same in both copies when a
    producer publishes it in two regions, the `id` otherwise."""

    id: int
    msg_id: int
    origin: str
    origin_seq: int


# Markers travel as values, or as bytes when the run goes through the codec (garbage on
# marker subjects is bytes too).
Entry = Data | Marker | bytes
MachineFactory = type[StreamMachine]


@dataclass(frozen=True, slots=True)
class SimParams:
    regions: int = 3
    subscriptions: int = 2
    chaos_ms: int = 3_000
    heal_ms: int = 5_000
    produce_gap_ms: int = 40
    consume_batch: int = 8  # the most messages a consumer takes per poll (64 once healed)
    max_latency_ms: int = 60
    interval_ms: int = 100
    timeout_ms: int = 1_500
    cache_size: int = 6
    stalls: bool = True
    crashes: bool = True
    leader_changes: bool = True
    partitions: bool = True
    failovers: bool = True
    garbage: bool = True
    codec: bool = False
    outage_ms: int = 0
    """One region cut off with its sidecar stopped for this long during the chaos (0: none)."""
    duplicates: float = 0.0
    """The fraction of data messages a producer publishes again in another region (same id)."""
    dedup_window_ms: int = 500
    """Read streams drop a copy whose id they stored less than this long ago."""
    write_max_age_ms: int = 0
    """Write streams remove entries older than this, sourced everywhere or not (0: no limit)."""
    read_max_age_ms: int = 0
    """Read streams remove entries older than this, read by their consumers or not (0: none)."""
    resets: bool = False
    """Users reset consumers backwards in their home region (a chaos event)."""
    action_failures: float = 0.0
    """The fraction of moves and creations that fail or are dropped (reported failed)."""
    write_max_msgs: int = 0
    """Write streams keep at most this many entries, removing the oldest (0: no limit)."""
    read_max_msgs: int = 0
    """Read streams keep at most this many entries, removing the oldest (0: no limit)."""
    purges: bool = False
    """Operators purge a prefix of a read or write stream, or all of it (a chaos event)."""
    deletions: bool = False
    """Users delete a replicated durable in one region (a chaos event); in its home they
    create it again (deliver all) unless the sidecar did first."""
    freezes: bool = False
    """Sidecar processes freeze (a GC pause, a VM stall; a chaos event): shorter than the
    lease, the leader resumes; longer, a new leader takes over at its expiry and the old one
    wakes later with its stale state and epoch, acting until it learns it was deposed."""

    def __post_init__(self) -> None:
        if not 1 <= self.regions <= 9:
            raise ValueError(f"regions must be 1..9, got {self.regions}")
        if self.subscriptions < 1:
            raise ValueError(f"subscriptions must be positive, got {self.subscriptions}")
        if self.consume_batch < 1:
            raise ValueError(f"consume_batch must be positive, got {self.consume_batch}")
        if not 0 <= self.duplicates < 1 or self.dedup_window_ms <= 0:
            raise ValueError(
                f"duplicates must be in [0, 1) and dedup_window_ms positive, got "
                f"{self.duplicates}, {self.dedup_window_ms}"
            )
        if not 0 <= self.action_failures < 1:
            raise ValueError(f"action_failures must be in [0, 1), got {self.action_failures}")
        if min(self.write_max_age_ms, self.read_max_age_ms) < 0:
            raise ValueError("max ages must not be negative (0: no limit)")
        if min(self.write_max_msgs, self.read_max_msgs) < 0:
            raise ValueError("max msgs must not be negative (0: no limit)")
        if self.outage_ms and (self.regions < 3 or self.outage_ms + 600 > self.chaos_ms):
            raise ValueError(
                f"an outage needs 3 regions and 600 ms of chaos around it, got {self.regions} "
                f"regions, outage_ms={self.outage_ms}, chaos_ms={self.chaos_ms}"
            )

    @classmethod
    def draw(cls, rng: random.Random, regions: int | None = None) -> SimParams:
        """Random but valid parameters (the seed decides everything). A quarter of the runs
        with three regions or more have a long outage (20 to 50 intervals); one in twenty
        runs is long and busy enough for the sidecars to trim their origin indexes (their
        consumers keep up, or no copy could advance soon after healing). The edge cases of
        DESIGN §7 are drawn apart: duplicates in a quarter of the runs, write-stream and
        read-stream limits by age in a fifth each, user resets in three tenths, failed actions
        (a tenth to a half of them) in three tenths; then limits by count in a tenth each (sized
        above what arrives in 600 ms), purges in a sixth, deletions in a quarter and freezes in
        two fifths."""
        regions = regions if regions is not None else rng.randint(2, 5)
        chaos_ms, outage_ms = rng.randint(1_000, 4_000), 0
        if regions >= 3 and rng.random() < 0.25:
            outage_ms = rng.randint(2_000, 5_000)
            chaos_ms += outage_ms
        produce_gap_ms, consume_batch = rng.randint(15, 100), 8
        if rng.random() < 0.05:
            chaos_ms, produce_gap_ms = chaos_ms + rng.randint(8_000, 16_000), rng.randint(3, 8)
            consume_batch = 100 * regions // produce_gap_ms
        # What a region writes in 600 ms: count limits keep more than that, or markers would be
        # removed before the sidecars (lagging up to MAX_LAG_MS) read them, and no snapshot
        # could complete (the age limits keep at least 600 and 800 ms).
        burst = 600 // produce_gap_ms
        return cls(
            regions=regions,
            subscriptions=rng.randint(1, 3),
            chaos_ms=chaos_ms,
            produce_gap_ms=produce_gap_ms,
            consume_batch=consume_batch,
            max_latency_ms=rng.randint(5, 150),
            cache_size=rng.randint(2, 12),
            stalls=rng.random() < 0.8,
            crashes=rng.random() < 0.6,
            leader_changes=rng.random() < 0.6,
            partitions=rng.random() < 0.4,
            failovers=rng.random() < 0.6,
            garbage=rng.random() < 0.3,
            codec=rng.random() < 0.2,
            outage_ms=outage_ms,
            duplicates=rng.uniform(0.05, 0.3) if rng.random() < 0.25 else 0.0,
            dedup_window_ms=rng.randint(50, 1_500),
            write_max_age_ms=rng.randint(600, 3_000) if rng.random() < 0.2 else 0,
            read_max_age_ms=rng.randint(800, 4_000) if rng.random() < 0.2 else 0,
            resets=rng.random() < 0.3,
            action_failures=rng.uniform(0.1, 0.5) if rng.random() < 0.3 else 0.0,
            write_max_msgs=burst + rng.randint(10, 300) if rng.random() < 0.1 else 0,
            read_max_msgs=regions * burst + rng.randint(40, 400) if rng.random() < 0.1 else 0,
            purges=rng.random() < 0.16,
            deletions=rng.random() < 0.25,
            freezes=rng.random() < 0.4,
        )


WorldResult = SimResult[SimParams]


@dataclass(slots=True)
class _Channel:
    latency: int
    blocked_until: int = 0
    next_index: int = 0
    scheduled: bool = False
    generation: int = 0  # a delivery event of an older generation was cancelled


@dataclass(slots=True)
class _Copy:
    """A subscription's consumer (or cursor) in one region."""

    floor: int
    next_seq: int
    delivered: deque[int] = field(default_factory=deque)  # delivered, not yet acked (seqs)
    acked: set[int] = field(default_factory=set)  # acked beyond the floor
    checked: int = 0  # every data message <= checked is known consumed (or excused)
    high: int = 0  # the highest floor it had before its user reset it backwards


@dataclass(slots=True)
class _SimConsumer:
    name: str
    kind: SubscriptionKind
    home: str
    pattern: str
    copies: dict[str, _Copy]
    consumed: set[int] = field(default_factory=set)  # logical messages (`World._identity`)
    stalled_until: int = 0
    failovers: int = 0
    skip: dict[str, int] = field(default_factory=dict)
    """The exact client's vector: the progress the home held when the consumer failed over
    to it; the client skips the data messages it covers."""
    consumed_prefix: dict[str, int] = field(default_factory=dict)
    """Per origin, how many of its data messages (in write order) are all consumed or excused."""
    excused: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Logical messages never consumed that a copy passed after its read stream removed them:
    passing them elsewhere is not a loss (`World._passed_removed`). Values: the stats key
    that counts the excuse, and the reason."""
    replay_until: int = 0
    """After a user reset in the home: data up to here are delivered again on purpose."""
    deleted_high: dict[str, int] = field(default_factory=dict)
    """Per region where its user deleted the copy: the highest floor it had (a copy created
    there again starts with it as its `high`)."""


@dataclass(slots=True)
class _Arrivals:
    """Where one write stream's entries landed in one read stream, in order."""

    seqs: list[int] = field(default_factory=list)  # origin sequences
    positions: list[int] = field(default_factory=list)  # read-stream sequences

    def add(self, origin_seq: int, position: int) -> None:
        self.seqs.append(origin_seq)
        self.positions.append(position)

    def after_seq(self, origin_seq: int) -> int | None:
        """The position of the first entry with an origin sequence above `origin_seq`."""
        k = bisect_right(self.seqs, origin_seq)
        return self.positions[k] if k < len(self.positions) else None

    def after_position(self, position: int) -> int | None:
        """The origin sequence of the first entry above `position`."""
        k = bisect_right(self.positions, position)
        return self.seqs[k] if k < len(self.seqs) else None


@dataclass(slots=True)
class _Instance:
    machine: StreamMachine
    epoch: int  # the epoch it was made leader with
    tail: int  # seqs <= tail were given to the machine as markers
    indexed: int  # seqs <= indexed were given to the machine as data
    reported: dict[str, int] = field(default_factory=dict)
    alive_until: int | None = None  # zombies stop at this time
    frozen_until: int = 0  # a frozen process does nothing before this time
    seen: dict[str, int] = field(default_factory=dict)  # the highest epoch fed, per region
    deposed: bool = False  # fed a marker its own region wrote with a newer epoch
    unread: set[str] = field(default_factory=set)
    """Subscriptions its user reset, deleted or created again since this instance last read
    its region's subscriptions and positions: what it reports for them may be above their
    copy, or name one that is gone (a frozen instance wakes with such stale views)."""


class World:
    """One simulated run; `run()` returns a `SimResult` and never raises on a violation."""

    def __init__(
        self,
        seed: int,
        params: SimParams,
        factory: MachineFactory = StreamMachine,
        trace_len: int = 80,
    ) -> None:
        self.seed = seed
        self.p = params
        self.factory = factory
        self.rng = random.Random(seed)
        self.now = 0
        self.regions = tuple(f"r{i}" for i in range(params.regions))
        self.w: dict[str, list[Entry]] = {r: [] for r in self.regions}
        self.w_time: dict[str, list[int]] = {r: [] for r in self.regions}
        self.q: dict[str, list[Entry]] = {r: [] for r in self.regions}
        self.pos: dict[str, dict[int, int]] = {r: {} for r in self.regions}  # data id -> seq
        self.w_data: dict[str, list[Data]] = {r: [] for r in self.regions}  # data of W, in order
        # Limits: entries removed from the front of a stream stay in these lists (positions
        # never change); W[:w_first] and Q[:q_first - 1] are gone from the streams.
        self.w_first = dict.fromkeys(self.regions, 0)
        self.q_first = dict.fromkeys(self.regions, 1)
        self.q_time: dict[str, list[int]] = {r: [] for r in self.regions}
        pairs = [(o, r) for o in self.regions for r in self.regions]
        self.landed = {key: _Arrivals() for key in pairs}  # every entry of W_o stored in Q_r
        self.held = {key: _Arrivals() for key in pairs}  # the data of W_o stored in Q_r
        self.gone: dict[tuple[str, str], list[tuple[int, int]]] = {key: [] for key in pairs}
        """Origin sequence ranges of W_o removed by limits before they reached Q_r."""
        self.dropped = {key: _Arrivals() for key in pairs}
        """Data of W_o that Q_r dropped as duplicates; `positions`: the highest position of the
        stored copies they were dropped for, so far (claim 1 extended, proof case 2)."""
        self.dropped_at: dict[str, dict[int, int]] = {r: {} for r in self.regions}
        self.dedup: dict[str, dict[int, tuple[int, int]]] = {r: {} for r in self.regions}
        """Per read stream, id of a duplicated message -> (when, where) its copy was stored."""
        self.copies_of: dict[int, list[Data]] = {}  # the copies of duplicated messages
        self.local_marks: dict[str, set[int]] = {r: set() for r in self.regions}
        self.channels = {
            (x, y): _Channel(self.rng.randint(1, params.max_latency_ms))
            for x in self.regions
            for y in self.regions
        }
        self.epochs = dict.fromkeys(self.regions, 1)
        self.leaders: dict[str, _Instance | None] = {}
        self.zombies: dict[str, list[_Instance]] = {r: [] for r in self.regions}
        self.subs: dict[str, _SimConsumer] = {}
        self.prefix: dict[tuple[str, str], list[int]] = {}
        self.heal_at = params.chaos_ms
        self.healed = False
        self.heal_floors: dict[tuple[str, str], int] = {}
        self.down: str | None = None  # the region in an outage
        self.outage_until = 0
        self.next_id = 0
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "events",
                "data",
                "snapshots",
                "timeouts",
                "updates",
                "moves",
                "creates",
                "vectors_checked",
                "vector_moves",
                "duplicates_native",
                "duplicates_exact",
                "fenced",
                "crashes",
                "leader_changes",
                "partitions",
                "failovers",
                "rejected",
                "outages",
                "outage_moves",
                "outage_advances",
                "index_trims",
                "twins",
                "dedup_drops",
                "vectors_over_duplicates",
                "removed_w",
                "removed_q",
                "excused_never_reached",
                "excused_removed",
                "excused_removed_idle",
                "passed_removed_here",
                "resets",
                "resets_undone",
                "replayed",
                "actions_failed",
                "retries",
                "removed_q_count",
                "purges",
                "excused_purged",
                "deletions",
                "moves_gone",
                "recreated",
                "user_creates",
                "freezes",
                "takeovers",
                "stale_actions",
                "deposed",
            ),
            0,
        )
        self.failed: dict[tuple[str, str], tuple[int, SubscriptionAction]] = {}
        """(region, subscription) -> the number of its last failed action not asked again yet,
        and that action."""
        self.trace: deque[tuple[int, str, tuple[object, ...]]] = deque(maxlen=trace_len)
        p = params
        self._limited = any((p.write_max_age_ms, p.read_max_age_ms, p.write_max_msgs))
        self._limited |= p.read_max_msgs > 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self._n = 0

    # ---- scheduling ---------------------------------------------------------------------

    def _at(self, t: int, fn: Callable[..., None], *args: object) -> None:
        self._n += 1
        heapq.heappush(self._queue, (t, self._n, fn, args))

    def _note(self, what: str, *args: object) -> None:
        self.trace.append((self.now, what, args))

    def run(self) -> WorldResult:
        violation = None
        try:
            self._setup()
            end = self.p.chaos_ms + self.p.heal_ms
            while self._queue and self._queue[0][0] <= end:
                t, _, fn, args = heapq.heappop(self._queue)
                self.now = t
                if self._limited:
                    self._expire()
                self.stats["events"] += 1
                self.trace.append((t, fn.__name__, args))
                fn(*args)
            self.now = end
            if self.p.heal_ms:
                self._check_liveness()
        except Violation as exc:
            violation = str(exc)
        trace = [f"{t:>7}ms {what} {' '.join(map(_short, args))}" for t, what, args in self.trace]
        return SimResult(self.seed, self.p, violation, trace, dict(self.stats))

    # ---- setup --------------------------------------------------------------------------

    def _setup(self) -> None:
        rng = self.rng
        for i in range(self.p.subscriptions):
            home = rng.choice(self.regions)
            kind = SubscriptionKind.EXTERNAL if rng.random() < 0.3 else SubscriptionKind.DURABLE
            copies = {r: _Copy(0, 1) for r in self.regions if r == home or rng.random() < 0.5}
            pattern = rng.choice(("inorder", "burst", "random", "slow"))
            self.subs[f"d{i}"] = _SimConsumer(f"d{i}", kind, home, pattern, copies)
        for r in self.regions:
            self.leaders[r] = self._new_instance(r)
            self._at(rng.randint(0, 50), self._tick, r)
            self._at(rng.randint(0, 50), self._tail, r)
            self._at(rng.randint(0, 50), self._index, r)
            self._at(rng.randint(0, 50), self._positions, r)
            self._at(rng.randint(0, self.p.produce_gap_ms), self._produce, r)
        for name in self.subs:
            self._at(rng.randint(0, 50), self._consume, name)
        self._at(rng.randint(100, 400), self._chaos)
        if self.p.outage_ms:
            start = rng.randint(300, self.p.chaos_ms - self.p.outage_ms - 300)
            self._at(start, self._outage_start)
        self._at(self.heal_at, self._heal)

    def _new_instance(self, region: str) -> _Instance:
        config = MachineConfig(
            region,
            STREAM,
            self.regions,
            interval_ms=self.p.interval_ms,
            timeout_ms=self.p.timeout_ms,
            cache_size=self.p.cache_size,
        )
        q, first = self.q[region], self.q_first[region]
        markers: list[StoredMarker] = []
        seen: dict[str, int] = {}
        vs = VirtualStream(STREAM, self.regions)
        for seq, entry in enumerate(q[first - 1 :], start=first):
            if not isinstance(entry, Data):
                # As the runtime replays them: stored, under their writer's subject.
                decoded = self._decoded(entry)
                writer = decoded.region if isinstance(decoded, Marker) else region
                data = encode(entry) if isinstance(entry, Marker) else entry
                markers.append(StoredMarker(seq, vs.marker_subject(writer), data))
                if isinstance(decoded, Marker):
                    seen[decoded.region] = max(seen.get(decoded.region, 0), decoded.epoch)
        positions = {n: self._read_position(region, n) for n in self._local_subs(region)}
        machine, _ = self.factory.restore(
            config,
            markers,
            self._infos(region),
            positions,
            len(q),
            self.now,
            data=self._checked_data(region, self._data_entries(region, 0, len(q))),
        )
        epoch = self.epochs[region]
        inst = _Instance(machine, epoch, len(q), len(q), dict(positions), seen=seen)
        self._handle(region, inst, machine.became_leader(epoch))
        return inst

    def _instances(self, region: str) -> list[_Instance]:
        """The instances running in `region` now (frozen ones do nothing)."""
        leader = self.leaders[region]
        running = ([leader] if leader else []) + self.zombies[region]
        return [inst for inst in running if inst.frozen_until <= self.now]

    def _user_changed(self, region: str, name: str) -> None:
        """A user reset, deleted or created `name`'s copy in `region`: every instance there,
        frozen ones too, knows it only once it reads the region's subscriptions again."""
        for inst in [self.leaders[region], *self.zombies[region]]:
            if inst is not None:
                inst.unread.add(name)

    # ---- data plane ---------------------------------------------------------------------

    def _produce(self, region: str) -> None:
        rng, p = self.rng, self.p
        data = self._write_data(region, None)
        if p.duplicates and len(self.regions) > 1 and rng.random() < p.duplicates:
            # The producer publishes it again in another region (a retry after a timeout):
            # within the de-duplication window of a read stream or not.
            self.copies_of[data.msg_id] = [data]
            other = rng.choice([r for r in self.regions if r != region])
            self._at(
                self.now + rng.randint(0, 2 * p.dedup_window_ms), self._produce_twin, other, data
            )
        self._at(self.now + rng.randint(1, 2 * p.produce_gap_ms), self._produce, region)

    def _produce_twin(self, region: str, first: Data) -> None:
        self.stats["twins"] += 1
        self.copies_of[first.msg_id].append(self._write_data(region, first.msg_id))

    def _write_data(self, region: str, msg_id: int | None) -> Data:
        self.next_id += 1
        self.stats["data"] += 1
        data = Data(self.next_id, msg_id or self.next_id, region, len(self.w[region]) + 1)
        self.w_data[region].append(data)
        self._append_w(region, data)
        return data

    def _append_w(self, region: str, entry: Entry) -> None:
        self.w[region].append(entry)
        self.w_time[region].append(self.now)
        self._wake(region)

    def _wake(self, origin: str) -> None:
        backlog = len(self.w[origin])
        for y in self.regions:
            ch = self.channels[(origin, y)]
            if not ch.scheduled and ch.next_index < backlog:
                ch.scheduled = True
                self._at(self._ready(origin, ch), self._deliver, origin, y, ch.generation)

    def _ready(self, origin: str, ch: _Channel) -> int:
        """When the channel's next entry may land: its write time plus latency and jitter."""
        written = self.w_time[origin][ch.next_index]
        ready = written + ch.latency + self.rng.randint(0, ch.latency // 2 + 1)
        return max(ready, self.now + 1, ch.blocked_until)

    def _deliver(self, origin: str, target: str, generation: int) -> None:
        ch = self.channels[(origin, target)]
        if generation != ch.generation:
            return
        if self.now < ch.blocked_until:
            self._at(ch.blocked_until, self._deliver, origin, target, generation)
            return
        source, times = self.w[origin], self.w_time[origin]
        q, pos = self.q[target], self.pos[target]
        landed, held = self.landed[(origin, target)], self.held[(origin, target)]
        horizon = self.now - ch.latency
        for _ in range(self.rng.randint(1, 32)):
            if ch.next_index >= len(source) or times[ch.next_index] > horizon:
                break
            entry = source[ch.next_index]
            ch.next_index += 1
            if isinstance(entry, Data) and self._duplicate(target, entry):
                continue
            q.append(entry)
            self.q_time[target].append(self.now)
            landed.add(ch.next_index, len(q))
            if isinstance(entry, Data):
                pos[entry.id] = len(q)
                held.add(entry.origin_seq, len(q))
        if ch.next_index < len(source):
            self._at(self._ready(origin, ch), self._deliver, origin, target, generation)
        else:
            ch.scheduled = False

    def _duplicate(self, target: str, data: Data) -> bool:
        """Whether Q_target drops `data`: it stored a copy with the same id within the window.
        Otherwise the copy is remembered (for duplicated messages only: others have unique ids)."""
        if data.msg_id not in self.copies_of:
            return False
        seen = self.dedup[target].get(data.msg_id)
        if seen is not None and self.now - seen[0] < self.p.dedup_window_ms:
            self.stats["dedup_drops"] += 1
            self.dropped_at[target][data.id] = seen[1]
            dropped = self.dropped[(data.origin, target)]
            dropped.add(data.origin_seq, max([seen[1], *dropped.positions[-1:]]))
            return True
        self.dedup[target][data.msg_id] = (self.now, len(self.q[target]) + 1)
        return False

    def _expire(self) -> None:
        """Limits, before every step: streams remove what is older than their max age, and
        their oldest entries beyond their max count (markers count too)."""
        p = self.p
        for r in self.regions:
            times, first = self.w_time[r], self.w_first[r]
            if p.write_max_age_ms:
                while first < len(times) and times[first] <= self.now - p.write_max_age_ms:
                    first += 1
            if p.write_max_msgs:
                first = max(first, len(times) - p.write_max_msgs)
            self._remove_write(r, first)
            times, first = self.q_time[r], self.q_first[r]
            if p.read_max_age_ms:
                while first <= len(times) and times[first - 1] <= self.now - p.read_max_age_ms:
                    first += 1
            if p.read_max_msgs and len(times) - p.read_max_msgs + 1 > first:
                self.stats["removed_q_count"] += len(times) - p.read_max_msgs + 1 - first
                first = len(times) - p.read_max_msgs + 1
            self._remove_read(r, first)

    def _remove_write(self, origin: str, first: int) -> None:
        """W_origin removes its entries before index `first` (limits or a purge): those a read
        stream had not sourced yet never reach it."""
        if first <= self.w_first[origin]:
            return
        self.w_first[origin] = first
        for y in self.regions:
            ch = self.channels[(origin, y)]
            if ch.next_index < first:
                self._note("gone", origin, y, ch.next_index + 1, first)
                self.gone[(origin, y)].append((ch.next_index + 1, first))
                self.stats["removed_w"] += first - ch.next_index
                ch.next_index = first

    def _remove_read(self, region: str, first: int) -> None:
        """Q_region removes its entries before seq `first` (limits; `_purge` moves consumers over
        what it removes first). JetStream drops removed
        messages from a consumer's pending acks and moves its ack floor over them; a consumer
        that delivered none of them skips them when it next delivers (`_consume`); an idle one
        does not move (nats-server 2.15.1, by age and by count alike)."""
        start = self.q_first[region]
        if first <= start:
            return
        self.q_first[region] = first
        self.stats["removed_q"] += first - start
        for sub in self.subs.values():
            copy = sub.copies.get(region)
            if copy is not None and copy.delivered and copy.delivered[0] < first:
                self._note("removed", region, sub.name, start, first - 1)
                self._advance_floor(sub, region, copy)

    def _advance_floor(self, sub: _SimConsumer, region: str, copy: _Copy) -> None:
        """The ack floor moves over acked and removed messages at the head of the pending."""
        first, floor = self.q_first[region], copy.floor
        while copy.delivered and (copy.delivered[0] in copy.acked or copy.delivered[0] < first):
            seq = copy.delivered.popleft()
            copy.acked.discard(seq)
            copy.floor = seq
        q = self.q[region]
        for seq in range(floor + 1, min(copy.floor, first - 1) + 1):
            entry = q[seq - 1]
            if isinstance(entry, Data) and self._identity(entry) not in sub.consumed:
                self._passed_removed(sub, region, entry)

    def _passed_removed(
        self, sub: _SimConsumer, region: str, data: Data, purged: bool = False
    ) -> None:
        """The copy in `region` passed `data`, never consumed, after Q_region removed it. The
        documented rule (protocol §6): removal under a consumer counts as passed there, so
        passing it elsewhere is not a loss. Whether that consumer was the one being read (the
        home) is kept apart: under any other copy it is a limit of the guarantee; so are
        purges, which move every consumer of the stream over what they remove."""
        if purged:
            excuse = ("excused_purged", f"purged from {region}")
        elif region == sub.home:
            excuse = ("excused_removed", f"removed from {region} under the consumer")
        else:
            excuse = ("excused_removed_idle", f"removed from {region} under a copy not read")
        sub.excused.setdefault(self._identity(data), excuse)

    def _purge(self, region: str) -> None:
        """An operator purges a stream of `region` (`$JS.API.STREAM.PURGE`, all of it or all
        but its last `keep` entries). In a read stream JetStream moves the ack floor of every
        consumer over the purged entries, idle ones too, and drops them from pending acks
        (delivered messages above stay pending; checked on nats-server 2.15.1); in a write
        stream, what a read stream had not sourced yet never reaches it."""
        rng = self.rng
        keep = 0 if rng.random() < 0.3 else rng.randint(1, 60)
        self.stats["purges"] += 1
        if rng.random() < 0.3:
            self._note("purge", region, "write", keep)
            self._remove_write(region, max(self.w_first[region], len(self.w[region]) - keep))
            return
        q = self.q[region]
        first = max(self.q_first[region], len(q) - keep + 1)
        self._note("purge", region, "read", keep, first - 1)
        moved: list[tuple[_SimConsumer, _Copy]] = []
        for sub in self.subs.values():
            copy = sub.copies.get(region)
            if copy is None or copy.floor >= first - 1:
                continue
            for seq in range(copy.floor + 1, first):
                entry = q[seq - 1]
                if isinstance(entry, Data) and self._identity(entry) not in sub.consumed:
                    self._passed_removed(sub, region, entry, purged=True)
            copy.floor, copy.next_seq = first - 1, max(copy.next_seq, first)
            copy.checked = max(copy.checked, copy.floor)
            while copy.delivered and copy.delivered[0] < first:
                copy.acked.discard(copy.delivered.popleft())
            moved.append((sub, copy))
        self._remove_read(region, first)
        for sub, copy in moved:
            self._advance_floor(sub, region, copy)  # acked ones now at the head of the pending

    # ---- sidecars -----------------------------------------------------------------------

    def _tick(self, region: str) -> None:
        self._reap(region)
        for inst in self._instances(region):
            self._handle(region, inst, inst.machine.tick(self.now))
        self._at(self.now + self.rng.randint(20, 60), self._tick, region)

    def _tail(self, region: str) -> None:
        q = self.q[region]
        ahead = self.rng.random() < 0.5  # stream info read before the tail batch
        for inst in self._instances(region):
            if ahead:
                inst.machine.read_stream_advanced(len(q))
            inst.tail = max(inst.tail, self.q_first[region] - 1)  # removed before it was read
            while inst.tail < len(q):
                inst.tail += 1
                entry = q[inst.tail - 1]
                if isinstance(entry, Data):
                    continue
                marker = self._decoded(entry)
                if isinstance(marker, Rejected):
                    self.stats["rejected"] += 1
                    out = inst.machine.marker_rejected(inst.tail, marker)
                else:
                    out = inst.machine.marker_seen(inst.tail, marker)
                    self._check_fenced(region, inst, marker, out)
                self._handle(region, inst, out)
                self._check_applied(region, inst, out)
        self._at(self.now + self._lag(), self._tail, region)

    def _index(self, region: str) -> None:
        """The data messages' origins, tailed apart from the markers (as the runtime does)."""
        end = len(self.q[region])
        for inst in self._instances(region):
            entries = self._checked_data(region, self._data_entries(region, inst.indexed, end))
            inst.indexed = end
            self._handle(region, inst, inst.machine.data_indexed(entries))
        self._at(self.now + self._lag(), self._index, region)

    def _lag(self) -> int:
        rng = self.rng
        return rng.randint(1, MAX_LAG_MS) if rng.random() < 0.05 else rng.randint(5, 50)

    def _data_entries(self, region: str, after: int, end: int) -> list[DataEntry]:
        """The data messages of Q_region in (after, end] that are still there, as the runtime
        reads their headers (what limits removed first is never read)."""
        q = self.q[region]
        return [
            DataEntry(seq, e.origin, e.origin_seq)
            for seq in range(max(after, self.q_first[region] - 1) + 1, end + 1)
            if isinstance(e := q[seq - 1], Data)
        ]

    def _checked_data(self, region: str, entries: list[DataEntry]) -> list[DataEntry]:
        """Only sourced data is fed as data: never a snapshot marker written locally (it has no
        `Nats-Stream-Source`), and every entry names the origin of the message at its seq."""
        q, local = self.q[region], self.local_marks[region]
        for e in entries:
            entry = q[e.read_seq - 1]
            if e.read_seq in local or not isinstance(entry, Data):
                raise Violation(f"{region}: {entry!r} at {e.read_seq} fed to data_indexed as data")
            if (e.origin, e.origin_seq) != (entry.origin, entry.origin_seq):
                raise Violation(f"{region}: {e} fed for {entry}")
        return entries

    def _decoded(self, entry: Marker | bytes) -> Marker | Rejected:
        if isinstance(entry, Marker):
            return entry
        return decode(entry, stream=STREAM, regions=self.regions)

    def _wire(self, marker: Marker) -> Marker | bytes:
        return encode(marker) if self.p.codec else marker

    def _positions(self, region: str) -> None:
        infos = self._infos(region)
        positions = {n: self._read_position(region, n) for n in infos}
        last = len(self.q[region])
        running = self._instances(region)
        for inst in running:
            self._handle(region, inst, inst.machine.subscriptions_changed(infos))
            inst.reported = dict(positions)  # a deleted subscription has no position
            runs = inst.machine.origin_index_runs
            self._handle(region, inst, inst.machine.positions_read(positions, last))
            if inst.machine.origin_index_runs < runs:
                self.stats["index_trims"] += 1
            # A user's reset or deletion is known to the machine once it has the positions
            # (not when the listing before them is fed: `_check_reported` looks in between).
            inst.unread.clear()
        for inst in running:
            self._check_reported(region, inst)
        self._at(self.now + self.rng.randint(20, POSITIONS_GAP_MS), self._positions, region)

    def _local_subs(self, region: str) -> list[str]:
        return [n for n, s in self.subs.items() if region in s.copies]

    def _infos(self, region: str) -> dict[str, SubscriptionInfo]:
        return {
            n: SubscriptionInfo(self.subs[n].kind, True, n.encode())
            for n in self._local_subs(region)
        }

    def _handle(self, region: str, inst: _Instance, outputs: list[Output]) -> None:
        acts = [out for out in outputs if isinstance(out, Action)]
        if acts and inst.deposed:
            raise Violation(
                f"fencing: {region}'s leader of epoch {inst.epoch} acted after its region "
                f"wrote with epoch {inst.seen[region]}: {acts[0]}"
            )
        if acts and inst is not self.leaders[region] and inst.alive_until is not None:
            self.stats["stale_actions"] += len(acts)  # a zombie's or a woken frozen leader's
        for out in outputs:
            if isinstance(out, PublishReplicated):
                self._note("publish", region, out.marker)
                body = out.marker.body
                if isinstance(body, Update) and body.progress:
                    self._check_vector(region, body)
                self._append_w(region, self._wire(out.marker))
            elif isinstance(out, PublishLocal):
                body = out.marker.body
                if isinstance(body, Snapshot):
                    self._check_snapshot(region, body)
                self.q[region].append(self._wire(out.marker))
                self.q_time[region].append(self.now)
                self.local_marks[region].add(len(self.q[region]))
            elif isinstance(out, SubscriptionAction):
                self._carry_out(region, inst, out)
            elif isinstance(out, SnapshotCompleted):
                self.stats["snapshots"] += 1
            elif isinstance(out, SnapshotTimedOut):
                self.stats["timeouts"] += 1
            elif isinstance(out, UpdateSent):
                self.stats["updates"] += 1
            elif isinstance(out, UpdateApplied) and out.progress:
                self._check_progress(region, inst, out.subscription)
            elif isinstance(out, MarkerIgnored) and out.reason is IgnoreReason.STALE_EPOCH:
                self.stats["fenced"] += 1
        if outputs:
            self._check_reported(region, inst)

    def _carry_out(self, region: str, inst: _Instance, action: SubscriptionAction) -> None:
        """A move or creation, carried out or (some runs) failed at random, and its outcome
        told to the machine that asked for it, as the runtime's driver does. A move of a
        durable its user deleted finds nothing and is reported failed too (the runtime's
        `subscription_gone`); the machine forgets it at its next read of the subscriptions,
        and the next update creates it again (not a retry: `_check_retried` skips it)."""
        key = (region, action.subscription)
        if self.failed.pop(key, None) is not None:
            self.stats["retries"] += 1
        if self.p.action_failures and self.rng.random() < self.p.action_failures:
            self._note("move failed", region, action)
            self.stats["actions_failed"] += 1
            number = self.stats["actions_failed"]
            # A move of a durable its user deleted before (the machine has not read the
            # listing without it yet) fails whatever happens: it is gone, as below, and the
            # machine forgets it at that read, not a retry to wait for (seed 860853044175).
            if self._creating(action) or region in self.subs[action.subscription].copies:
                self.failed[key] = (number, action)
                self._at(
                    self.now + _RETRY_WINDOW_MS, self._check_retried, region, inst, action, number
                )
            self._handle(region, inst, inst.machine.action_failed(action))
        elif (copy := self._move(region, inst, action)) is None:
            self._note("move gone", region, action)
            self._handle(region, inst, inst.machine.action_failed(action))
        else:
            self._note("move", region, action)
            self._handle(region, inst, inst.machine.action_done(action, copy.floor))
        self._check_reported(region, inst)

    @staticmethod
    def _creating(action: SubscriptionAction) -> bool:
        return isinstance(action, CreateConsumer | CreateCursor)

    def _move(
        self,
        region: str,
        inst: _Instance,
        action: SubscriptionAction,
    ) -> _Copy | None:
        """Carries `action` out as the runtime does: the copy after it, or None when its user
        deleted the durable (`subscription_gone`: nothing moved, nothing created)."""
        sub = self.subs[action.subscription]
        creating = self._creating(action)
        reported = inst.reported.get(action.subscription)
        if not creating and reported is not None and action.ack_floor <= reported:
            raise Violation(
                f"{region}: move of {sub.name} to {action.ack_floor}, "
                f"not beyond the reported position {reported}"
            )
        floor = min(action.ack_floor, len(self.q[region]))
        copy = sub.copies.get(region)
        if copy is None and isinstance(action, MoveConsumer):
            # Its user deleted it: the runtime logs `subscription_gone` and creates nothing
            # (a stored cursor's `advance` does create an absent one).
            self.stats["moves_gone"] += 1
            return None
        if copy is None:
            copy = sub.copies[region] = _Copy(0, 1, high=sub.deleted_high.get(region, 0))
            self.stats["creates"] += 1
            self.stats["recreated"] += region in sub.deleted_high
        elif floor <= copy.floor:
            return copy  # the runtime moves forward only (and create-if-absent moves forward)
        self.stats["moves"] += 1
        if region == sub.home and copy.floor < sub.replay_until:
            self.stats["resets_undone"] += 1  # the sidecar cut a replay its user asked for short
        view = inst.machine.subscription(sub.name)
        snapshots = max((a.position for a in view.applied), default=0) if view else 0
        if action.ack_floor > snapshots:  # no snapshot applied here asked for this much
            self.stats["vector_moves"] += 1
            if self.down is not None:
                self.stats["outage_moves"] += 1
        copy.floor, copy.next_seq = floor, floor + 1
        copy.delivered.clear()
        copy.acked.clear()
        self._check_consumed(sub, region, floor)
        return copy

    # ---- consumers ----------------------------------------------------------------------

    def _consume(self, name: str) -> None:
        sub = self.subs[name]
        rng = self.rng
        self._at(self.now + rng.randint(5, 60), self._consume, name)
        if self.now < sub.stalled_until or sub.home == self.down:
            return
        if not self.healed and sub.pattern == "slow" and rng.random() < 0.1:
            sub.stalled_until = self.now + rng.randint(200, 2_500)
            return
        home = sub.home
        copy = sub.copies.get(home)
        if copy is None:
            return  # its user deleted it and has not created it again yet
        q = self.q[home]
        batch = self.p.consume_batch
        copy.next_seq = max(copy.next_seq, self.q_first[home])  # removed ones are skipped
        for _ in range(max(64, batch) if self.healed else rng.randint(1, batch)):
            while copy.next_seq <= len(q) and not isinstance(q[copy.next_seq - 1], Data):
                copy.next_seq += 1  # the data filter skips markers
            if copy.next_seq > len(q):
                break
            entry = q[copy.next_seq - 1]
            if not isinstance(entry, Data):
                raise Violation(f"{home}: consumer {name} received a marker")
            self._count_duplicate(sub, entry, copy.next_seq)
            copy.delivered.append(copy.next_seq)
            copy.next_seq += 1
        pattern = "inorder" if self.healed else sub.pattern
        if pattern in ("inorder", "slow") or (pattern == "burst" and rng.random() < 0.3):
            to_ack = list(copy.delivered)
        elif pattern == "random":
            to_ack = [s for s in copy.delivered if rng.random() < 0.5]
        else:
            to_ack = []
        for seq in to_ack:
            copy.acked.add(seq)
            entry = q[seq - 1]
            if isinstance(entry, Data):
                sub.consumed.add(self._identity(entry))
        self._advance_floor(sub, home, copy)
        copy.checked = max(copy.checked, copy.floor)

    def _count_duplicate(self, sub: _SimConsumer, data: Data, seq: int) -> None:
        """A native consumer gets every consumed message again; the exact client skips the
        ones its vector covers, which must all have been consumed (or be excused: never in
        the read stream where its vector was read, or removed there under the consumer).
        Messages replayed after a user reset are counted apart."""
        consumed = self._identity(data) in sub.consumed
        if data.origin_seq <= sub.skip.get(data.origin, 0):
            if not consumed and self._excuse(sub, data) is None:
                raise Violation(
                    f"{sub.home}: the exact client of {sub.name} skips ({data.origin}, "
                    f"{data.origin_seq}) covered by {sub.skip}, but it was never consumed"
                )
            exact = False
        else:
            exact = consumed
        if consumed and seq <= sub.replay_until:
            self.stats["replayed"] += 1
        elif consumed:
            self.stats["duplicates_native"] += 1
            self.stats["duplicates_exact"] += int(exact)

    def _identity(self, data: Data) -> int:
        """What consumption and loss are counted by: the logical message (its id)."""
        return data.msg_id

    def _read_position(self, region: str, name: str) -> int:
        """The position a sidecar reads. When nothing is left to deliver it is the stream's
        end, beyond the ack floor: what limits removed in between counts as passed there."""
        position = self._effective(region, name)
        sub = self.subs[name]
        copy, q = sub.copies[region], self.q[region]
        end = min(position, self.q_first[region] - 1)
        for seq in range(max(copy.floor, copy.checked) + 1, end + 1):
            entry = q[seq - 1]
            if isinstance(entry, Data) and self._identity(entry) not in sub.consumed:
                self._passed_removed(sub, region, entry)
        copy.checked = max(copy.checked, end)
        return position

    def _effective(self, region: str, name: str) -> int:
        """The read stream's last seq when nothing is pending or unacked (pending counts
        only what limits left in the stream), else the ack floor extended over what the
        consumer does not deliver right after it (`_covered`: markers, and removed
        messages, which the runtime's `STREAM.MSG.GET` with `next_by_subj` skips too)."""
        copy = self.subs[name].copies[region]
        q = self.q[region]
        seq = max(copy.next_seq, copy.floor + 1, self.q_first[region])
        while seq <= len(q) and not isinstance(q[seq - 1], Data):
            seq += 1
        if not copy.delivered and seq > len(q):
            return len(q)
        return self._covered(region, copy)

    def _covered(self, region: str, copy: _Copy) -> int:
        """The ack floor extended over what it cannot deliver right after it (markers and
        removed messages)."""
        q, first = self.q[region], self.q_first[region]
        seq = copy.floor + 1
        while seq <= len(q) and (seq < first or not isinstance(q[seq - 1], Data)):
            seq += 1
        return seq - 1

    # ---- chaos --------------------------------------------------------------------------

    def _chaos(self) -> None:
        if self.healed:
            return
        rng, p = self.rng, self.p
        self._at(self.now + rng.randint(50, 400), self._chaos)
        if self.down is not None:
            return  # the live regions stay calm during an outage (`_probe` needs it)
        choices = [
            c
            for c, on in (
                ("stall", p.stalls),
                ("crash", p.crashes),
                ("leader", p.leader_changes),
                ("partition", p.partitions),
                ("failover", p.failovers),
                ("garbage", p.garbage),
                ("reset", p.resets),
                ("purge", p.purges),
                ("delete", p.deletions),
                ("freeze", p.freezes),
            )
            if on
        ]
        if not choices:
            return
        kind = rng.choice(choices)
        region = rng.choice(self.regions)
        if kind == "stall":
            ch = self.channels[(region, rng.choice(self.regions))]
            ch.blocked_until = max(ch.blocked_until, self.now + rng.randint(100, 3_000))
        elif kind == "crash" and self.leaders[region] is not None:
            self._note("crash", region)
            self.stats["crashes"] += 1
            self.leaders[region] = None
            self.zombies[region].clear()
            self._at(self.now + rng.randint(50, 2_000), self._restart, region)
        elif kind == "leader" and self.leaders[region] is not None:
            old = self.leaders[region]
            assert old is not None
            old.alive_until = self.now + rng.randint(0, 1_500)
            self.stats["leader_changes"] += 1
            self.zombies[region].append(old)
            self._restart(region)
        elif kind == "partition":
            until = self.now + rng.randint(500, 4_000)
            self._note("partition", region, until)
            self.stats["partitions"] += 1
            for x in self.regions:
                if x != region:
                    for key in ((x, region), (region, x)):
                        ch = self.channels[key]
                        ch.blocked_until = max(ch.blocked_until, until)
        elif kind == "failover":
            self._failover(rng.choice(list(self.subs.values())))
        elif kind == "garbage":
            self._append_w(region, rng.randbytes(rng.randint(0, 40)))
        elif kind == "reset":
            self._reset(rng.choice(list(self.subs.values())))
        elif kind == "purge":
            self._purge(region)
        elif kind == "delete":
            self._delete(rng.choice(list(self.subs.values())))
        elif kind == "freeze" and self.leaders[region] is not None:
            self._freeze(region)

    def _delete(self, sub: _SimConsumer) -> None:
        """Its user deletes the subscription's copy in one region. The sidecar there learns it
        at its next read of the subscriptions; the next update naming the region creates it
        again (docs/operations.md, `subscription_gone`). In its home, the user creates it
        again (deliver all) unless the sidecar did first; until then nothing is consumed."""
        regions = [r for r in sub.copies if r != self.down]
        if not regions:
            return
        region = self.rng.choice(regions)
        copy = sub.copies.pop(region)
        high = max(sub.deleted_high.get(region, 0), copy.high, copy.floor)
        sub.deleted_high[region] = high
        self._user_changed(region, sub.name)
        # What a failed action asked for ends with it: the machine forgets the subscription
        # at its next read, and the next update creates it again.
        self.failed.pop((region, sub.name), None)
        self.stats["deletions"] += 1
        self._note("delete", sub.name, region, copy.floor)
        if region == sub.home:
            self._at(self.now + self.rng.randint(100, 1_500), self._user_create, sub.name, region)

    def _user_create(self, name: str, region: str) -> None:
        sub = self.subs[name]
        if region in sub.copies:
            return  # the sidecar created it first
        self._note("user create", name, region)
        self.stats["user_creates"] += 1
        high = sub.deleted_high[region]
        sub.copies[region] = _Copy(0, 1, high=high)
        self._user_changed(region, name)
        if region == sub.home:
            sub.replay_until = max(sub.replay_until, high)

    def _freeze(self, region: str) -> None:
        """The leader's process freezes (a GC pause, a VM stall): it reads, ticks and acts on
        nothing until it wakes. Shorter than the lease, it resumes as leader. Longer, the lease
        expires and a new leader takes over (`_takeover`); the old one wakes later with the
        state and epoch it had, and acts (a zombie) until it sees its region write with the
        newer epoch, or its runtime finds the lease lost."""
        leader = self.leaders[region]
        assert leader is not None
        rng = self.rng
        self.stats["freezes"] += 1
        frozen = rng.randint(50, 3 * LEASE_MS) if rng.random() < 0.7 else rng.randint(50, 6_000)
        leader.frozen_until = max(leader.frozen_until, self.now + frozen)
        self._note("freeze", region, leader.epoch, leader.frozen_until)
        if leader.frozen_until - self.now < LEASE_MS:
            return
        leader.alive_until = leader.frozen_until + rng.randint(0, LEASE_MS)
        self.leaders[region] = None
        self.zombies[region].append(leader)
        self._at(self.now + LEASE_MS, self._takeover, region)

    def _takeover(self, region: str) -> None:
        if self.leaders[region] is None:
            self.stats["takeovers"] += 1
            self._restart(region)

    def _reset(self, sub: _SimConsumer) -> None:
        """Its user resets the consumer in its home backwards (to replay): the ack floor goes
        down, possibly below what the sidecar trimmed from its origin index. Other regions
        must not move back; the messages stay consumed."""
        copy = sub.copies.get(sub.home)
        if copy is None or copy.floor == 0:
            return
        floor = 0 if self.rng.random() < 0.3 else self.rng.randint(0, copy.floor - 1)
        self._note("reset", sub.name, sub.home, copy.floor, floor)
        self.stats["resets"] += 1
        copy.high = max(copy.high, copy.floor)
        failed = self.failed.get((sub.home, sub.name))
        if failed is not None and self._covered(sub.home, copy) >= failed[1].ack_floor:
            del self.failed[(sub.home, sub.name)]  # it got there by itself: nothing to retry
        sub.replay_until = max(sub.replay_until, copy.floor)
        copy.floor, copy.next_seq = floor, floor + 1
        self._user_changed(sub.home, sub.name)
        copy.delivered.clear()
        copy.acked.clear()

    def _restart(self, region: str) -> None:
        if region == self.down or (self.leaders[region] is not None and not self.zombies[region]):
            return
        self.epochs[region] += 1
        self._note("leader", region, self.epochs[region])
        self.leaders[region] = self._new_instance(region)

    def _reap(self, region: str) -> None:
        zombies = self.zombies[region]
        if zombies:
            self.zombies[region] = [
                z for z in zombies if z.alive_until is not None and z.alive_until > self.now
            ]

    def _failover(self, sub: _SimConsumer) -> None:
        """The consumer moves to another region holding a copy; the exact client there takes
        the subscription's progress from that region's sidecar."""
        targets = [r for r in sub.copies if r not in (sub.home, self.down)]
        if not targets:
            return
        target = self.rng.choice(targets)
        self._note("failover", sub.name, sub.home, target)
        self.stats["failovers"] += 1
        sub.home = target
        sub.failovers += 1
        sub.replay_until = 0
        leader = self.leaders[target]
        view = leader.machine.subscription(sub.name) if leader is not None else None
        sub.skip = dict(view.progress) if view is not None else {}
        copy = sub.copies[target]
        self._check_consumed(sub, target, copy.floor)
        copy.next_seq = copy.floor + 1
        copy.delivered.clear()
        copy.acked.clear()

    def _unblock(self, keys: list[tuple[str, str]]) -> None:
        """End the stalls and partitions on these channels now."""
        for key in keys:
            ch = self.channels[key]
            ch.blocked_until = 0
            ch.generation += 1
            ch.scheduled = False
        for r in self.regions:
            self._wake(r)

    def _outage_start(self) -> None:
        """One region is cut off and its sidecar stopped; consumption there fails over. The
        live regions heal first and stay calm, so that vectors, the only thing that can move
        positions while a region does not answer, can be checked for liveness (`_probe`)."""
        rng, p = self.rng, self.p
        down = self.down = rng.choice(self.regions)
        self.outage_until = self.now + p.outage_ms
        self.stats["outages"] += 1
        self._note("outage", down, self.outage_until)
        live = [r for r in self.regions if r != down]
        for y in live:
            for key in ((down, y), (y, down)):
                ch = self.channels[key]
                ch.blocked_until = max(ch.blocked_until, self.outage_until)
        self._unblock(
            [(a, b) for a in live for b in live if self.channels[(a, b)].blocked_until > self.now]
        )
        self.leaders[down] = None
        self.zombies[down].clear()
        for r in live:
            leader = self.leaders[r]
            if leader is None:
                self._restart(r)
            else:
                leader.frozen_until = 0
        for sub in self.subs.values():
            if sub.home == down:
                self._failover(sub)
        self._at(self.now + rng.randint(p.outage_ms // 4, p.outage_ms // 2), self._outage_failover)
        self._at(self.now + 2 * p.interval_ms, self._probe)
        self._at(self.outage_until, self._outage_end)

    def _outage_failover(self) -> None:
        """Mid-outage, a consumer fails over from one live region to another (a third one)."""
        down = self.down
        movable = [s for s in self.subs.values() if any(r not in (s.home, down) for r in s.copies)]
        if down is not None and movable:
            self._failover(self.rng.choice(movable))

    def _outage_end(self) -> None:
        down, self.down = self.down, None
        self._note("outage over", down)
        if down is not None:
            self._restart(down)

    def _heal(self) -> None:
        self.healed = True
        self._note("heal")
        self._unblock(list(self.channels))
        for r in self.regions:
            self.zombies[r].clear()
            if self.leaders[r] is None:
                self._restart(r)
        for sub in self.subs.values():
            sub.stalled_until = 0
        self.heal_floors = {
            (n, r): c.floor for n, s in self.subs.items() for r, c in s.copies.items()
        }

    # ---- properties ---------------------------------------------------------------------

    def _check_snapshot(self, region: str, snap: Snapshot) -> None:
        for x in self.regions:
            if x == region:
                continue
            p = snap.positions.get(x)
            if p is None:
                raise Violation(f"snapshot {snap.id} of {region} has no position for {x}")
            prefix = self._prefix(x, region)
            if p >= len(prefix):
                raise Violation(
                    f"snapshot {snap.id}: data at or below {p} in {x} has not reached {region}"
                )
            if prefix[p] > snap.local_position:
                raise Violation(
                    f"snapshot {snap.id}: data at or below {p} in {x} lies at {prefix[p]} "
                    f"in {region}, beyond the local position {snap.local_position}"
                )

    def _prefix(self, x: str, a: str) -> list[int]:
        """prefix[k] = max position in Q_a of the data in Q_x[1..k], extended while known. A
        message Q_a dropped as a duplicate counts at its stored copy; one that never reaches
        Q_a (removed from its write stream first) does not count: the snapshot claim holds
        for the messages that reach the read stream."""
        prefix = self.prefix.setdefault((x, a), [0])
        qx, pos_a = self.q[x], self.pos[a]
        while len(prefix) <= len(qx):
            entry = qx[len(prefix) - 1]
            if isinstance(entry, Data):
                where = pos_a.get(entry.id) or self.dropped_at[a].get(entry.id)
                if where is None:
                    if not self._gone(entry.origin, entry.origin_seq, a):
                        break
                    where = 0
                prefix.append(max(prefix[-1], where))
            else:
                prefix.append(prefix[-1])
        return prefix

    def _gone(self, origin: str, origin_seq: int, region: str) -> bool:
        """Whether W_origin removed `origin_seq` before it reached Q_region."""
        ranges = self.gone[(origin, region)]
        k = bisect_right(ranges, (origin_seq, 2**62)) - 1
        return k >= 0 and ranges[k][0] <= origin_seq <= ranges[k][1]

    def _check_consumed(self, sub: _SimConsumer, region: str, floor: int) -> None:
        """No loss: every data message at or below `floor` in Q_region is a logical message
        some region consumed, or one whose skipping the guarantee allows (`_excuse`), or one
        removed from Q_region itself (it can never be delivered there)."""
        copy = sub.copies[region]
        q, first = self.q[region], self.q_first[region]
        for seq in range(copy.checked + 1, floor + 1):
            entry = q[seq - 1]
            if not isinstance(entry, Data) or self._identity(entry) in sub.consumed:
                continue
            if seq < first:  # it can never be delivered here
                self.stats["passed_removed_here"] += 1
                self._passed_removed(sub, region, entry)
                continue
            why = self._excuse(sub, entry)
            if why is None:
                raise Violation(
                    f"loss: {sub.name} in {region} moved to {floor}, but message {entry} "
                    f"at {seq} was never consumed"
                )
            self._note("excused", sub.name, region, entry, why)
        copy.checked = max(copy.checked, floor)

    def _excuse(self, sub: _SimConsumer, data: Data) -> str | None:
        """Why passing `data`, a logical message never consumed, is not a loss (None: it is).
        The guarantee is relative to the messages that reach the read stream: (a) a copy of
        it never reached Q_x (its write stream removed it first) and the subscription passed
        that gap in x (docs/protocol.md §6, case 3); (b) it was removed from a read stream
        before the copy there passed it (`_passed_removed`)."""
        removed = sub.excused.get(self._identity(data))
        if removed is not None:
            self.stats[removed[0]] += 1
            return removed[1]
        for copy in self.copies_of.get(data.msg_id, [data]):
            for x in self.regions:
                if not self._gone(copy.origin, copy.origin_seq, x):
                    continue
                resume = self.landed[(copy.origin, x)].after_seq(copy.origin_seq)
                if resume is not None and self._passed(sub, x) >= resume:
                    self.stats["excused_never_reached"] += 1
                    return f"{copy} never reached {x}, passed there"
        return None

    def _passed(self, sub: _SimConsumer, region: str) -> int:
        """How far the subscription's copy in `region` ever got (before a user reset or
        deletion too, and over removed messages its effective position stood beyond, which
        count as passed: `_read_position`); 0 where it never existed."""
        there = sub.copies.get(region)
        if there is None:
            return sub.deleted_high.get(region, 0)
        return max(there.high, there.floor, there.checked)

    def _check_vector(self, region: str, update: Update) -> None:
        """Claim 1: every data message `(o, s)` with `s <= v[o]` that Q_region holds or will
        hold lies at or below the position M the vector was read at; and every one it
        dropped as a duplicate was dropped for a copy stored at or below M (proof, case 2)."""
        m = update.progress_position
        if m > len(self.q[region]):
            raise Violation(f"claim 1: {region} read a vector at {m}, past its read stream")
        for origin, seq in update.progress.items():
            if origin not in self.w_data:
                raise Violation(f"claim 1: {region} sent progress for unknown origin {origin}")
            first = self._next_data(region, origin, m)
            if seq >= first:
                raise Violation(
                    f"claim 1: {region} sent {update.subscription} progress "
                    f"{dict(update.progress)} read at {m}, but ({origin}, {first}) lies above "
                    f"it in {region} (or has not reached it yet)"
                )
            dropped = self.dropped[(origin, region)]
            k = bisect_right(dropped.seqs, seq)
            self.stats["vectors_over_duplicates"] += k > 0
            if k and dropped.positions[k - 1] > m:
                raise Violation(
                    f"case 2: {region} sent {update.subscription} progress "
                    f"{dict(update.progress)} read at {m}, covering a duplicate of {origin} "
                    f"it dropped for a copy stored at {dropped.positions[k - 1]}"
                )
        self.stats["vectors_checked"] += 1

    def _next_data(self, region: str, origin: str, position: int) -> int:
        """The origin sequence of the first data message of `origin` that Q_region holds
        above `position`, or may still receive (in the channel); one past the end of its
        write stream when there is none."""
        above = self.held[(origin, region)].after_position(position)
        if above is not None:
            return above
        sent = self.channels[(origin, region)].next_index  # origin seqs <= it: landed or gone
        data = self.w_data[origin]
        k = bisect_right(data, sent, key=lambda d: d.origin_seq)
        return data[k].origin_seq if k < len(data) else len(self.w[origin]) + 1

    def _check_progress(self, region: str, inst: _Instance, name: str) -> None:
        """Every message the merged progress of `name` in `region` covers was consumed or is
        excused (what the exact client relies on when it skips them)."""
        view = inst.machine.subscription(name)
        if view is None:
            return
        sub = self.subs[name]
        for origin, seq in view.progress.items():
            data = self.w_data[origin]
            done = sub.consumed_prefix.get(origin, 0)
            while True:
                while done < len(data) and self._identity(data[done]) in sub.consumed:
                    done += 1
                if done == len(data) or data[done].origin_seq > seq:
                    break
                if self._excuse(sub, data[done]) is None:
                    raise Violation(
                        f"{region}: progress of {name} {dict(view.progress)} covers "
                        f"{data[done]}, never consumed"
                    )
                done += 1
            sub.consumed_prefix[origin] = done
            if seq > len(self.w[origin]):
                raise Violation(
                    f"{region}: progress of {name} {dict(view.progress)} covers "
                    f"({origin}, {seq}), never written"
                )

    def _vector_window(self) -> int:
        """How long a vector may take from the home's position covering a message to a move
        in another region: the home indexes it and reads its position, waits out the interval
        since its last vector, the channel carries it (latency and jitter), the other region
        tails it and, when its own index lagged, moves at its next position read. Each step
        is bounded by the model; an interval of slack on top."""
        p = self.p
        return 2 * p.interval_ms + 2 * p.max_latency_ms + 2 * (MAX_LAG_MS + POSITIONS_GAP_MS)

    def _probe(self) -> None:
        """Vector liveness during an outage: when the home's position covers the next data
        message above a copy in another live region, that copy advances within the window."""
        window = self._vector_window()
        if self.down is None or self.now + window > self.outage_until:
            return
        for sub in self.subs.values():
            home = sub.home
            if home == self.down or home not in sub.copies:
                continue
            m = self._effective(home, sub.name)
            for b in self.regions:
                if b in (home, self.down):
                    continue
                copy = sub.copies.get(b)
                # A copy its user deleted counts for how far it got: the next update, sent
                # once the home's position moves, creates it again (docs/operations.md).
                floor = copy.floor if copy is not None else sub.deleted_high.get(b, 0)
                q = self.q[b]
                seq = floor + 1
                while seq <= len(q) and not isinstance(q[seq - 1], Data):
                    seq += 1
                entry = q[seq - 1] if seq <= len(q) else None
                # Covered by the home's vector: it lies at or below M there (per-origin order),
                # and is still in the home's stream (a sidecar restarted after limits removed
                # it never indexed it: its origin is covered only once it writes again).
                at_home = _NOT_HELD
                if isinstance(entry, Data):
                    at_home = self.pos[home].get(entry.id, _NOT_HELD)
                if self.q_first[home] <= at_home <= m:
                    args = (sub.name, b, floor, sub.failovers)
                    self._at(self.now + window, self._probe_check, *args)
        self._at(self.now + self.rng.randint(2, 4) * self.p.interval_ms, self._probe)

    def _probe_check(self, name: str, region: str, floor: int, failovers: int) -> None:
        sub = self.subs[name]
        if sub.failovers != failovers:
            return  # the home changed in the meantime: another probe covers it
        copy = sub.copies.get(region)
        if copy is None or copy.floor <= floor:
            raise Violation(
                f"vector liveness: {name} (home {sub.home}) still at {floor} in {region} "
                f"{self._vector_window()} ms after the home covered the next message there "
                f"(outage of {self.down})"
            )
        self.stats["outage_advances"] += 1

    def _check_fenced(
        self, region: str, inst: _Instance, marker: Marker, outputs: list[Output]
    ) -> None:
        """Fencing (docs/protocol.md §2): a marker whose epoch is below one its region already
        wrote, as fed to this instance, changes nothing (no action, nothing applied); once an
        instance was fed a marker its own region wrote with a newer epoch than its own, it
        never acts again (`_handle`)."""
        seen = inst.seen.get(marker.region, 0)
        if marker.epoch < seen:
            acted = [o for o in outputs if not isinstance(o, MarkerIgnored | MarkerRejected)]
            if acted:
                raise Violation(
                    f"fencing: {region} acted on {_short(marker)} after {marker.region} wrote "
                    f"with epoch {seen}: {acted[0]}"
                )
        inst.seen[marker.region] = max(seen, marker.epoch)
        if marker.region == region and marker.epoch > inst.epoch and not inst.deposed:
            inst.deposed = True
            self.stats["deposed"] += 1

    def _check_applied(self, region: str, inst: _Instance, outputs: list[Output]) -> None:
        if inst is not self.leaders[region]:
            return
        for out in outputs:
            if not isinstance(out, UpdateApplied):
                continue
            view = inst.machine.subscription(out.subscription)
            if view is None or view.mark_delete is None:
                continue
            if out.position is None or out.subscription in inst.unread:
                # The machine decided on a position read before its user reset it, or it
                # was deleted since (a move finds nothing; the next update creates it again).
                continue
            if (region, out.subscription) in self.failed:
                continue  # its move or creation failed: `_check_retried` follows it
            copy = self.subs[out.subscription].copies.get(region)
            if copy is None or self._covered(region, copy) < out.position:
                raise Violation(
                    f"{region}: update of {out.subscription} to {out.position} from "
                    f"{out.from_region} accepted but not carried out"
                )

    def _check_reported(self, region: str, inst: _Instance) -> None:
        """The mark-delete a machine reports (what the API answers, failover clients resume
        after, duplicates are bounded by) is never above where the copy stands, and names
        only copies there, unless its user reset, deleted or created the copy since this
        instance last read it."""
        for name, sub in self.subs.items():
            view = inst.machine.subscription(name)
            if view is None or not view.exists or view.mark_delete is None or name in inst.unread:
                continue
            copy = sub.copies.get(region)
            if copy is None:
                raise Violation(
                    f"reported: {region} reports {name} at {view.mark_delete}, absent there"
                )
            if view.mark_delete > self._covered(region, copy):
                raise Violation(
                    f"reported: {region} reports {name} at {view.mark_delete}, but its copy "
                    f"stands at {self._covered(region, copy)}"
                )

    def _check_retried(
        self, region: str, inst: _Instance, action: SubscriptionAction, number: int
    ) -> None:
        """A failed move or creation is asked for again (the copy not there otherwise)."""
        if self.failed.get((region, action.subscription), (0, action))[0] != number:
            return  # asked for again meanwhile, or its user reset or deleted the copy
        if inst is not self.leaders[region]:
            return  # deposed or crashed: its successor derives the actions from the stream
        if inst.frozen_until > self.now - _RETRY_WINDOW_MS:
            # Frozen for part of the window (shorter than the lease: still the leader): it
            # has a whole window once awake.
            wake = max(self.now, inst.frozen_until)
            self._at(wake + _RETRY_WINDOW_MS, self._check_retried, region, inst, action, number)
            return
        copy = self.subs[action.subscription].copies.get(region)
        if copy is not None and self._covered(region, copy) >= action.ack_floor:
            return
        raise Violation(
            f"retried: {region} failed {action} {_RETRY_WINDOW_MS} ms ago and has not asked "
            f"for it again (copy at {None if copy is None else copy.floor})"
        )

    def _check_liveness(self) -> None:
        for r in {r for (_, r) in self.heal_floors}:
            leader = self.leaders[r]
            assert leader is not None
            if not any(s.started_ms >= self.heal_at for s in leader.machine.completed_snapshots()):
                raise Violation(f"liveness: {r} completed no snapshot after healing")
        for name, sub in self.subs.items():
            if self.heal_floors.get((name, sub.home), 0) < sub.deleted_high.get(sub.home, 0):
                # Its user deleted the home's copy and it was created again below where it
                # had got (by the user: delivering all): the other copies follow only once it
                # has consumed past them again, which takes as long as the data it redelivers.
                continue
            for r in self.regions:
                if r == sub.home:
                    continue
                copy = sub.copies.get(r)
                before = self.heal_floors.get((name, r))
                if copy is None or (before is not None and copy.floor <= before):
                    raise Violation(
                        f"liveness: {name} (home {sub.home}) did not advance in {r} "
                        f"after healing (floor {None if copy is None else copy.floor})"
                    )


def _short(value: object) -> str:
    if not isinstance(value, Marker):
        return str(value)
    body = value.body
    if isinstance(body, Update):
        text = f"{body.snapshot_id} {body.subscription} {dict(body.positions)}"
        if body.progress:
            text += f" progress={dict(body.progress)}@{body.progress_position}"
    elif isinstance(body, Snapshot):
        text = f"{body.id} local={body.local_position} {dict(body.positions)}"
    elif isinstance(body, Response):
        text = f"{body.id} round={body.round} position={body.position}"
    else:
        text = f"{body.id} round={body.round}"
    return f"{type(body).__name__}({text} from {value.region} e{value.epoch})"


def run(
    seed: int,
    params: SimParams | None = None,
    factory: MachineFactory = StreamMachine,
) -> WorldResult:
    """One run; parameters are drawn from the seed when not given."""
    if params is None:
        params = SimParams.draw(random.Random(seed ^ 0x5EED))
    return World(seed, params, factory).run()
