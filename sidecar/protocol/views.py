"""What a `StreamMachine` answers when asked (its queries): nothing here changes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.protocol.markers import Ranges, SnapshotId, SubscriptionKind


@dataclass(frozen=True, slots=True)
class SentUpdate:
    """The last update sent: its snapshot part (None before the first snapshot passed) and
    its progress vector with the mark-delete it was read at (empty and 0 without one)."""

    snapshot_id: SnapshotId | None
    local_position: int
    positions: Mapping[str, int]
    sent_ms: int
    progress: Mapping[str, int]
    progress_position: int


@dataclass(frozen=True, slots=True)
class AppliedUpdate:
    from_region: str
    snapshot_id: SnapshotId
    position: int
    applied_ms: int


@dataclass(frozen=True, slots=True)
class MachineSubscription:
    """What the machine knows of one subscription (its query answer; the API's
    `MachineSubscription` is built from it)."""

    name: str
    kind: SubscriptionKind
    replicated: bool
    exists: bool
    mark_delete: int | None
    last_update_sent: SentUpdate | None
    applied: tuple[AppliedUpdate, ...]
    cached: int
    progress: Mapping[str, int]
    """The elementwise maximum of every progress vector received for it (empty if none):
    each message it covers was consumed in some region."""
    exposure: int | None
    """Data messages above `mark_delete` covered by `progress`: what a native consumer here
    would receive again if the region it is consumed in were lost now (None: no vector)."""
    consumed_in: tuple[str, ...] = ()
    """The regions whose consumers passed its data within the activity window (this one
    from its positions reads, the others from their updates): two or more is a subscription
    consumed in two regions at once (docs/protocol.md §8)."""
    acked: Mapping[str, Ranges] = field(default_factory=dict)
    """Per origin, what the other regions' applications acked above their floors (out of
    order) and `progress` does not cover, as ranges: each was consumed in some region too
    (docs/protocol.md §6)."""


@dataclass(frozen=True, slots=True)
class SubscriptionGauges:
    """What one subscription's gauges show (`StreamMachine.gauges`)."""

    name: str
    exposure: int | None
    """As `MachineSubscription.exposure`."""
    replay_gap: int | None
    """Messages between the local position of the last update sent and `mark_delete` (what
    a failover replays by snapshots alone); None unless replicated with an update sent."""
    regions: tuple[str, ...]
    """The regions that update went to (empty when `replay_gap` is None)."""
    consumed_in: int = 0
    """As `len(MachineSubscription.consumed_in)`."""


@dataclass(frozen=True, slots=True)
class PendingView:
    id: SnapshotId
    round: int
    started_ms: int
    waiting_for: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Needs:
    """What the machine needs from the runtime's interval loop until its next input
    (`StreamMachine.needs`, asked after every input)."""

    deadline_ms: int | None
    """The latest time its next `interval` input is wanted (a snapshot to start, an attempt
    to time out, a positions read to ask for); None: none until another input changes it."""
    signals: bool
    """Whether a signal that positions moved (`interval(moved=True)`) would change anything:
    only a leader acts on them."""
