"""What the runtime tells a `StreamMachine` besides markers and data: its configuration, the
local subscriptions, and one read of their positions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.protocol.markers import SubscriptionKind


@dataclass(frozen=True, slots=True)
class MachineConfig:
    region: str
    stream: str
    regions: tuple[str, ...]
    interval_ms: int = 1000
    timeout_ms: int = 30_000
    cache_size: int = 30
    history_size: int = 100
    progress: bool = True
    """Progress vectors (DESIGN §7): sent, and applied when received. Off, the machine is
    PIP-33 only (its index stays empty and received vectors are ignored)."""
    progress_interval_ms: int | None = None
    """The least time between two updates of a subscription that carry a changed vector and
    no newer snapshot (None: `interval_ms`); an update with a newer snapshot goes out at once."""
    hold_ms: int = 120_000
    """The failback guard (docs/protocol.md §7): how long a returning region holds its
    replicated durables at most while waiting for the other regions' progress (0: no guard)."""
    lease_ttl_ms: int = 10_000
    """How long the region's leader keeps its lease unrenewed (`lease.ttl_s`): another replica
    may lead and move the durables only once a leader went that long without renewing, so a
    positions read that far from the previous one may find another leader's moves (§8)."""

    @property
    def vector_interval_ms(self) -> int:
        """`progress_interval_ms`, or `interval_ms` when not set."""
        return self.progress_interval_ms or self.interval_ms

    @property
    def active_window_ms(self) -> int:
        """How long a region counts as consuming a subscription after its consumers last
        passed its data (docs/protocol.md §8): ten intervals, time for several updates."""
        return 10 * self.interval_ms

    def __post_init__(self) -> None:
        if self.region not in self.regions:
            raise ValueError(f"region {self.region!r} is not in regions {self.regions}")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"regions must be unique: {self.regions}")
        if self.hold_ms < 0:
            raise ValueError(f"hold_ms must not be negative, got {self.hold_ms}")
        if self.progress_interval_ms is not None and self.progress_interval_ms <= 0:
            raise ValueError(
                f"progress_interval_ms must be positive, got {self.progress_interval_ms}"
            )
        for name in ("interval_ms", "timeout_ms", "history_size", "lease_ttl_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.cache_size < 2:
            raise ValueError(f"cache_size must be at least 2, got {self.cache_size}")


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """What the runtime knows about a local subscription; `config` is opaque to the protocol."""

    kind: SubscriptionKind = SubscriptionKind.DURABLE
    replicated: bool = True
    config: bytes = b""


@dataclass(frozen=True, slots=True)
class PositionsListing:
    """One read of a stream's local subscriptions and their positions (`read_done` when the
    machine asked for it with `ReadPositions`, `positions_listed` otherwise)."""

    generation: int
    """`StreamMachine.generation` when the read began: a listing begun before a creation the
    machine asked for may lack the subscription created, so its set of subscriptions is
    ignored (its positions are not)."""
    subscriptions: Mapping[str, SubscriptionInfo]
    positions: Mapping[str, int]
    """Effective mark-delete positions of the replicated subscriptions (`positions_read`)."""
    last_seq: int
    """The read stream's last sequence, read before the positions."""
    follows_end: bool
    """Whether a position depended on the read stream's end: an external cursor (markers
    after it count as consumed) or a replicated durable at `last_seq`. Such a position can
    move when only the stream grows; any other moves only by a signal (an ack, a reset, a
    commit, a creation) or what a sweep catches."""
    sources: Mapping[str, int | None] = field(default_factory=dict)
    """Per other region, from the read stream's state: how long ago (ms) it last heard from
    that region's write stream, None when not once since the stream's server started (its
    `sources[].active` of -1). A region missing is not known (no guard decision rests on it)."""
    leader_age_ms: int | None = None
    """How long ago the read stream's current leader was elected (`cluster.leader_since`),
    None when the server does not say."""
    first_seq: int = 0
    """The read stream's first sequence, read after every position listed (0: not known):
    below it the stream removed its messages (limits, purges), and a durable's floor follows
    by itself (docs/protocol.md §8)."""
    read_ms: int = 0
    """When the read ended, on the machine's clock (0: not known)."""
    acked: Mapping[str, Acks] = field(default_factory=dict)
    """Per consumer acked by its applications in this region since the previous read, its
    acks (the acks' signals: best effort): the consumption signs (§8), and the messages
    acked above its floor (§6)."""
    stream_age_ms: int | None = None
    """How long ago the read stream was created (`STREAM.INFO`'s `created`), None when the
    server does not say: a leader elected with the stream is its first, no return's."""
    lease_epoch: int | None = None
    """The epoch of this replica's lease on the stream when the read began, if the lease
    still held it when the read ended; 0 when it did not (not leading at either end, or
    lost and taken again meanwhile); None when not known. Only a read wholly under the
    machine's own epoch shows what its consumers did: while it leads with one epoch no other
    replica of the region leads (docs/protocol.md §8)."""
    paused: Mapping[str, int] = field(default_factory=dict)
    """Per replicated durable paused when listed, how long its pause has left (ms): a hold of
    the failback guard that a leader before this one left standing among them (§7)."""


@dataclass(frozen=True, slots=True)
class Acks:
    """The acks of one consumer's applications heard since the previous read."""

    heard_ms: int
    """When the last was heard (the machine's clock)."""
    seqs: tuple[int, ...]
    """The read-stream sequences they settled, as heard."""
