"""Conversions between the backend views and the protobuf messages of api.proto.

The server converts views to messages; the CLI converts the messages it receives back to
views, so both ends share one schema. On the wire, a missing time is 0 and a missing age or
count is -1 (as api.proto documents); in views all are `None`. `GetSubscriptionResponse` and
`WatchSubscriptionResponse` have the fields of `SubscriptionState`, so one conversion serves
the three.
"""

from __future__ import annotations

from typing import TypeVar

from sidecar._gen.rsub.v1 import api_pb2, markers_pb2
from sidecar.protocol import SubscriptionKind
from sidecar.runtime.views import (
    AppliedUpdateView,
    SnapshotView,
    SourceLinkView,
    StatusView,
    StreamStatusView,
    SubscriptionView,
)

_NO_TIME = 0
_NO_AGE = -1
_NO_COUNT = -1

_SubscriptionMessage = TypeVar(
    "_SubscriptionMessage",
    api_pb2.SubscriptionState,
    api_pb2.GetSubscriptionResponse,
    api_pb2.WatchSubscriptionResponse,
)


def _to_wire(value: int | None, missing: int) -> int:
    return missing if value is None else value


def _from_wire(value: int, missing: int) -> int | None:
    return None if value == missing else value


def subscription_to_proto(
    view: SubscriptionView, message: type[_SubscriptionMessage]
) -> _SubscriptionMessage:
    """`view` as a `message` (`SubscriptionState` or an RPC's response with its fields)."""
    return message(
        stream=view.stream,
        subscription=view.subscription,
        kind=view.kind.value,
        replicated=view.replicated,
        mark_delete=view.mark_delete,
        mark_delete_read_unix_ms=_to_wire(view.mark_delete_read_unix_ms, _NO_TIME),
        last_snapshot_id=view.last_snapshot_id or "",
        last_snapshot_local=view.last_snapshot_local,
        last_update_sent_unix_ms=_to_wire(view.last_update_sent_unix_ms, _NO_TIME),
        applied=[
            api_pb2.AppliedUpdate(
                from_region=a.from_region,
                snapshot_id=a.snapshot_id,
                position=a.position,
                applied_unix_ms=a.applied_unix_ms,
            )
            for a in view.applied
        ],
        cached_snapshots=view.cached_snapshots,
        progress=dict(view.progress),
        failover_exposure=_to_wire(view.failover_exposure, _NO_COUNT),
        progress_sent=dict(view.progress_sent),
        progress_sent_position=view.progress_sent_position,
        receives_markers=view.receives_markers,
        consumed_in=list(view.consumed_in),
        acked={
            origin: markers_pb2.OriginRanges(bounds=[seq for pair in ranges for seq in pair])
            for origin, ranges in view.acked.items()
        },
    )


def subscription_from_proto(msg: _SubscriptionMessage) -> SubscriptionView:
    return SubscriptionView(
        stream=msg.stream,
        subscription=msg.subscription,
        kind=SubscriptionKind(msg.kind),
        replicated=msg.replicated,
        mark_delete=msg.mark_delete,
        mark_delete_read_unix_ms=_from_wire(msg.mark_delete_read_unix_ms, _NO_TIME),
        last_snapshot_id=msg.last_snapshot_id or None,
        last_snapshot_local=msg.last_snapshot_local,
        last_update_sent_unix_ms=_from_wire(msg.last_update_sent_unix_ms, _NO_TIME),
        applied=tuple(
            AppliedUpdateView(
                from_region=a.from_region,
                snapshot_id=a.snapshot_id,
                position=a.position,
                applied_unix_ms=a.applied_unix_ms,
            )
            for a in msg.applied
        ),
        cached_snapshots=msg.cached_snapshots,
        progress=dict(sorted(msg.progress.items())),
        failover_exposure=_from_wire(msg.failover_exposure, _NO_COUNT),
        progress_sent=dict(sorted(msg.progress_sent.items())),
        progress_sent_position=msg.progress_sent_position,
        receives_markers=msg.receives_markers,
        consumed_in=tuple(msg.consumed_in),
        acked={
            origin: tuple(zip(bounds[::2], bounds[1::2], strict=True))
            for origin in sorted(msg.acked)
            if (bounds := list(msg.acked[origin].bounds))
        },
    )


def snapshot_to_proto(view: SnapshotView) -> api_pb2.SnapshotInfo:
    return api_pb2.SnapshotInfo(
        id=view.id,
        stream=view.stream,
        local_position=view.local_position,
        positions=dict(view.positions),
        completed_unix_ms=view.completed_unix_ms,
        duration_ms=view.duration_ms,
    )


def snapshot_from_proto(msg: api_pb2.SnapshotInfo) -> SnapshotView:
    return SnapshotView(
        id=msg.id,
        stream=msg.stream,
        local_position=msg.local_position,
        positions=dict(sorted(msg.positions.items())),
        completed_unix_ms=msg.completed_unix_ms,
        duration_ms=msg.duration_ms,
    )


def status_to_proto(view: StatusView) -> api_pb2.StatusResponse:
    return api_pb2.StatusResponse(
        region=view.region,
        regions=list(view.regions),
        leader=view.leader,
        epoch=view.epoch,
        holder=view.holder,
        connected=view.connected,
        version=view.version,
        streams=[
            api_pb2.StreamStatus(
                stream=s.stream,
                write_stream=s.write_stream,
                read_stream=s.read_stream,
                last_snapshot_age_ms=_to_wire(s.last_snapshot_age_ms, _NO_AGE),
                replicated_subscriptions=s.replicated_subscriptions,
                snapshot_pending=s.snapshot_pending,
                leader=s.leader_holder or "",
                leader_epoch=s.leader_epoch,
                leads=s.leads,
                discovered=s.discovered,
                rebuilding=s.rebuilding,
                sources=[
                    api_pb2.SourceLink(
                        origin_region=link.origin_region,
                        active=link.active,
                        last_marker_age_ms=_to_wire(link.last_marker_age_ms, _NO_AGE),
                        lag_messages=link.lag_messages,
                    )
                    for link in s.sources
                ],
            )
            for s in view.streams
        ],
    )


def status_from_proto(msg: api_pb2.StatusResponse) -> StatusView:
    return StatusView(
        region=msg.region,
        regions=tuple(msg.regions),
        leader=msg.leader,
        epoch=msg.epoch,
        holder=msg.holder,
        connected=msg.connected,
        version=msg.version,
        streams=tuple(
            StreamStatusView(
                stream=s.stream,
                write_stream=s.write_stream,
                read_stream=s.read_stream,
                last_snapshot_age_ms=_from_wire(s.last_snapshot_age_ms, _NO_AGE),
                replicated_subscriptions=s.replicated_subscriptions,
                snapshot_pending=s.snapshot_pending,
                leader_holder=s.leader or None,
                leader_epoch=s.leader_epoch,
                leads=s.leads,
                discovered=s.discovered,
                rebuilding=s.rebuilding,
                sources=tuple(
                    SourceLinkView(
                        origin_region=link.origin_region,
                        active=link.active,
                        last_marker_age_ms=_from_wire(link.last_marker_age_ms, _NO_AGE),
                        lag_messages=link.lag_messages,
                    )
                    for link in s.sources
                ),
            )
            for s in msg.streams
        ),
    )
