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
    marker_seen(read_seq, marker)      a decoded marker at `read_seq` of this region's read
                                       stream, in tail order (`markers.decode`, then
                                       `markers.check_writer` against its subject).
    marker_rejected(read_seq, rej)     a message on the marker subjects that `decode` or
                                       `check_writer` rejected.
    read_stream_advanced(last_seq)     the read stream's last sequence (from stream info).
    positions_read({sub: M}, last_seq) effective mark-delete positions of local subscriptions
                                       (a durable's ack floor or an external cursor's stored
                                       value, extended over the messages after it that its
                                       reader never delivers, up to last_seq read *before*
                                       the check; last_seq when nothing is pending).
    subscriptions_changed({sub: SubscriptionInfo(kind, replicated, config)})
                                       the full set of local subscriptions of the stream.
    action_done(action, mark_delete)   a move or creation it asked for was carried out; the
                                       subscription's position as read back after it.
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
                                       in the read stream (at least the completed snapshots);
                                       call `became_leader` on it once the lease is held.

Outputs (frozen dataclasses)
    actions:  PublishReplicated(marker)  -> write stream (`markers.encode`, `marker_msg_id`)
              PublishLocal(marker)       -> own read stream (completed snapshots)
              MoveConsumer(sub, ack_floor) -> consumer reset to seq ack_floor+1 (clamp)
              MoveCursor(sub, ack_floor)   -> stored external cursor
              CreateConsumer / CreateCursor(sub, config, ack_floor) -> create if absent
              (the last four are `SubscriptionAction`s: report each one's outcome)
    events:   SnapshotStarted, SnapshotCompleted(snapshot, duration_ms), SnapshotTimedOut,
              UpdateSent, UpdateApplied, MarkerIgnored(reason), MarkerRejected, LeadershipLost

Queries
    subscription(name) / subscriptions() -> MachineSubscription, gauges(), completed_snapshots(),
    pending() -> PendingView | None, last_completed_ms, is_leader, epoch.

Followers track completed snapshots (from the snapshot markers in the read stream), updates
sent by their leader and updates received, so queries work on every replica, and a follower
that becomes leader carries out updates its predecessor may have missed (forward only).
"""

from sidecar.protocol.cache import SnapshotCache
from sidecar.protocol.machine import (
    Action,
    AppliedUpdate,
    CreateConsumer,
    CreateCursor,
    Event,
    IgnoreReason,
    LeadershipLost,
    MachineConfig,
    MachineSubscription,
    MarkerIgnored,
    MarkerRejected,
    MoveConsumer,
    MoveCursor,
    Output,
    PendingView,
    PublishLocal,
    PublishReplicated,
    SentUpdate,
    SnapshotCompleted,
    SnapshotStarted,
    SnapshotTimedOut,
    StreamMachine,
    SubscriptionAction,
    SubscriptionGauges,
    SubscriptionInfo,
    UpdateApplied,
    UpdateSent,
)
from sidecar.protocol.markers import (
    DEFAULT_MAX_MARKER_BYTES,
    Marker,
    Rejected,
    RejectReason,
    Request,
    Response,
    Snapshot,
    SnapshotId,
    SubscriptionKind,
    Update,
    check_writer,
    decode,
    encode,
    marker_msg_id,
)

__all__ = [
    "DEFAULT_MAX_MARKER_BYTES",
    "Action",
    "AppliedUpdate",
    "CreateConsumer",
    "CreateCursor",
    "Event",
    "IgnoreReason",
    "LeadershipLost",
    "MachineConfig",
    "MachineSubscription",
    "Marker",
    "MarkerIgnored",
    "MarkerRejected",
    "MoveConsumer",
    "MoveCursor",
    "Output",
    "PendingView",
    "PublishLocal",
    "PublishReplicated",
    "RejectReason",
    "Rejected",
    "Request",
    "Response",
    "SentUpdate",
    "Snapshot",
    "SnapshotCache",
    "SnapshotCompleted",
    "SnapshotId",
    "SnapshotStarted",
    "SnapshotTimedOut",
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
]
