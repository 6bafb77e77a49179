"""The views the runtime answers the API with: frozen, never protobuf or NATS objects.

The runtime (which owns NATS, leadership and the protocol state) implements the API's
`sidecar.api.backend.SidecarBackend` with these views and signals failures with the
exceptions of `sidecar.runtime.errors`; the API layer imports both from here, downward.

Conventions: sequences are read-stream sequences of this region; times are Unix
milliseconds; `None` means "never happened yet". A subscription's kind is the protocol's
`SubscriptionKind` (the same two values in markers, in the machine and on the API).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.protocol import Ranges, SubscriptionKind


@dataclass(frozen=True)
class AppliedUpdateView:
    """The last update applied here for a subscription, from one other region."""

    from_region: str
    snapshot_id: str
    position: int
    applied_unix_ms: int


@dataclass(frozen=True)
class SubscriptionView:
    """Where a subscription stands in this region, as the API serves it (`SubscriptionState`
    on the wire; built from the machine's `MachineSubscription`)."""

    stream: str
    subscription: str
    kind: SubscriptionKind
    replicated: bool
    mark_delete: int
    """Every read-stream sequence <= mark_delete is consumed."""
    mark_delete_read_unix_ms: int | None
    last_snapshot_id: str | None
    """The snapshot of the last update sent for the subscription."""
    last_snapshot_local: int
    last_update_sent_unix_ms: int | None
    applied: tuple[AppliedUpdateView, ...]
    cached_snapshots: int
    progress: Mapping[str, int]
    """Progress received (DESIGN §7), the merge of every vector received for it: origin region
    -> highest origin sequence consumed somewhere. Empty when none came."""
    failover_exposure: int | None
    """Data messages above `mark_delete` that `progress` covers: what a consumer here would
    receive again if the region it is consumed in were lost now (None: no progress)."""
    progress_sent: Mapping[str, int]
    """The progress vector this region sent last (empty when none)."""
    progress_sent_position: int
    """The mark-delete here that `progress_sent` was read at (0 when none)."""
    receives_markers: bool
    """A replicated durable whose filter lets the stream's markers through (its client
    receives them; docs/topology.md): as of the last positions read. False for a cursor."""
    consumed_in: tuple[str, ...]
    """The regions consuming it now (docs/protocol.md §8): two or more is one too many."""
    acked: Mapping[str, Ranges]
    """Per origin, what other regions' applications acked above their floors that
    `progress` does not cover, as ranges (docs/protocol.md §6): consumed somewhere too."""


@dataclass(frozen=True)
class CursorResetView:
    """What `ResetCursor` did to an external cursor."""

    stream: str
    subscription: str
    previous_sequence: int
    sequence: int


@dataclass(frozen=True)
class SnapshotView:
    id: str
    stream: str
    local_position: int
    positions: Mapping[str, int]
    """Position of the snapshot in each other region's read stream, by region."""
    completed_unix_ms: int
    duration_ms: int


@dataclass(frozen=True)
class SourceLinkView:
    origin_region: str
    active: bool
    last_marker_age_ms: int | None
    lag_messages: int


@dataclass(frozen=True)
class StreamStatusView:
    stream: str
    write_stream: str
    read_stream: str
    last_snapshot_age_ms: int | None
    sources: tuple[SourceLinkView, ...]
    replicated_subscriptions: int
    snapshot_pending: bool
    leader_holder: str | None
    """The replica leading the stream in this region (its shard lease's holder), None when
    unknown or free."""
    leader_epoch: int
    """That leader's epoch (0 when unknown)."""
    leads: bool
    """Whether the replica answering leads this stream."""
    discovered: bool
    """Whether it runs because discovery found it (False: listed in the configuration)."""
    rebuilding: bool = False
    """Whether it is still being rebuilt here (it answers UNAVAILABLE until it runs)."""


@dataclass(frozen=True)
class StatusView:
    region: str
    regions: tuple[str, ...]
    leader: bool
    """Whether this replica leads at least one stream."""
    epoch: int
    """The highest epoch among the streams it leads (0 when it leads none)."""
    holder: str
    """This replica's name in the leases."""
    connected: bool
    streams: tuple[StreamStatusView, ...]
    version: str


@dataclass(frozen=True)
class Readiness:
    """What the sidecar needs before it serves: each flag names one condition."""

    connected: bool
    """Connected to the region's NATS cluster."""
    topology_applied: bool
    """Every configured stream's write/read streams exist as configured."""
    leadership_known: bool
    """The sidecar knows which streams it leads (a round of its shard leases is done)."""
    streams_rebuilt: bool = True
    """Every stream the sidecar started with (the listed ones, and with discovery on those of
    its first round) is rebuilt from its read stream (markers, and origins with progress
    vectors on): before that, queries would answer from nothing. A stream discovered later
    answers UNAVAILABLE until its own rebuild is done, without making the sidecar unready."""
    rebuilt: int = 0
    """Streams rebuilt and running so far: each answers the API from then on, while the others
    still answer UNAVAILABLE (the progress of a start, with `streams`)."""
    streams: int = 0
    """Streams the sidecar runs (listed, and discovered so far)."""

    @property
    def ready(self) -> bool:
        return not self.missing()

    def missing(self) -> list[str]:
        """Names of the unmet conditions, in a stable order (empty when ready)."""
        conditions = {
            "nats_connection": self.connected,
            "topology": self.topology_applied,
            "leadership": self.leadership_known,
            "streams": self.streams_rebuilt,
        }
        return [name for name, met in conditions.items() if not met]
