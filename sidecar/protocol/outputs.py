"""What a `StreamMachine` returns: actions the runtime carries out, reads it asks the runtime
for, and events for metrics, logs and the API."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.protocol.markers import Marker, Rejected, Snapshot, SnapshotId

# ---- actions: the runtime must carry these out -------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishReplicated:
    """Publish to this region's write stream (reaches every read stream)."""

    marker: Marker


@dataclass(frozen=True, slots=True)
class PublishLocal:
    """Publish to this region's read stream only (completed snapshots)."""

    marker: Marker


@dataclass(frozen=True, slots=True)
class MoveConsumer:
    """Move a durable forward: reset to seq `ack_floor + 1` (clamped to last_seq + 1)."""

    subscription: str
    ack_floor: int


@dataclass(frozen=True, slots=True)
class MoveCursor:
    """Move a stored external cursor forward to `ack_floor`."""

    subscription: str
    ack_floor: int


@dataclass(frozen=True, slots=True)
class CreateConsumer:
    """Create an absent durable with `config`, starting after `ack_floor`."""

    subscription: str
    config: bytes
    ack_floor: int


@dataclass(frozen=True, slots=True)
class CreateCursor:
    """Create an absent external cursor at `ack_floor`."""

    subscription: str
    config: bytes
    ack_floor: int


@dataclass(frozen=True, slots=True)
class HoldConsumer:
    """Pause a replicated durable (`CONSUMER.PAUSE`) for `hold_ms` at most: its region has
    returned and does not know yet what the other regions consumed meanwhile (the failback
    guard, docs/protocol.md §7). The deadline bounds the hold if no release ever comes."""

    subscription: str
    hold_ms: int


@dataclass(frozen=True, slots=True)
class ReleaseConsumer:
    """Resume a durable held by `HoldConsumer`."""

    subscription: str


# ---- reads: the runtime reads and reports back ---------------------------------------------


class ReadReason(enum.Enum):
    SIGNAL = "signal"
    """An ack, a consumer advisory or a cursor write said positions may have moved."""
    GREW = "grew"
    """The read stream grew while a position follows its end."""
    SWEEP = "sweep"
    """The stream's turn in the sweep that catches missed signals (every replica)."""
    LEADERSHIP = "leadership"
    """This replica became the stream's leader."""
    OUTCOME = "outcome"
    """A move or creation was carried out (or failed): where the subscription stands now."""
    VECTOR = "vector"
    """A progress vector was accepted: it moves a subscription at the next read."""
    RETRY = "retry"
    """The last read failed."""
    CATCH_UP = "catch_up"
    """A returning region's catch-up: answering one (the progress it asks for is read
    first), or every region answered (the holds end once the moves are done)."""


@dataclass(frozen=True, slots=True)
class ReadPositions:
    """Read the stream's subscriptions and positions (`PositionsListing`, begun after this
    output) and report the listing (`read_done`) or the failure (`read_failed`). One is out
    at a time: the machine asks for none while one is not reported."""

    reason: ReadReason


# ---- events: for metrics, logs and the API -------------------------------------------------


class IgnoreReason(enum.Enum):
    STALE_EPOCH = "stale_epoch"
    LATE_RESPONSE = "late_response"
    DUPLICATE = "duplicate"
    NOT_NAMED = "not_named"
    OLDER_UPDATE = "older_update"
    NOT_REPLICATED = "not_replicated"
    NOT_LOCAL = "not_local"


@dataclass(frozen=True, slots=True)
class SnapshotStarted:
    id: SnapshotId
    started_ms: int


@dataclass(frozen=True, slots=True)
class SnapshotCompleted:
    snapshot: Snapshot
    duration_ms: int


@dataclass(frozen=True, slots=True)
class SnapshotTimedOut:
    id: SnapshotId
    round: int
    missing: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UpdateSent:
    subscription: str
    snapshot_id: SnapshotId | None
    positions: Mapping[str, int]
    progress: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class UpdateApplied:
    """An update for this region was accepted: its snapshot's position here (None when it
    brought no newer snapshot naming this region) and its progress vector (empty if none).
    The move or create follows as an action."""

    subscription: str
    from_region: str
    snapshot_id: SnapshotId | None
    position: int | None
    progress: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class MarkerIgnored:
    reason: IgnoreReason
    region: str
    detail: str


@dataclass(frozen=True, slots=True)
class MarkerRead:
    """A marker read from the read stream (replayed or tailed), decoded and written under its
    writer's subject; what it changes follows as other outputs."""

    read_seq: int
    region: str


@dataclass(frozen=True, slots=True)
class MarkerRejected:
    read_seq: int
    rejected: Rejected


@dataclass(frozen=True, slots=True)
class LeadershipLost:
    """This leader saw a marker of its own region from a newer epoch and stepped down."""

    epoch: int
    newer_epoch: int


@dataclass(frozen=True, slots=True)
class FailbackHeld:
    """This region returned: its replicated durables are held until every other region has
    answered a catch-up request (`waiting`), or for `hold_ms` at most. `adopted`: the hold of
    a leader before this one, still standing, taken over (no new pause)."""

    subscriptions: tuple[str, ...]
    waiting: tuple[str, ...]
    adopted: bool = False


@dataclass(frozen=True, slots=True)
class FailbackReleased:
    """A held durable released after `held_ms`: every other region answered and the moves
    their progress asked for are done, or the hold expired with `missing` not answered."""

    subscription: str
    held_ms: int
    missing: tuple[str, ...]


SubscriptionAction = MoveConsumer | MoveCursor | CreateConsumer | CreateCursor
"""The actions that move or create a subscription: the runtime reports each one's outcome
(`StreamMachine.action_done` / `action_failed`)."""
Action = PublishReplicated | PublishLocal | SubscriptionAction | HoldConsumer | ReleaseConsumer
Event = (
    SnapshotStarted
    | SnapshotCompleted
    | SnapshotTimedOut
    | UpdateSent
    | UpdateApplied
    | MarkerIgnored
    | MarkerRead
    | MarkerRejected
    | LeadershipLost
    | FailbackHeld
    | FailbackReleased
)
Output = Action | ReadPositions | Event
