"""The PIP-33 protocol core: a pure, synchronous state machine (no I/O, no clock, no randomness).

One `StreamMachine` per (region, virtual stream). The runtime feeds it events and carries out
the outputs it returns, in order. Every input method returns `list[Output]`.

Inputs
    tick(now_ms)                       timers: starts snapshots, times attempts out. The machine
                                       has no clock: every timestamp it records is the latest
                                       `now_ms` given to `tick` (or `trigger`).
    trigger(now_ms)                    a `tick` that also starts a snapshot now, whatever the
                                       interval and even without new data (outputs include
                                       `SnapshotStarted`); never while one is pending, on a
                                       follower, or without a replicated subscription.
    marker_read(stored, now_ms)        a message on the marker subjects of this region's read
                                       stream, as stored (`StoredMarker`), in tail order: the
                                       machine decodes it and checks its writer against its
                                       subject (`read_stored`), between two ticks at `now_ms`;
                                       `MarkerRead` or `MarkerRejected` says which.
    marker_seen(read_seq, marker)      the same, decoded and checked already (the simulator).
    marker_rejected(read_seq, rej)     a message on the marker subjects that was rejected.
    interval(now_ms, last_seq, moved, sweep)
                                       the runtime's interval: how far its tails saw the read
                                       stream go, whether a signal (an ack, an advisory, a
                                       cursor write) said positions moved, whether it is the
                                       stream's sweep. A tick, and `ReadPositions` when a read
                                       is wanted (at most one out at a time).
    read_done(listing) / read_failed() the outcome of a `ReadPositions`: a `PositionsListing`
                                       (its `generation` taken when the read began: a listing
                                       begun before a creation asked for since keeps its
                                       positions, not its set of subscriptions).
    positions_listed(listing)          a listing the machine did not ask for (an API write).
    read_stream_advanced(last_seq)     the read stream's last sequence (from stream info).
    positions_read({sub: M}, last_seq) effective mark-delete positions of local subscriptions
                                       (a durable's ack floor or an external cursor's stored
                                       value, extended over the messages after it that its
                                       reader never delivers, up to last_seq read *before*
                                       the check; last_seq when nothing is pending).
    subscriptions_changed({sub: SubscriptionInfo(kind, replicated, config)})
                                       the full set of local subscriptions of the stream.
    action_done(action, mark_delete)   a move or creation it asked for was carried out; the
                                       subscription's position as read back after it (and
                                       the read stream's first sequence read after that,
                                       and the lease's epoch then).
    action_failed(action)              one was not (failed, or dropped: not the leader). The
                                       machine reports a position (`subscription().mark_delete`)
                                       only as read or as an action reported done left it, has
                                       one action per subscription in flight at most, and asks
                                       again for a failed one at the next positions read.
    became_leader(epoch) / became_follower()
                                       only a leader publishes markers and moves subscriptions;
                                       `epoch` must be fresh per leadership term (lease revision)
                                       and snapshot ids are (region, epoch, counter).
    StreamMachine.restore(config, markers, subscriptions, positions, read_last_seq, now_ms)
                                       a follower rebuilt after a restart from the markers stored
                                       in the read stream (at least the completed snapshots),
                                       with the `MarkerRead`/`MarkerRejected` events of the
                                       replay; call `became_leader` on it once the lease is held.

Outputs (frozen dataclasses)
    actions:  PublishReplicated(marker)  -> write stream (`markers.encode`, `marker_msg_id`)
              PublishLocal(marker)       -> own read stream (completed snapshots)
              MoveConsumer(sub, ack_floor) -> consumer reset to seq ack_floor+1 (clamp)
              MoveCursor(sub, ack_floor)   -> stored external cursor
              CreateConsumer / CreateCursor(sub, config, ack_floor) -> create if absent
              (the last four are `SubscriptionAction`s: report each one's outcome)
              HoldConsumer(sub, hold_ms) / ReleaseConsumer(sub) -> pause a durable for
              hold_ms at most / resume it (the failback guard, docs/protocol.md §7)
    reads:    ReadPositions(reason)      -> read the subscriptions and positions, report them
                                            (`read_done`) or the failure (`read_failed`);
                                            every replica, not only the leader
    events:   SnapshotStarted, SnapshotCompleted(snapshot, duration_ms), SnapshotTimedOut,
              UpdateSent, UpdateApplied, MarkerIgnored(reason), MarkerRead, MarkerRejected,
              LeadershipLost, FailbackHeld, FailbackReleased

Queries
    subscription(name) / subscriptions() -> MachineSubscription, gauges(), completed_snapshots(),
    pending() -> PendingView | None, last_completed_ms, is_leader, epoch, generation, held,
    needs() -> Needs(deadline_ms, signals): by when the next `interval` is wanted (None: not
    before another input), and whether signals matter; ask after every input. A runtime that
    calls `interval` only by then, and with `moved` only when `signals`, misses nothing.

Followers track completed snapshots (from the snapshot markers in the read stream), updates
sent by their leader and updates received, so queries work on every replica, and a follower
that becomes leader carries out updates its predecessor may have missed (forward only).
"""

from sidecar.protocol.cache import SnapshotCache
from sidecar.protocol.inputs import Acks, MachineConfig, PositionsListing, SubscriptionInfo
from sidecar.protocol.machine import StreamMachine
from sidecar.protocol.markers import (
    DEFAULT_MAX_MARKER_BYTES,
    MAX_ACKED_RANGES,
    Marker,
    Ranges,
    Rejected,
    RejectReason,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    StoredMarker,
    SubscriptionKind,
    Update,
    check_writer,
    decode,
    encode,
    marker_msg_id,
    read_stored,
)
from sidecar.protocol.outputs import (
    Action,
    CreateConsumer,
    CreateCursor,
    Event,
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

__all__ = [
    "DEFAULT_MAX_MARKER_BYTES",
    "MAX_ACKED_RANGES",
    "Acks",
    "Action",
    "AppliedUpdate",
    "CreateConsumer",
    "CreateCursor",
    "Event",
    "FailbackHeld",
    "FailbackReleased",
    "HoldConsumer",
    "IgnoreReason",
    "LeadershipLost",
    "MachineConfig",
    "MachineSubscription",
    "Marker",
    "MarkerIgnored",
    "MarkerRead",
    "MarkerRejected",
    "MoveConsumer",
    "MoveCursor",
    "Needs",
    "Output",
    "PendingView",
    "PositionsListing",
    "PublishLocal",
    "PublishReplicated",
    "Ranges",
    "ReadPositions",
    "ReadReason",
    "RejectReason",
    "Rejected",
    "ReleaseConsumer",
    "Request",
    "Response",
    "SentUpdate",
    "Snapshot",
    "SnapshotCache",
    "SnapshotCompleted",
    "SnapshotId",
    "SnapshotStarted",
    "SnapshotTimedOut",
    "StoredMarker",
    "StreamMachine",
    "SubscriptionAction",
    "SubscriptionGauges",
    "SubscriptionInfo",
    "SubscriptionKind",
    "Update",
    "UpdateApplied",
    "UpdateSent",
    "check_writer",
    "decode",
    "encode",
    "marker_msg_id",
    "read_stored",
]
