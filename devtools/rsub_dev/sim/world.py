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
  reads positions; its outputs are carried out at once (publishes, moves, creates); a
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
  enough for the sidecars to trim their origin indexes.

Properties (checked when the state they depend on changes, which is after every step that
could break them; read streams are append-only and consumption only grows, so a property that
held stays true):
- snapshot safety: a completed snapshot of `a` names every other region `x`, and every data
  message at or below its position in Q_x lies at or below its local position in Q_a;
- no loss: whenever a subscription's copy in a region is moved, created or becomes the home,
  every data message at or below its ack floor there has been consumed;
- monotonic: a machine never asks to move a subscription to or below the position it last
  reported; the runtime applies moves forward only; consumers never receive markers;
- applied: after a leader accepted an update naming its region at position p, the copy
  there stands at or beyond p;
- claim 1 (DESIGN §7), when an update with a progress vector `v` read at `M` is published
  in `a`: every data message `(o, s)` with `s <= v[o]` that Q_a holds or will hold lies at
  or below `M`;
- covered means consumed: whenever a region accepts a vector, every message its merged
  progress covers has been consumed; an exact client (after a failover it skips what the
  new home's progress covers) therefore skips only consumed messages. Duplicates are
  counted for a native consumer and for the exact client;
- liveness (healed phase): every region holding a subscription when healed completes a
  snapshot, and every remote copy of every subscription is created or advances;
- vector liveness (outages): when the home's position covers the next data message above a
  copy in another live region, that copy advances within `_vector_window`.
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

from sidecar.protocol import (
    CreateConsumer,
    CreateCursor,
    IgnoreReason,
    MachineConfig,
    Marker,
    MarkerIgnored,
    MoveConsumer,
    MoveCursor,
    Output,
    PublishLocal,
    PublishReplicated,
    Rejected,
    Response,
    Snapshot,
    SnapshotCompleted,
    SnapshotTimedOut,
    StreamMachine,
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
MAX_LAG_MS = 300  # the longest a sidecar's marker tail or data index lags its read stream
POSITIONS_GAP_MS = 100  # the longest between two reads of a region's consumer positions
_NOT_HELD = 2**62  # the read position of a message a read stream does not hold yet


@dataclass(frozen=True, slots=True)
class Data:
    """A data message: a unique `id`, written at `origin_seq` of region `origin`'s write stream
    (markers written there take origin sequences too, so data sequences have gaps)."""

    id: int
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

    def __post_init__(self) -> None:
        if not 1 <= self.regions <= 9:
            raise ValueError(f"regions must be 1..9, got {self.regions}")
        if self.subscriptions < 1:
            raise ValueError(f"subscriptions must be positive, got {self.subscriptions}")
        if self.consume_batch < 1:
            raise ValueError(f"consume_batch must be positive, got {self.consume_batch}")
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
        consumers keep up, or no copy could advance soon after healing)."""
        regions = regions if regions is not None else rng.randint(2, 5)
        chaos_ms, outage_ms = rng.randint(1_000, 4_000), 0
        if regions >= 3 and rng.random() < 0.25:
            outage_ms = rng.randint(2_000, 5_000)
            chaos_ms += outage_ms
        produce_gap_ms, consume_batch = rng.randint(15, 100), 8
        if rng.random() < 0.05:
            chaos_ms, produce_gap_ms = chaos_ms + rng.randint(8_000, 16_000), rng.randint(3, 8)
            consume_batch = 100 * regions // produce_gap_ms
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
        )


@dataclass(slots=True)
class SimResult:
    seed: int
    params: SimParams
    violation: str | None
    trace: list[str]
    stats: dict[str, int]

    def report(self) -> str:
        lines = [f"seed={self.seed} params={self.params}", f"stats={self.stats}"]
        if self.violation:
            lines += [f"VIOLATION: {self.violation}", "last events:", *self.trace]
        return "\n".join(lines)


class Violation(Exception):
    pass


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
    checked: int = 0  # every data message <= checked is known consumed


@dataclass(slots=True)
class _SimConsumer:
    name: str
    kind: SubscriptionKind
    home: str
    pattern: str
    copies: dict[str, _Copy]
    consumed: set[int] = field(default_factory=set)  # data ids
    stalled_until: int = 0
    failovers: int = 0
    skip: dict[str, int] = field(default_factory=dict)
    """The exact client's vector: the progress the home held when the consumer failed over
    to it; the client skips the data messages it covers."""
    consumed_prefix: dict[str, int] = field(default_factory=dict)
    """Per origin, how many of its data messages (in write order) are all consumed."""


@dataclass(slots=True)
class _Instance:
    machine: StreamMachine
    tail: int  # seqs <= tail were given to the machine as markers
    indexed: int  # seqs <= indexed were given to the machine as data
    reported: dict[str, int] = field(default_factory=dict)
    alive_until: int | None = None  # zombies stop at this time


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
            ),
            0,
        )
        self.trace: deque[tuple[int, str, tuple[object, ...]]] = deque(maxlen=trace_len)
        self._queue: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self._n = 0

    # ---- scheduling ---------------------------------------------------------------------

    def _at(self, t: int, fn: Callable[..., None], *args: object) -> None:
        self._n += 1
        heapq.heappush(self._queue, (t, self._n, fn, args))

    def _note(self, what: str, *args: object) -> None:
        self.trace.append((self.now, what, args))

    def run(self) -> SimResult:
        violation = None
        try:
            self._setup()
            end = self.p.chaos_ms + self.p.heal_ms
            while self._queue and self._queue[0][0] <= end:
                t, _, fn, args = heapq.heappop(self._queue)
                self.now = t
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
        q = self.q[region]
        markers: list[tuple[int, Marker]] = []
        for seq, entry in enumerate(q, start=1):
            if isinstance(entry, bytes):
                decoded = decode(entry, stream=STREAM, regions=self.regions)
                if isinstance(decoded, Marker):
                    markers.append((seq, decoded))
            elif isinstance(entry, Marker):
                markers.append((seq, entry))
        positions = {n: self._effective(region, n) for n in self._local_subs(region)}
        machine = self.factory.restore(
            config,
            markers,
            self._infos(region),
            positions,
            len(q),
            self.now,
            data=self._data_entries(region, 0, len(q)),
        )
        inst = _Instance(machine, len(q), len(q), dict(positions))
        self._handle(region, inst, machine.became_leader(self.epochs[region]))
        return inst

    def _instances(self, region: str) -> list[_Instance]:
        leader = self.leaders[region]
        return ([leader] if leader else []) + self.zombies[region]

    # ---- data plane ---------------------------------------------------------------------

    def _produce(self, region: str) -> None:
        self.next_id += 1
        self.stats["data"] += 1
        data = Data(self.next_id, region, len(self.w[region]) + 1)
        self.w_data[region].append(data)
        self._append_w(region, data)
        self._at(self.now + self.rng.randint(1, 2 * self.p.produce_gap_ms), self._produce, region)

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
        horizon = self.now - ch.latency
        for _ in range(self.rng.randint(1, 32)):
            if ch.next_index >= len(source) or times[ch.next_index] > horizon:
                break
            entry = source[ch.next_index]
            ch.next_index += 1
            q.append(entry)
            if isinstance(entry, Data):
                pos[entry.id] = len(q)
        if ch.next_index < len(source):
            self._at(self._ready(origin, ch), self._deliver, origin, target, generation)
        else:
            ch.scheduled = False

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
            while inst.tail < len(q):
                inst.tail += 1
                entry = q[inst.tail - 1]
                if not isinstance(entry, Data):
                    out = self._feed(inst.machine, inst.tail, entry)
                    self._handle(region, inst, out)
                    self._check_applied(region, inst, out)
        self._at(self.now + self._lag(), self._tail, region)

    def _index(self, region: str) -> None:
        """The data messages' origins, tailed apart from the markers (as the runtime does)."""
        end = len(self.q[region])
        for inst in self._instances(region):
            entries = self._data_entries(region, inst.indexed, end)
            inst.indexed = end
            self._handle(region, inst, inst.machine.data_indexed(entries))
        self._at(self.now + self._lag(), self._index, region)

    def _lag(self) -> int:
        rng = self.rng
        return rng.randint(1, MAX_LAG_MS) if rng.random() < 0.05 else rng.randint(5, 50)

    def _data_entries(self, region: str, after: int, end: int) -> list[DataEntry]:
        """The data messages of Q_region in (after, end], as the runtime reads their headers."""
        q = self.q[region]
        return [
            DataEntry(seq, e.origin, e.origin_seq)
            for seq in range(after + 1, end + 1)
            if isinstance(e := q[seq - 1], Data)
        ]

    def _feed(self, machine: StreamMachine, seq: int, entry: Marker | bytes) -> list[Output]:
        if isinstance(entry, Marker):
            return machine.marker_seen(seq, entry)
        decoded = decode(entry, stream=STREAM, regions=self.regions)
        if isinstance(decoded, Rejected):
            self.stats["rejected"] += 1
            return machine.marker_rejected(seq, decoded)
        return machine.marker_seen(seq, decoded)

    def _wire(self, marker: Marker) -> Marker | bytes:
        return encode(marker) if self.p.codec else marker

    def _positions(self, region: str) -> None:
        infos = self._infos(region)
        positions = {n: self._effective(region, n) for n in infos}
        last = len(self.q[region])
        for inst in self._instances(region):
            self._handle(region, inst, inst.machine.subscriptions_changed(infos))
            inst.reported.update(positions)
            runs = inst.machine.origin_index_runs
            self._handle(region, inst, inst.machine.positions_read(positions, last))
            if inst.machine.origin_index_runs < runs:
                self.stats["index_trims"] += 1
        self._at(self.now + self.rng.randint(20, POSITIONS_GAP_MS), self._positions, region)

    def _local_subs(self, region: str) -> list[str]:
        return [n for n, s in self.subs.items() if region in s.copies]

    def _infos(self, region: str) -> dict[str, SubscriptionInfo]:
        return {
            n: SubscriptionInfo(self.subs[n].kind, True, n.encode())
            for n in self._local_subs(region)
        }

    def _handle(self, region: str, inst: _Instance, outputs: list[Output]) -> None:
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
            elif isinstance(out, MoveConsumer | MoveCursor | CreateConsumer | CreateCursor):
                self._note("move", region, out)
                self._move(region, inst, out)
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

    def _move(
        self,
        region: str,
        inst: _Instance,
        action: MoveConsumer | MoveCursor | CreateConsumer | CreateCursor,
    ) -> None:
        sub = self.subs[action.subscription]
        creating = isinstance(action, CreateConsumer | CreateCursor)
        reported = inst.reported.get(action.subscription)
        if not creating and reported is not None and action.ack_floor <= reported:
            raise Violation(
                f"{region}: move of {sub.name} to {action.ack_floor}, "
                f"not beyond the reported position {reported}"
            )
        floor = min(action.ack_floor, len(self.q[region]))
        copy = sub.copies.get(region)
        if copy is None:
            copy = sub.copies[region] = _Copy(0, 1)
            self.stats["creates"] += 1
        elif floor <= copy.floor:
            return  # the runtime moves forward only (and create-if-absent moves forward)
        self.stats["moves"] += 1
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
        copy = sub.copies[home]
        q = self.q[home]
        batch = self.p.consume_batch
        for _ in range(max(64, batch) if self.healed else rng.randint(1, batch)):
            while copy.next_seq <= len(q) and not isinstance(q[copy.next_seq - 1], Data):
                copy.next_seq += 1  # the data filter skips markers
            if copy.next_seq > len(q):
                break
            entry = q[copy.next_seq - 1]
            if not isinstance(entry, Data):
                raise Violation(f"{home}: consumer {name} received a marker")
            self._count_duplicate(sub, entry)
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
                sub.consumed.add(entry.id)
        while copy.delivered and copy.delivered[0] in copy.acked:
            seq = copy.delivered.popleft()
            copy.acked.discard(seq)
            copy.floor = seq
        copy.checked = max(copy.checked, copy.floor)

    def _count_duplicate(self, sub: _SimConsumer, data: Data) -> None:
        """A native consumer gets every consumed message again; the exact client skips the
        ones its vector covers, which must all have been consumed."""
        if data.origin_seq <= sub.skip.get(data.origin, 0):
            if data.id not in sub.consumed:
                raise Violation(
                    f"{sub.home}: the exact client of {sub.name} skips ({data.origin}, "
                    f"{data.origin_seq}) covered by {sub.skip}, but it was never consumed"
                )
            self.stats["duplicates_native"] += 1
        elif data.id in sub.consumed:
            self.stats["duplicates_native"] += 1
            self.stats["duplicates_exact"] += 1

    def _effective(self, region: str, name: str) -> int:
        """Ack floor, or the read stream's last seq when nothing is pending or unacked."""
        copy = self.subs[name].copies[region]
        q = self.q[region]
        seq = max(copy.next_seq, copy.floor + 1)
        while seq <= len(q) and not isinstance(q[seq - 1], Data):
            seq += 1
        if not copy.delivered and seq > len(q):
            return len(q)
        return copy.floor

    def _covered(self, region: str, copy: _Copy) -> int:
        """The ack floor extended over the markers right after it (nothing left to deliver)."""
        q = self.q[region]
        seq = copy.floor + 1
        while seq <= len(q) and not isinstance(q[seq - 1], Data):
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
            if self.leaders[r] is None:
                self._restart(r)
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
        """prefix[k] = max position in Q_a of the data in Q_x[1..k], extended while known."""
        prefix = self.prefix.setdefault((x, a), [0])
        qx, pos_a = self.q[x], self.pos[a]
        while len(prefix) <= len(qx):
            entry = qx[len(prefix) - 1]
            if isinstance(entry, Data):
                where = pos_a.get(entry.id)
                if where is None:
                    break
                prefix.append(max(prefix[-1], where))
            else:
                prefix.append(prefix[-1])
        return prefix

    def _check_consumed(self, sub: _SimConsumer, region: str, floor: int) -> None:
        copy = sub.copies[region]
        q = self.q[region]
        for seq in range(copy.checked + 1, floor + 1):
            entry = q[seq - 1]
            if isinstance(entry, Data) and entry.id not in sub.consumed:
                raise Violation(
                    f"loss: {sub.name} in {region} moved to {floor}, but message {entry} "
                    f"at {seq} was never consumed"
                )
        copy.checked = max(copy.checked, floor)

    def _held(self, region: str, origin: str, position: int) -> int:
        """How many data messages of `origin` lie at or below `position` in Q_region: a prefix
        of them in write order, since sourcing keeps each origin's order."""
        pos = self.pos[region]
        return bisect_right(self.w_data[origin], position, key=lambda d: pos.get(d.id, _NOT_HELD))

    def _first_after(self, origin: str, count: int) -> int:
        """The origin sequence of `origin`'s data message after its first `count` ones (one
        past its write stream's end when none is written yet)."""
        data = self.w_data[origin]
        return data[count].origin_seq if count < len(data) else len(self.w[origin]) + 1

    def _check_vector(self, region: str, update: Update) -> None:
        """Claim 1: every data message `(o, s)` with `s <= v[o]` that Q_region holds or will
        hold lies at or below the position M the vector was read at."""
        m = update.progress_position
        if m > len(self.q[region]):
            raise Violation(f"claim 1: {region} read a vector at {m}, past its read stream")
        for origin, seq in update.progress.items():
            if origin not in self.w_data:
                raise Violation(f"claim 1: {region} sent progress for unknown origin {origin}")
            held = self._held(region, origin, m)
            first = self._first_after(origin, held)
            if seq >= first:
                data = self.w_data[origin]
                where = self.pos[region].get(data[held].id) if held < len(data) else None
                raise Violation(
                    f"claim 1: {region} sent {update.subscription} progress "
                    f"{dict(update.progress)} read at {m}, but ({origin}, {first}) lies at "
                    f"{where or 'no position yet'} in {region}"
                )
        self.stats["vectors_checked"] += 1

    def _check_progress(self, region: str, inst: _Instance, name: str) -> None:
        """Every message the merged progress of `name` in `region` covers was consumed (what
        the exact client relies on when it skips them)."""
        view = inst.machine.subscription(name)
        if view is None:
            return
        sub = self.subs[name]
        for origin, seq in view.progress.items():
            data = self.w_data[origin]
            done = sub.consumed_prefix.get(origin, 0)
            while done < len(data) and data[done].id in sub.consumed:
                done += 1
            sub.consumed_prefix[origin] = done
            if seq >= self._first_after(origin, done):
                raise Violation(
                    f"{region}: progress of {name} {dict(view.progress)} covers "
                    f"({origin}, {self._first_after(origin, done)}), never consumed"
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
            if home == self.down:
                continue
            m = self._effective(home, sub.name)
            for b in self.regions:
                if b in (home, self.down):
                    continue
                copy = sub.copies.get(b)
                floor = copy.floor if copy is not None else 0
                q = self.q[b]
                seq = floor + 1
                while seq <= len(q) and not isinstance(q[seq - 1], Data):
                    seq += 1
                entry = q[seq - 1] if seq <= len(q) else None
                # Covered by the home's vector: it lies at or below M there (per-origin order).
                if isinstance(entry, Data) and self.pos[home].get(entry.id, _NOT_HELD) <= m:
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

    def _check_applied(self, region: str, inst: _Instance, outputs: list[Output]) -> None:
        if inst is not self.leaders[region]:
            return
        for out in outputs:
            if not isinstance(out, UpdateApplied):
                continue
            view = inst.machine.subscription(out.subscription)
            if view is None or view.mark_delete is None:
                continue
            copy = self.subs[out.subscription].copies.get(region)
            if out.position is None:
                continue
            if copy is None or self._covered(region, copy) < out.position:
                raise Violation(
                    f"{region}: update of {out.subscription} to {out.position} from "
                    f"{out.from_region} accepted but not carried out"
                )

    def _check_liveness(self) -> None:
        for r in {r for (_, r) in self.heal_floors}:
            leader = self.leaders[r]
            assert leader is not None
            if not any(s.started_ms >= self.heal_at for s in leader.machine.completed_snapshots()):
                raise Violation(f"liveness: {r} completed no snapshot after healing")
        for name, sub in self.subs.items():
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
) -> SimResult:
    """One run; parameters are drawn from the seed when not given."""
    if params is None:
        params = SimParams.draw(random.Random(seed ^ 0x5EED))
    return World(seed, params, factory).run()
